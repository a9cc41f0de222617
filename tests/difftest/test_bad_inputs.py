"""One test per (row of the bad-input catalogue, public function it applies to).

The catalogue (``catalogue.py``, rendered in ``docs/bad_inputs.md``) lists every class of
bad input with the behaviour each public function must show: a clear error whose message
names the argument (matched by a pattern that quotes it), or a correct result. A row whose
current behaviour is a reported bug is a strict xfail pointing at its regression file.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tests.optional import requires

from .catalogue import ROWS, Raises, applicable, call, good

DOCS = Path(__file__).resolve().parents[2] / "docs" / "bad_inputs.md"


def _needs(name: str) -> tuple[str, ...]:
    """Optional packages calling public function ``name`` needs."""
    return ("torch",) if name.startswith("torch.") else ()


def _param(row, name):
    marks = [pytest.mark.xfail(strict=True, reason=f"reported bug: {row.bug}")] if row.bug else []
    return pytest.param(row, name, id=f"{row.id}:{name}", marks=marks)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(("row", "name"), [_param(r, n) for r, n in applicable()])
def test_catalogue_row(row, name):
    requires(*row.needs, *_needs(name))
    base = good()
    if isinstance(row.expect, Raises):
        with pytest.raises(row.expect.error, match=row.expect.pattern):
            call(name, row.spoil(base))
    else:
        args = row.spoil(base)
        row.expect.check(name, args, call(name, args))


def test_every_row_is_in_the_docs_table():
    text = DOCS.read_text()
    listed = set(re.findall(r"^\| `([a-z0-9_-]+)` \|", text, flags=re.M))
    assert listed == {row.id for row in ROWS}


def test_row_ids_are_unique_and_every_row_applies_somewhere():
    ids = [row.id for row in ROWS]
    assert len(ids) == len(set(ids))
    assert all(row.functions for row in ROWS)


@pytest.mark.parametrize("name", sorted({n for _, n in applicable()}))
def test_good_inputs_work_on_every_function(name):
    """The baseline the rows spoil is itself accepted (so each row tests only its spoil)."""
    requires(*_needs(name))
    out = call(name, good())
    items = out if isinstance(out, tuple) else (out,)
    for item in items:
        x = item.detach().numpy() if hasattr(item, "detach") else np.asarray(item)
        assert np.all(np.isfinite(x)), name
