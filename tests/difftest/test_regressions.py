"""Replay every file of ``tests/regressions/``.

* ``*.json``: a case written by ``exactattn difftest --save-failures`` or ``exactattn check``
  (arrays, keywords) with ``expect.target`` (and ``expect.also``): each named registry
  variant that exists here must take the case and be judged ``ok`` (or ``refused``: an
  overflow error where the case's magnitudes reach the type's range) against the reference.
* ``*.py``: a bug report with ``replay()`` asserting the correct behaviour.

A file with an open bug (``OPEN`` in a .py, ``expect.open`` in a .json) is a strict xfail:
it must fail today, and flips to a plain pass the moment the core is fixed (then clear
``OPEN``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from exactattn import targets
from exactattn.cases import Case
from exactattn.testing.case_check import Options, check_case
from tests.optional import requires

FOLDER = Path(__file__).resolve().parents[1] / "regressions"


def _load_py(path: Path):
    spec = importlib.util.spec_from_file_location(f"regression_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _params():
    out = []
    for path in sorted(FOLDER.glob("*.json")) + sorted(FOLDER.glob("*.py")):
        if path.suffix == ".py":
            is_open = bool(getattr(_load_py(path), "OPEN", None))
        else:
            is_open = bool(json.loads(path.read_text())["expect"].get("open"))
        marks = [pytest.mark.xfail(strict=True, reason="open bug: see the file")] if is_open else []
        out.append(pytest.param(path, id=path.name, marks=marks))
    return out


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("path", _params())
def test_replay(path: Path):
    if path.suffix == ".py":
        _load_py(path).replay()
        return
    requires("flint")
    data = json.loads(path.read_text())
    expect = data["expect"]
    names = [expect["target"], *expect.get("also", [])]
    units = [targets.variant(name) for name in names]
    units = [u for u in units if targets.unavailable(u.target) is None]
    if not units:
        pytest.skip(f"none of {names} is available here")
    case = Case.from_json(path.read_text())
    findings = check_case(case, units, Options(sampled=False))
    assert findings, "no variant accepted the case"
    bad = [f for f in findings if f.status not in ("ok", "refused")]
    assert not bad, "; ".join(f"{f.target}: {f.status} {f.detail}" for f in bad)


def test_the_folder_is_not_empty():
    assert list(FOLDER.glob("*.json")) and list(FOLDER.glob("*.py"))
