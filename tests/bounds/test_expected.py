"""The expected error of Y (:mod:`exactattn.error.expected_bounds`): its pieces and its calibration.

The random-order partial-sum formula is checked against its definition (the mean over every
order); the calibration in miniature measures real runs (NumPy fp16, the FA-2 policy and
8-bit emulation) against the float64 certified reference: the median of measured/expected
lies in [0.1, 1] and at most 1% of the entries exceed it, as over the sweep presets
(docs/error_bound.md §6). A claim of directed rounding gets the rigorous bound itself.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from exactattn.cases.exact import fast
from exactattn.error import bounds
from exactattn.error.expected_bounds import _random_order, expected_bounds
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
