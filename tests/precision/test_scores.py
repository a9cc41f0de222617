"""Score modification in the sweep: the terms as defined, and a run that drops them is caught.

The bias and soft-cap of each sweep score are checked against values worked by hand from
their definitions; a point whose tiled run ignores the bias (or the cap) reads far beyond
its bound against the certified reference, while the honest run stays within it.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.optional import requires

requires("flint")  # the certified reference, imported by the sweep's tasks

from exactattn import api
from exactattn.precision.grid import Point, score_terms
from exactattn.precision.presets import SCORES
from exactattn.precision.tasks import reference_task, run_task


def test_alibi_and_softcap_are_their_definitions():
    _, bias, cap = score_terms("alibi", 5, seed=0)
    assert cap is None and bias[3, 1] == -2 / 8 and bias[1, 3] == -2 / 8 and bias[2, 2] == 0
    assert score_terms("softcap", 5, seed=0)[1:] == (None, 5.0)
    assert score_terms("none", 5, seed=0)[1:] == (None, None)


def test_t5_buckets_share_a_value_along_each_diagonal():
    _, bias, _ = score_terms("t5", 12, seed=1)
    for offset in range(-11, 12):
        assert len(set(np.diagonal(bias, offset))) == 1  # a function of j − i only
    assert bias[0, 1] != bias[1, 0]  # bidirectional: j − i = 1 and −1 in different buckets


def test_bias_with_minus_infinity_keeps_the_diagonal():
    _, bias, _ = score_terms("bias-inf", 200, seed=0)
    excluded = np.isneginf(bias)
    assert not excluded.diagonal().any()
    assert 0.05 < excluded.mean() < 0.15


def test_unknown_score_is_refused():
    with pytest.raises(ValueError, match="score must be one of"):
        score_terms("relative", 4, seed=0)


@pytest.mark.parametrize("score", SCORES[1:])
def test_a_run_that_drops_the_modification_is_caught(score, monkeypatch):
    point = Point("np-fp32", 32, 8, 8, "normal", 1.0, "causal", 0, True, score=score)
    reference = reference_task(point.problem, None)
    honest = {row["impl"]: row for row in run_task(point, reference)}
    assert honest["tiled"]["bound_ratio"] <= 1 and honest["tiled"]["grad_bound_ratio"] <= 1

    attention = api.attention

    def ignoring(*args, bias=None, softcap=None, **keywords):
        return attention(*args, **keywords)

    monkeypatch.setattr(api, "attention", ignoring)
    broken = {row["impl"]: row for row in run_task(point, reference)}
    assert broken["tiled"]["bound_ratio"] > 1
