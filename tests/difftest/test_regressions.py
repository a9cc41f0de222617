"""Replay every file of ``tests/regressions/``.

* ``*.json``: a differential-test case written by ``exactattn difftest --save-failures``
  (arrays, keywords) with ``expect.target`` (and ``expect.also``): each named target that
  exists here must be judged ``ok`` (or ``refused``: the API's overflow error where the
  case's magnitudes reach the type's range) against the reference.
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

from exactattn.difftest.cases import Case
from exactattn.difftest.check import check_case
from exactattn.difftest.targets import discover
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
    targets, missing = discover(names)
    targets = [t for t in targets if t.name in names]
    if not targets:
        pytest.skip(f"none of {names} is available here ({missing or 'not discovered'})")
    case = Case.from_json(path.read_text())
    for t in targets:
        t.rate = 1  # a replay always runs
    findings = check_case(case, targets)
    assert findings, "no target accepted the case"
    bad = [f for f in findings if f.status not in ("ok", "refused")]
    assert not bad, "; ".join(f"{f.target}: {f.status} {f.detail}" for f in bad)


def test_the_folder_is_not_empty():
    assert list(FOLDER.glob("*.json")) and list(FOLDER.glob("*.py"))
