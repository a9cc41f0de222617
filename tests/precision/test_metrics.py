"""Metrics and formats on hand-made cases whose errors are known in advance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from exactattn.backends.formats import Format, get_format
from exactattn.error.metrics import deviation, error_metrics

FP16 = get_format("float16")


def test_known_errors_in_float16_ulps():
    exact = np.array([1.0, 2.0, 4.0, 0.5])
    offsets = np.array([2.0**-11, 0.0, -(2.0**-9), 2.0**-13])  # 0.5, 0, 0.5, 0.25 ulp
    got = error_metrics(exact + offsets, exact, FP16)
    assert got["max_abs"] == 2.0**-9
    assert got["max_rel"] == 2.0**-11  # 2^-11/1 beats 2^-9/4 = 2^-11 tie and 2^-13/0.5
    assert got["rmse"] == pytest.approx(math.sqrt((2**-22 + 2**-18 + 2**-26) / 4))
    assert got["max_ulp"] == 0.5
    assert got["mean_ulp"] == pytest.approx((0.5 + 0 + 0.5 + 0.25) / 4)


def test_relative_error_skips_zero_references_and_tail_is_used():
    exact = np.array([0.0, 3.0])
    got = error_metrics(np.array([1e-3, 3.0]), exact, FP16)
    assert got["max_rel"] == 0.0  # the zero entry has no relative error
    assert got["max_abs"] == 1e-3
    tail = error_metrics(np.array([1.0]), np.array([1.0]), FP16, exact_lo=np.array([2.0**-70]))
    assert tail["max_abs"] == 2.0**-70


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_ulp_matches_numpy_spacing(dtype):
    rng = np.random.default_rng(0)
    finfo = np.finfo(dtype)
    x = np.concatenate(
        [
            rng.standard_normal(200) * 10.0 ** rng.integers(-3, 4, 200),
            [finfo.tiny, finfo.tiny / 8, 1.0, 2.0, 0.75],
        ]
    ).astype(dtype)
    fmt = get_format(np.dtype(dtype).name)
    assert np.array_equal(fmt.ulp(x.astype(np.float64)), np.spacing(np.abs(x)).astype(np.float64))


def test_unbounded_format_and_zero():
    p8 = get_format("p8")
    assert p8 == Format("p8", 8, None)
    assert p8.ulp(np.array([1.0]))[0] == 2.0**-7
    assert p8.ulp(np.array([2.0**-500]))[0] == 2.0**-507
    assert np.isnan(p8.ulp(np.array([0.0]))[0])
    assert FP16.ulp(np.array([0.0]))[0] == 2.0**-24  # the subnormal spacing
    assert FP16.u == 2.0**-11 and FP16.mu == 2.0**-25
    with pytest.raises(ValueError, match="unknown number format"):
        get_format("float17")


def test_deviation_and_shape_check():
    dev = deviation(np.array([1.0, 2.0]), np.array([1.0, 2.5]))
    assert dev == {"max_abs": 0.5, "rmse": pytest.approx(math.sqrt(0.125))}
    with pytest.raises(ValueError, match="shape"):
        error_metrics(np.zeros(2), np.zeros(3), FP16)


def test_ulps_without_a_spacing_at_the_scale_is_nan():
    """p11 has no exponent floor: its spacing at 3e-323 is below float64's range (0.0), and
    the count is NaN rather than a division by zero (a difftest replay's float64 dQ)."""
    from exactattn.error.metrics import ulps

    ref = np.array([3.0e-323, -1.5e-323])
    assert math.isnan(ulps(np.array([1e-45, 0.0]), ref, "p11"))
    assert ulps(np.array([2.0**-52]), np.array([1.0]), "float64") == 1.0
