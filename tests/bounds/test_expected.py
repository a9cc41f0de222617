"""The expected error of Y and of dQ, dK, dV (:mod:`exactattn.error.expected_bounds`): its
pieces and its calibration.

The random-order partial-sum formula is checked against its definition (the mean over every
order), the row tiles' sums of dK, dV against theirs (computed here from the terms); the
calibration in miniature measures real runs (NumPy fp16, the FA-2 policy, 8-bit emulation,
torch bf16; forward and the tiled and naive reverses) against the float64 certified
reference: the median of measured/expected lies in [low, 1] and at most 1% of the entries
exceed it, as over the sweep presets (docs/error_bound.md §7). A claim of directed rounding
gets the rigorous bound itself; a row with no estimate makes its dQ and the dK, dV it feeds
infinite.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from exactattn.cases.exact import fast
from exactattn.error import bounds
from exactattn.error import expected_bounds as module
from exactattn.error.expected_bounds import _random_order, _RowSums, expected_bounds
from exactattn.precision.grid import Problem
from exactattn.precision.tasks import expected_columns, unit_of
from tests.optional import requires


@pytest.mark.parametrize("n", [1, 2, 5, 6])
def test_random_order_partial_sums_match_their_definition(n):
    x = np.random.default_rng(n).standard_normal(n) + 0.3
    orders = list(itertools.permutations(x))
    mean = np.mean([np.sum(np.cumsum(order) ** 2) for order in orders])
    assert math.isclose(_random_order(n, np.sum(x * x), np.sum(x)), mean, rel_tol=1e-12)


# large logits are the loosest corner (medians 0.07–0.1 in the sweeps): the scale's and
# log₂e's roundings, charged to every target as in the rigorous bound, multiply |s| ~ 40
@pytest.mark.parametrize(
    "config, dist, mask, low",
    [
        ("np-fp16", "normal", "none", 0.1),
        ("np-fa2-fp16", "fa3-outliers", "causal", 0.1),
        ("emu8-rn", "normal", "window", 0.1),
        ("emu8-rn", "large-logits", "none", 0.05),
        ("np-fp32", "large-logits", "causal", 0.05),
    ],
)
def test_calibration_in_miniature(config, dist, mask, low):
    requires("flint")  # the reference adapter's certified fallback
    problem = Problem(n=128, d=32, dist=dist, scale=1.0, mask=mask, seed=3, grads=False)
    case = problem.case(block=16)
    reference = fast(case, grads=False)
    unit = unit_of(config)
    for impl in ("tiled", "naive"):
        y = unit.run(impl, case, False)["y"]
        error = np.abs((y - reference.hi["y"]) - reference.lo["y"]) + reference.rad["y"]
        found = expected_columns(error, unit.bound(impl, case, False, expected_bounds)["y"])
        assert low <= found["expected_median"] <= 1, (impl, found)
        assert found["expected_exceed"] <= 0.01, (impl, found)
        rigorous = bounds.ratio(error, unit.bound(impl, case, False)["y"])
        assert rigorous <= 1


def test_the_expected_error_grows_like_sqrt_of_the_chain():
    """bf16 statistics over T key blocks: the rigorous bound grows like T, the expected
    error like sqrt(T) (values with a common sign: the merges dominate)."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((32, 8)) * 0.1
    k = rng.standard_normal((4096, 8)) * 0.1
    v = rng.random((4096, 8)) + 1
    growth = {}
    for name, of in (("rigorous", bounds.bounds), ("expected", expected_bounds)):
        arith = bounds.Arith.ieee("bfloat16", "bfloat16", acc="float32")
        small = of(arith.with_block(4096 // 16), q, k, v)["y"].mean()
        large = of(arith.with_block(4096 // 256), q, k, v)["y"].mean()
        growth[name] = large / small
    assert growth["rigorous"] > 8  # T × 16, less the fixed terms
    assert 2.5 < growth["expected"] < 4.5  # sqrt(16) = 4, less the fixed terms


def test_directed_rounding_gets_the_rigorous_bound():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((3, 20, 8))
    arith = bounds.Arith.bits(8, rounding="toward_zero", block=4)
    expected = expected_bounds(arith, q, k, v)["y"]
    assert np.array_equal(expected, bounds.bounds(arith, q, k, v)["y"])
    nearest = expected_bounds(bounds.Arith.bits(8, block=4), q, k, v)["y"]
    assert np.all(nearest < expected)


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, "3"])
def test_confidence_must_be_a_positive_number(bad):
    q = np.ones((4, 2))
    with pytest.raises(ValueError, match="confidence must be a finite number > 0"):
        expected_bounds(bounds.Arith.ieee("float16"), q, q, q, confidence=bad)


# --- the gradients ---------------------------------------------------------------------------
def _inputs(seed, n=24, d=8, heads=2):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((heads, n, d)) for _ in range(4)]


@pytest.mark.parametrize("per_tile", [1, 3, 5, 24])
def test_row_tiles_sums_match_their_definition(per_tile):
    """Fed in uneven chunks of rows, the tiles' Σ Z_t², the tiles reaching each key and the
    sums equal those computed at once from the tiles."""
    rng = np.random.default_rng(per_tile)
    n_q, n_k, a = 24, 7, 3
    x = rng.standard_normal((n_q, n_k))
    ok = rng.random((n_q, n_k)) < 0.7
    x = np.where(ok, x, 0.0)
    values = rng.standard_normal((n_q, a))
    sums = _RowSums((n_k, a), (n_k,), per_tile, n_q)
    for start, stop in [(0, 4), (4, 5), (5, 13), (13, 24)]:
        sums.add(x[start:stop], values[start:stop], ok[start:stop], start)
    z2 = np.zeros((n_k, a))
    tiles = np.zeros(n_k)
    for t in range(0, n_q, per_tile):
        z = sum(np.outer(x[i], values[i]) for i in range(t, min(t + per_tile, n_q)))
        z2 += z * z
        tiles += ok[t : t + per_tile].any(axis=0)
    assert np.allclose(sums.z2, z2) and np.array_equal(sums.tiles, tiles)
    assert np.allclose(sums.total, x.T @ values)
    assert np.allclose(sums.squares, (x * x).T @ (values * values))


@pytest.mark.parametrize("stats, delta", [("ml", "gy"), ("lse", "gy"), ("ml", "rowsum")])
def test_the_gradients_do_not_depend_on_the_chunk_of_rows(monkeypatch, stats, delta):
    q, k, v, g = _inputs(2)
    arith = bounds.Arith.ieee("float16", "float32", block=4)
    keywords = dict(stats=stats, delta=delta, row_block=5, allowed=np.tril(np.ones((24, 24), bool)))
    whole = expected_bounds(arith, q, k, v, g, **keywords)
    monkeypatch.setattr(bounds, "CHUNK", 3 * 2 * 24)  # three rows at a time
    chunked = expected_bounds(arith, q, k, v, g, **keywords)
    for name in ("y", "dq", "dk", "dv"):
        assert np.allclose(whole[name], chunked[name], rtol=1e-12), name
    assert whole["dq"].shape == q.shape and whole["dk"].shape == k.shape


def test_gqa_gradients_are_shaped_like_k_and_v_and_grow_with_the_group():
    rng = np.random.default_rng(4)
    q, g = rng.standard_normal((2, 1, 4, 16, 8))
    k, v = rng.standard_normal((2, 1, 2, 16, 8))
    arith = bounds.Arith.ieee("bfloat16", "float32")
    found = expected_bounds(arith, q, k, v, g, enable_gqa=True)
    assert found["dk"].shape == k.shape and found["dv"].shape == v.shape
    assert found["dq"].shape == q.shape and np.all(np.isfinite(found["dv"]))
    alone = expected_bounds(arith, q[:, ::2], k, v, g[:, ::2], enable_gqa=False)
    assert np.all(found["dv"] > alone["dv"])  # two heads' parts, each rounded, then summed


def test_the_reverse_expected_error_grows_like_sqrt_of_the_row_tiles():
    """dV's sum over n_q rows in bf16 compute: one row per tile (n_q additions in compute)
    against one tile of all rows (in fp32): the rigorous bound grows like n_q, the expected
    error like sqrt(n_q) (values of one sign: the partial sums grow)."""
    rng = np.random.default_rng(0)
    n = 512
    q = rng.standard_normal((n, 8)) * 0.1
    k = rng.standard_normal((n, 8)) * 0.1
    v = rng.standard_normal((n, 8))
    g = rng.random((n, 8)) + 1
    arith = bounds.Arith.ieee("bfloat16", "bfloat16", acc="float32", block=64)
    growth = {}
    for name, of in (("rigorous", bounds.bounds), ("expected", expected_bounds)):
        one = of(arith, q, k, v, g, row_block=n)["dv"].mean()
        each = of(arith, q, k, v, g, row_block=None)["dv"].mean()
        growth[name] = each / one
    assert growth["rigorous"] > 20, growth
    assert 2 < growth["expected"] < 14, growth  # sqrt(n/3) ≈ 13 at most, less the fixed terms


def test_directed_rounding_gets_the_rigorous_gradients():
    q, k, v, g = _inputs(1)
    arith = bounds.Arith.bits(8, rounding="toward_zero", block=4)
    expected = expected_bounds(arith, q, k, v, g, stats="lse", row_block=3)
    rigorous = bounds.bounds(arith, q, k, v, g, stats="lse", row_block=3)
    assert set(expected) == {"y", "dq", "dk", "dv"}
    for name in expected:
        assert np.array_equal(expected[name], rigorous[name]), name
    nearest = expected_bounds(bounds.Arith.bits(8, block=4), q, k, v, g, stats="lse", row_block=3)
    assert all(np.all(nearest[x] < expected[x]) for x in expected)


def test_a_row_without_an_estimate_makes_its_gradients_infinite():
    """Row 5's scores ×300 in 5-bit arithmetic may reorder its keys; under a causal mask it
    feeds keys 0–5: dQ's row 5 and dK, dV's rows 0–5 have no estimate, the rest do."""
    rng = np.random.default_rng(3)
    q, k, v, g = (rng.standard_normal((12, 4)) * 0.3 for _ in range(4))
    q[5] *= 300
    causal = np.tril(np.ones((12, 12), bool))
    found = expected_bounds(bounds.Arith.bits(5, block=4), q, k, v, g, allowed=causal)
    rows = np.isinf(found["dq"]).any(-1)
    assert rows.tolist() == [i == 5 for i in range(12)]
    for name in ("dk", "dv"):
        assert np.isinf(found[name]).all(-1).tolist() == [j <= 5 for j in range(12)], name
        assert np.all(np.isfinite(found[name][6:]))


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(stats="m"), "stats must be one of"),
        (dict(delta="gv"), "delta must be one of"),
        (dict(row_block=0), "row_block must be an int >= 1 or None"),
    ],
)
def test_bad_reverse_arguments_are_named(bad, match):
    q = np.ones((4, 2))
    with pytest.raises(ValueError, match=match):
        expected_bounds(bounds.Arith.ieee("float16"), q, q, q, q, **bad)


# the tiled reverse (δ = G·Y, frozen m, ℓ, every row in one tile) and naive attention's
# (δ as a row sum); large logits are the loosest corner for the gradients (medians
# 0.013–0.03 in the quick preset: with one key carrying a row, γ is tiny against the
# products' roundings, which the rows' floors keep)
@pytest.mark.parametrize(
    "config, dist, mask, low",
    [
        ("np-fp16", "normal", "none", 0.05),
        ("np-fa2-fp16", "fa3-outliers", "causal", 0.05),
        ("emu8-rn", "normal", "window", 0.05),
        ("np-fp32", "large-logits", "causal", 0.002),
        ("torch-bf16", "normal", "causal", 0.05),
    ],
)
def test_gradient_calibration_in_miniature(config, dist, mask, low):
    requires("flint")  # the reference adapter's certified fallback
    if config.startswith("torch"):
        requires("torch")
    problem = Problem(n=128, d=32, dist=dist, scale=1.0, mask=mask, seed=3, grads=True)
    case = problem.case(block=16)
    reference = fast(case, grads=True)  # float64, certified: never the code under test
    unit = unit_of(config)
    for impl in ("tiled", "naive"):
        out = unit.run(impl, case, True)
        expected = unit.bound(impl, case, True, expected_bounds)
        rigorous = unit.bound(impl, case, True)
        for name in ("dq", "dk", "dv"):
            near = (out[name] - reference.hi[name]) - reference.lo[name]
            error = np.abs(near) + reference.rad[name]
            found = expected_columns(error, expected[name])
            assert low <= found["expected_median"] <= 1, (impl, name, found)
            assert found["expected_exceed"] <= 0.01, (impl, name, found)
            assert found["expected_max"] < module.CONFIDENCE, (impl, name, found)
            assert bounds.ratio(error, rigorous[name]) <= 1
