"""difftest draws score modifications and finds the core's bugs in them (issue 12, item 1).

About half of the drawn cases modify the scores (ALiBi, T5 buckets, a dense bias with −∞
entries, a soft-cap). With a bug put into the core's score modification — the soft-cap's
slope dropped from the reverse, or the bias's gradient taken on one tile only — a short
difftest search over NumPy float64 finds it and shrinks it to a case that has that
modification; without a bug the same search passes.
"""

from __future__ import annotations

import pytest

from exactattn.cases import Case
from exactattn.core import scores
from exactattn.difftest.campaign import search
from exactattn.difftest.targets import discover
from tests.optional import requires


def _no_softcap_slope(self, gamma, grads):
    return gamma  # the slope 1 − tanh²(s/cap) is missing


def _bias_gradient_of_the_first_key_block_only(self, gamma, grads):
    if self.cols.start:  # later key blocks add nothing into dbias
        return gamma
    return _HONEST_BIAS_PULLBACK(self, gamma, grads)


_HONEST_BIAS_PULLBACK = scores._BiasTile.pullback


def _search(seed: int = 0):
    units, _ = discover(["np-fp64"])
    return search(units, examples=80, seed=seed, max_n=8)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_honest_core_passes_the_modified_cases():
    requires("flint")
    report = _search()
    assert not report.failures, report.failures[0][0].detail


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(
    ("patch", "method", "expect"),
    [
        ("_SoftcapTile", _no_softcap_slope, "softcap"),
        ("_BiasTile", _bias_gradient_of_the_first_key_block_only, "bias"),
    ],
)
def test_a_bug_in_the_cores_score_modification_is_found(monkeypatch, patch, method, expect):
    requires("flint")
    monkeypatch.setattr(getattr(scores, patch), "pullback", method)
    report = _search()
    assert report.failures, "the search never reached the broken modification"
    finding, text = report.failures[0]
    case = Case.from_json(text)
    assert case.softcap if expect == "softcap" else case.bias is not None, finding.detail
    assert finding.detail.startswith(("dq", "dk", "dbias")), finding.detail
