"""The sweep's split-KV and sink knobs, within the bound.

``splits`` cuts the keys, each part runs the configuration on its keys alone and
``merge`` says where the merge runs (float32, or the input format with the lse rounded to
it). ``sink`` adds a sink ``σ = δ + min lse``, judged against the certified sink-free
reference carried to ``Y_σ = Y/(1 + e^{σ−lse})``. The measured error over the bound
(``bound_ratio``) stays ≤ 1, and a merge that drops a part, or a run that forgets the
sink, is far over it: the bounds are not vacuous.
"""

from __future__ import annotations

import numpy as np
import pytest

from exactattn.precision import tasks
from exactattn.precision.grid import Point, expand, key_of
from tests.optional import requires

requires("flint")


def _point(
    splits: int, merge: str, mask: str = "causal", config: str = "np-fa2-fp16", sink="none"
) -> Point:
    return Point(config, 96, 16, 16, "normal", 1.0, mask, 0, False, "none", splits, merge, sink)


@pytest.mark.parametrize(("splits", "merge"), [(1, "fp32"), (3, "fp32"), (6, "input")])
def test_split_runs_stay_within_the_bound(splits, merge):
    point = _point(splits, merge)
    reference = tasks.reference_task(point.problem, None)
    tiled, naive = tasks.run_task(point, reference)
    assert tiled["status"] == naive["status"] == "ok"
    assert 0 < tiled["bound_ratio"] <= 1
    assert np.isnan(tiled["grad_bound_ratio"])  # split-KV is forward only
    if splits == 3:
        assert point.case().splits == [0, 32, 64, 96]


def test_a_merge_that_drops_a_part_is_over_the_bound(monkeypatch):
    point = _point(4, "fp32", mask="none")
    reference = tasks.reference_task(point.problem, None)
    merge = tasks.merge_partials
    monkeypatch.setattr(tasks, "merge_partials", lambda parts, **kw: merge(parts[1:], **kw))
    tiled, _ = tasks.run_task(point, reference)
    assert tiled["bound_ratio"] > 10


def test_split_knobs_key_and_expand():
    preset = {"grids": [{"config": ["np-fa2-fp16"], "n": [64], "splits": [1, 4],
                         "merge": ["fp32", "input"]}]}  # fmt: skip
    points = expand(preset)
    assert {(p.splits, p.merge) for p in points} == {(1, "fp32"), (1, "input"), (4, "fp32"),
                                                      (4, "input")}  # fmt: skip
    older = {**points[0].__dict__}  # a row of a CSV from before the knobs
    del older["splits"], older["merge"], older["sink"]
    assert key_of(older) == key_of({**older, "splits": 1, "merge": "fp32", "sink": "none"})
    assert key_of({**older, "sink": 0.0}) == key_of({**older, "sink": "0"}) != key_of(older)
    with pytest.raises(ValueError, match="unquantised"):
        tasks.unit_of("torch-fp8-e4m3", 2)
    with pytest.raises(ValueError, match="merge must be one of"):
        tasks.unit_of("np-fa2-fp16", 2, "fp16")


@pytest.mark.parametrize(("config", "sink"), [("np-fa2-fp16", "2"), ("np-fp32", "-2")])
def test_sink_runs_stay_within_the_bound(config, sink):
    point = _point(1, "fp32", config=config, sink=sink)
    reference = tasks.reference_task(point.problem, None)
    tiled, naive = tasks.run_task(point, reference)
    assert tiled["status"] == naive["status"] == "ok"
    assert 0 < tiled["bound_ratio"] <= 1 and 0 < naive["bound_ratio"] <= 1


def test_a_run_that_forgets_the_sink_is_over_the_bound(monkeypatch):
    point = _point(1, "fp32", sink="2")
    reference = tasks.reference_task(point.problem, None)
    run = tasks._Configured.run
    monkeypatch.setattr(
        tasks._Configured, "run", lambda self, i, c, g, sinks=None: run(self, i, c, g)
    )
    tiled, _ = tasks.run_task(point, reference)
    assert tiled["bound_ratio"] > 10
