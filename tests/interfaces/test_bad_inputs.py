"""Every bad input of the interfaces gives its documented error (or its documented result)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.optional import requires

from .bad_inputs import ROWS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "bad_inputs.md"


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_row(row):
    if row.id.startswith(("flash_attn.", "sdpa.")):
        requires("torch")
    if row.error is not None:
        with pytest.raises(row.error, match=row.pattern):
            row.run()
    else:
        assert row.check(row.run())


def test_every_row_is_in_the_docs_and_nothing_else():
    section = DOCS.read_text().split("## Interfaces:", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([a-z_-]+\.[a-z0-9-]+)` \|", section, flags=re.M)
    assert listed == [row.id for row in ROWS]
