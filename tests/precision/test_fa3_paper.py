"""The FA-3 §4.3 command (:mod:`exactattn.precision.fa3_paper`): its inputs and one small run."""

from __future__ import annotations

import numpy as np
import pytest

from exactattn.precision import fa3_paper
from tests.optional import requires


def test_the_three_readings_of_the_outlier_distribution():
    n = 4096
    per_entry = fa3_paper.inputs("fa3-outliers", n, 0).q
    sd100 = fa3_paper.inputs("fa3-outliers-sd100", n, 0).q
    tokens = fa3_paper.inputs("fa3-outliers-tokens", n, 0).q
    assert per_entry.shape == sd100.shape == tokens.shape == (n, fa3_paper.D)
    # N(0, 1) bulk; outliers of sd 10 vs 100: the largest entries tell them apart
    assert 20 < np.abs(per_entry).max() < 60 and np.abs(sd100).max() > 150
    # token outliers: whole rows of sd ~10, every other row N(0, 1)
    row_sd = tokens.std(axis=1)
    wide = row_sd > 4
    assert 0 < wide.sum() < 20 and np.all(row_sd[~wide] < 1.5)
    with pytest.raises(ValueError, match="dist must be one of"):
        fa3_paper.inputs("normal", n, 0)


def test_a_small_run_against_the_float64_reference():
    requires("torch")
    rows = fa3_paper.measure([256], [0], ["fa3-outliers"], runs=["np-fa2-fp16", "np-fp16"])
    assert [r["run"] for r in rows] == ["np-fp16 naive (all fp16)", "np-fa2-fp16 tiled b=128"]
    naive, tiled = (r["rmse"] for r in rows)
    assert 0 < tiled < naive < 1e-3  # the FA-2 policy's fp32 statistics are more accurate
    assert rows[0]["ref_radius"] < 1e-3 * tiled  # the float64 reference resolves both
    head, _, *body = fa3_paper.table(rows)
    assert head.startswith("| inputs | run | n=256 |") and len(body) == 2
