"""The low-bit formats of :mod:`exactattn.backends.quantize` against reference implementations
(``ml_dtypes``, torch's float8 dtypes) and against their definitions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from exactattn.backends import quantize as qz
from tests.optional import requires


def _grid(fmt: qz.MiniFloat) -> np.ndarray:
    """Every non-negative number of the format, from its definition: the subnormals
    ``N·2^{e_min−p+1}`` (N < 2^{p−1}) and ``(2^{p−1} + N)·2^{e−p+1}`` for e_min ≤ e ≤ e_max."""
    step = 2.0 ** (fmt.e_min - fmt.p + 1)
    values = [n * step for n in range(2 ** (fmt.p - 1))]
    for e in range(fmt.e_min, fmt.e_max + 1):
        values += [(2 ** (fmt.p - 1) + n) * 2.0 ** (e - fmt.p + 1) for n in range(2 ** (fmt.p - 1))]
    return np.array([v for v in values if v <= fmt.largest])


def _probes(fmt: qz.MiniFloat) -> np.ndarray:
    """Every number, every midpoint and a float64 step either side of each, both signs,
    plus every fp16 number (exhaustive over a 16-bit input format)."""
    g = _grid(fmt)
    mids = (g[1:] + g[:-1]) / 2
    pts = np.concatenate([g, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf)])
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float64)
    halves = halves[np.isfinite(halves) & (np.abs(halves) <= fmt.largest)]
    return np.concatenate([pts, -pts, halves])


def _spec(x: np.ndarray, fmt: qz.MiniFloat) -> np.ndarray:
    """Round to nearest, ties to the even significand, by search over the format's grid."""
    g = _grid(fmt)
    a = np.minimum(np.abs(x), fmt.largest)
    idx = np.clip(np.searchsorted(g, a), 1, len(g) - 1)
    lo, hi = g[idx - 1], g[idx]
    even = (idx - 1) % 2 == 0  # consecutive grid numbers alternate even/odd significands
    pick = np.where(a - lo < hi - a, lo, np.where(a - lo > hi - a, hi, np.where(even, lo, hi)))
    return np.copysign(np.where(a >= g[-1], g[-1], pick), x)


@pytest.mark.parametrize("name", sorted(qz.MINIFLOATS))
def test_minifloat_rounding_is_the_definition(name):
    fmt = qz.MINIFLOATS[name]
    x = _probes(fmt)
    np.testing.assert_array_equal(qz.round_minifloat(x, fmt), _spec(x, fmt))


@pytest.mark.parametrize(
    "name, dtype", [("e4m3", "float8_e4m3fn"), ("e5m2", "float8_e5m2"), ("e2m1", "float4_e2m1fn")]
)
def test_minifloat_rounding_matches_ml_dtypes(name, dtype):
    ml_dtypes = requires("ml_dtypes")
    fmt = qz.MINIFLOATS[name]
    x = _probes(fmt)
    theirs = x.astype(getattr(ml_dtypes, dtype)).astype(np.float64)
    np.testing.assert_array_equal(qz.round_minifloat(x, fmt), theirs)


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_minifloat_rounding_matches_torch(name):
    torch = requires("torch")
    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[name]
    # torch converts float64 through float32 (rounding twice): probe with float32 numbers,
    # a float32 step either side of each midpoint included
    x32 = _probes(qz.MINIFLOATS[name]).astype(np.float32)
    x32 = np.concatenate(
        [x32, np.nextafter(x32, np.float32(0)), np.nextafter(x32, np.float32(np.inf))]
    )
    x32 = x32[np.abs(x32) <= qz.MINIFLOATS[name].largest]
    theirs = torch.from_numpy(x32).to(dtype).to(torch.float64).numpy()
    np.testing.assert_array_equal(qz.round_minifloat(x32.astype(np.float64), name), theirs)


def test_saturation_not_infinity():
    big = np.array([449.0, 464.0, 480.0, 1e6, np.inf, -np.inf, -1e6])
    np.testing.assert_array_equal(
        qz.round_minifloat(big, "e4m3"), [448, 448, 448, 448, 448, -448, -448]
    )
    np.testing.assert_array_equal(qz.round_minifloat([7.0, 100.0, -9.0], "e2m1"), [6, 6, -6])
    assert np.isnan(qz.round_minifloat([np.nan], "e4m3")[0])


def test_e8m0_is_the_power_of_two_below():
    ml_dtypes = requires("ml_dtypes")
    x = np.exp2(np.arange(-127, 128, dtype=np.float64))
    np.testing.assert_array_equal(qz.e8m0(x), x.astype(ml_dtypes.float8_e8m0fnu).astype(float))
    np.testing.assert_array_equal(
        qz.e8m0([3.0, 0.75, 1e-300, 1e300]), [2, 0.5, 2.0**-127, 2.0**127]
    )


def test_integers_symmetric_ties_to_even():
    np.testing.assert_array_equal(
        qz.round_integer([0.5, 1.5, 2.5, -0.5, 126.6, 200, -200], "int8"),
        [0, 2, 2, 0, 127, 127, -127],
    )
    np.testing.assert_array_equal(qz.round_integer([6.5, 7.5, -9], "int4"), [6, 7, -7])


GRANS = [
    ("tensor", None),
    ("head", None),
    ("block", 4),
    ("token", None),
    ("channel", None),
    ("group", 8),
]


def _groups(shape, granularity, block):
    """The group index of every element, from the definition (loops, no reshapes)."""
    out = np.zeros(shape, dtype=object)
    for idx in itertools.product(*map(range, shape)):
        *lead, i, j = idx
        key = {
            "tensor": (),
            "head": tuple(lead),
            "token": (*lead, i),
            "channel": (*lead, j),
            "block": (*lead, i // (block or 1)),
            "group": (*lead, i, j // (block or 1)),
        }
        out[idx] = str(key[granularity])
    return out


@pytest.mark.parametrize("granularity, block", GRANS)
@pytest.mark.parametrize("number", ["e4m3", "e2m1", "int8", "int4"])
def test_scaled_quantisation(granularity, block, number):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 10, 16)) * np.exp(rng.normal(0, 2, (2, 3, 10, 16)))
    x[0, 0, :4] = 0.0  # a block (and a head's rows) whose amax is 0: scale 1, stays 0
    got = qz.quantize(x, number, granularity, block)
    groups = _groups(x.shape, granularity, block)
    top = qz.largest(number)
    for key in set(groups.ravel()):
        where = groups == key
        amax = np.abs(x[where]).max()
        s = amax / top if amax > 0 else 1.0
        exact = x[where] / s
        ref = (
            qz.round_integer(exact, number)
            if number in qz.INTEGERS
            else _spec(exact, qz.MINIFLOATS[number])
        )
        np.testing.assert_allclose(got.values[where], s * ref, rtol=2**-52, atol=0)
        assert np.all(
            np.abs(got.values[where] - x[where]) <= got.rel * np.abs(x[where]) + got.abs_error
        )
    assert np.all(got.values[0, 0, :4] == 0)


def test_nvfp4_and_mxfp4():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 64)) * np.exp(rng.normal(0, 3, (8, 64)))
    x[0, :32] = 0
    for got in (qz.nvfp4(x), qz.mxfp4(x)):
        err = np.abs(got.values - x)
        assert np.all(err <= got.rel * np.abs(x) + got.abs_error)
        assert np.all(got.values[0, :32] == 0)
        e2m1 = np.divide(got.values, got.scale, out=np.zeros_like(x), where=got.scale > 0)
        np.testing.assert_array_equal(qz.round_minifloat(e2m1, "e2m1"), e2m1)  # e2m1 values
    mx = qz.mxfp4(x)
    assert np.all(np.log2(mx.scale) == np.round(np.log2(mx.scale)))  # powers of two
    nv = qz.nvfp4(x)
    s_t = np.float32(np.abs(x).max() / (6 * 448))
    blocks = nv.scale / s_t
    np.testing.assert_array_equal(qz.round_minifloat(blocks, "e4m3"), blocks)  # e4m3 scales


def test_accumulator_knob():
    rng = np.random.default_rng(3)
    a = qz.round_minifloat(rng.random((5, 256)), "e4m3")
    b = qz.round_minifloat(rng.standard_normal((256, 7)), "e4m3")
    exact = a @ b
    errs = {acc: np.abs(qz.accumulate(a, b, acc) - exact).max() for acc in ("fp32", "fp22", "fp16")}
    assert errs["fp32"] < errs["fp22"] < errs["fp16"]
    two_level = np.abs(qz.accumulate(a, b, "fp22", chunk=32) - exact).max()
    assert two_level < errs["fp22"]
    # from the definition: a sequential fp22 (p = 14, truncated) sum of one row
    acc = 0.0
    for r in range(256):
        t = acc + a[0, r] * b[r, 0]
        m, e = np.frexp(t)
        acc = np.trunc(m * 2.0**14) * 2.0 ** (e - 14)
    assert qz.accumulate(a, b, "fp22")[0, 0] == acc


def test_hadamard_orthogonal_and_bad_inputs():
    h = qz.hadamard(64)
    np.testing.assert_allclose(h @ h.T, np.eye(64), atol=1e-15)
    with pytest.raises(ValueError, match="power of two"):
        qz.hadamard(48)
    with pytest.raises(ValueError, match="granularity"):
        qz.quantize(np.ones((2, 2)), "e4m3", "rows")
    with pytest.raises(ValueError, match="number"):
        qz.quantize(np.ones((2, 2)), "fp6")
    with pytest.raises(
        ValueError, match=r"does not divide the last dim 24.*\[1, 2, 3, 4, 6, 8, 12, 24\]"
    ):
        qz.quantize(np.ones((2, 24)), "e2m1", "group", 16)
    with pytest.raises(ValueError, match="block"):
        qz.quantize(np.ones((2, 24)), "e2m1", "block", 0)
