"""The differential test itself: a short run is clean, failures shrink and replay.

The default run draws a few dozen cases over every available exactattn unit (seconds); the
slow mark holds CI's short profile (300 cases, the ``exactattn difftest`` default).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from exactattn import targets
from exactattn.cases import Case, Draw, build_case
from exactattn.commands import difftest as cli
from exactattn.difftest.campaign import check_case, run, save_failures, search
from tests.optional import requires


@pytest.fixture
def certified_reference():
    """The difftest judges against the certified reference, which needs python-flint."""
    requires("flint")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.usefixtures("certified_reference")
def test_a_short_run_over_every_backend_is_clean():
    report, names, _ = run(24, seed=3, workers=1)
    assert report.examples >= 24
    assert not report.failures, [f.detail for f, _ in report.failures]
    assert {"np-fp64", "mp24", "np-fa2-fp16"} <= set(names)


def test_case_files_round_trip():
    mask = {
        "kind": "and",
        "parts": [{"kind": "padding"}, {"kind": "causal", "align": "bottom-right"}],
    }
    case = build_case(Draw((2, 4), 3, 5, 2, 3, 2, mask=mask, dropout_p=0.5, seed=9, group=2))
    back = Case.from_json(case.to_json())
    for name in "qkvg":
        assert np.array_equal(getattr(back, name), getattr(case, name))
    assert back.keywords() == case.keywords() and back.mask == case.mask
    assert back.group == 2 and np.array_equal(back.allowed(), case.allowed())


@dataclasses.dataclass(frozen=True)
class _Broken(targets.Variant):
    """float64 NumPy whose y is off by 1e-9 relative: far beyond its bound, far below 1e-6."""

    @property
    def name(self) -> str:
        return "broken"

    def run(self, case, held, grads):
        out = super().run(case, held, grads)
        out["y"] = out["y"] * (1 + 1e-9)
        return out


def _broken() -> _Broken:
    return _Broken(targets.get("np-fp64"), "float64")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.usefixtures("certified_reference")
def test_a_wrong_backend_is_found_shrunk_and_saved(tmp_path):
    report = search([_broken()], examples=40, seed=0)
    assert len(report.failures) == 1
    finding, text = report.failures[0]
    assert finding.target == "broken" and "y[" in finding.detail
    case = Case.from_json(text)
    assert case.sizes["n_q"] == 1 and case.sizes["n_k"] == 1  # shrunk to the smallest case
    (path,) = save_failures(report, tmp_path)
    data = json.loads(path.read_text())
    assert data["expect"]["target"] == "broken"
    assert [f.status for f in check_case(Case.from_json(path.read_text()), [_broken()])] == ["fail"]


def test_cli_lists_the_targets(capsys):
    assert cli.main(["--list", "--backends", "numpy"]) == 0
    out = capsys.readouterr().out
    assert "np-fa2-fp16" in out and "np-naive-fp32" in out and "mp11" not in out


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.usefixtures("certified_reference")
def test_ci_profile_300_examples_is_clean():
    assert cli.main(["--examples", "300", "--seed", "0"]) == 0


@pytest.mark.usefixtures("certified_reference")
def test_the_reference_is_the_definition_with_dropout_and_a_mask():
    """The reference takes the case's allowed set and ρ = r/(1 − p) from the keep-bits:
    every value of the mathematical definition (300-bit witness) lies in its interval."""
    import mpmath

    from exactattn.cases import exact
    from tests.precision.test_certified import witness

    case = build_case(Draw((2,), 4, 5, 3, 2, 2, mask={"kind": "padding"}, dropout_p=0.25, seed=7))
    values = exact.certified(case)
    keep = exact.keep_bits(case)
    assert keep is not None and 0 < keep.mean() < 1
    point = witness(case.q, case.k, case.v, case.g, allowed=case.allowed(), keep=keep, p=0.25)
    with mpmath.workprec(400):
        for name in ("y", "dq", "dk", "dv"):
            inside = np.frompyfunc(lambda a, b, r: abs(a - b) <= r, 3, 1)
            assert all(inside(values.mid[name], point[name], values.rad[name]).flat), name
