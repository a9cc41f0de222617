"""The lowbit claims table gives each figure's range over the seeds, and the bound's
run-by-run move between two sweeps is matched on the grid point."""

from __future__ import annotations

import pytest

from exactattn.precision.bound_moves import moves
from exactattn.precision.lowbit_report import with_spread
from tests.optional import requires


def test_each_varying_figure_gets_its_range_and_knobs_stay_bare():
    pooled = "n = 1024, A=6: 0.174 vs 0.2; gain 1.6×"
    seeds = ["n = 1024, A=6: 0.171 vs 0.2; gain 1.5×", "n = 1024, A=6: 0.178 vs 0.2; gain 1.7×"]
    assert with_spread(pooled, seeds) == (
        "n = 1024, A=6: 0.174 [0.171–0.178] vs 0.2; gain 1.6 [1.5–1.7]×"
    )


def test_texts_of_another_shape_are_left_alone():
    assert with_spread("a 1 b 2", ["a 1 b 2 c 3", "a 1"]) == "a 1 b 2"
    assert with_spread("a 1", ["a 2"]) == "a 1"  # one seed: no range


def test_moves_match_runs_on_the_grid_point():
    pd = requires("pandas")
    base = dict(impl="tiled", n=64, d=8, block=8, dist="normal", scale=1.0, mask="none")
    before = pd.DataFrame(
        [
            {**base, "config": "x", "seed": 0, "status": "ok", "bound_ratio": 1e-6},
            {**base, "config": "x", "seed": 1, "status": "ok", "bound_ratio": 1e-3},
        ]
    )
    after = before.assign(bound_ratio=[1e-3, 1e-2]).iloc[::-1]  # another order
    (row,) = moves(before, after)
    assert row[0] == "x" and row[1] == 2
    assert row[6] == pytest.approx(10) and row[8] == pytest.approx(1000)
    assert row[9] == "2/2" and row[10] == pytest.approx(1e-2)
