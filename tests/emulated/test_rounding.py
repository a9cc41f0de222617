"""The rounding function alone: bit-identical to mpmath, to the definition and to IEEE casts.

Every width 2..52 in both modes, on random words, ties at ``p`` bits and their float64
neighbours, ties whose rounding carries into the exponent, float64 subnormals, the
format's own subnormals and overflow. The checkers are shown to fail on two broken
roundings (ties away from zero; a significand one bit too wide).
"""

from __future__ import annotations

import numpy as np
import pytest

from exactattn.backends import emulated_backend as eb
from exactattn.backends.emulated_backend import EmulatedFormat, round_to_format
from tests.optional import requires

from .spec import edge_values, mpmath_round, same_bits, spec_round

WIDTHS = range(2, 53)
MODES = ("nearest", "toward_zero")
BOUNDED = [  # (p, exponent): fp16, bf16, fp32, e4m3-like, a float64-range format, a tiny one
    (11, 5),
    (8, 8),
    (24, 8),
    (4, (-6, 8)),
    (30, 11),
    (3, (-2, 2)),
]


def mpmath_mismatches(fmt_of_width, mode: str, seed: int = 0) -> list[tuple[int, float]]:
    """(width, value) pairs where ``round_to_format`` differs from mpmath's rounding."""
    rng = np.random.default_rng(seed)
    bad = []
    for p in WIDTHS:
        x = edge_values(rng, p)
        got = round_to_format(x, fmt_of_width(p, mode))
        expected = np.array([mpmath_round(v, p, mode) for v in x])
        bad += [(p, float(v)) for v in x[~same_bits(got, expected)]]
    return bad


def definition_mismatches(p: int, exponent, mode: str, seed: int = 0) -> list[float]:
    fmt = EmulatedFormat.of(p, exponent, mode)
    x = edge_values(np.random.default_rng(seed), p, fmt.emin, fmt.emax)
    got = round_to_format(x, fmt)
    expected = np.array([spec_round(v, p, fmt.emin, fmt.emax, mode) for v in x])
    return [float(v) for v in x[~same_bits(got, expected)]]


@pytest.mark.parametrize("mode", MODES)
def test_every_width_is_bit_identical_to_mpmath(mode):
    assert mpmath_mismatches(lambda p, m: EmulatedFormat.of(p, None, m), mode) == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("p", [2, 3, 11, 24, 52])
def test_unbounded_matches_the_definition(p, mode):
    assert definition_mismatches(p, None, mode) == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("p,exponent", BOUNDED)
def test_bounded_exponent_matches_the_definition(p, exponent, mode):
    """Gradual underflow below 2^emin; overflow to ±inf (nearest) or ±max (toward zero)."""
    assert definition_mismatches(p, exponent, mode) == []


@pytest.mark.parametrize("p,dtype", [(11, np.float16), (24, np.float32)])
def test_fp16_and_fp32_equal_numpy_casts(p, dtype):
    fmt = EmulatedFormat.of(p, 5 if dtype is np.float16 else 8)
    x = edge_values(np.random.default_rng(1), p, fmt.emin, fmt.emax)
    with np.errstate(over="ignore"):
        cast = x.astype(dtype).astype(np.float64)
    assert same_bits(round_to_format(x, fmt), cast).all()


def test_special_values_pass_and_zero_keeps_its_sign():
    fmt = EmulatedFormat.of(5, 5)
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, -1e-30])
    got = round_to_format(x, fmt)
    assert same_bits(got[:5], x[:5]).all()
    assert got[5] == 0 and np.signbit(got[5])


def test_torch_tensors_round_bit_for_bit_like_numpy_arrays():
    torch = requires("torch")
    rng = np.random.default_rng(2)
    for p, exponent in [(2, None), (11, 5), (8, 8), (24, None), (52, 11)]:
        for mode in MODES:
            fmt = EmulatedFormat.of(p, exponent, mode)
            x = np.concatenate([edge_values(rng, p, fmt.emin, fmt.emax), [np.inf, np.nan]])
            expected = round_to_format(x, fmt)
            got = round_to_format(torch.from_numpy(x), fmt)
            assert isinstance(got, torch.Tensor) and same_bits(got.numpy(), expected).all()


def test_rounding_never_loops_over_elements():
    """A million values round in one vectorised pass over the whole array, plus one over
    the few irregular ones (here fp16's subnormals and a float64 subnormal)."""
    x = np.random.default_rng(3).standard_normal(1_000_000)
    calls = []
    original = eb.round_significand

    def counting(s, k, rounding):
        calls.append(np.shape(s))
        return original(s, k, rounding)

    eb.round_significand = counting
    try:
        round_to_format(x, EmulatedFormat.of(11))
        round_to_format(np.concatenate([x, [5e-324]]), EmulatedFormat.of(11, 5))
    finally:
        eb.round_significand = original
    tiny = int(np.sum(np.abs(x) < 2.0**-14)) + 1
    assert calls == [(1_000_000,), (1_000_001,), (tiny,)]


# --- the checkers fail on broken roundings ---------------------------------------------
def ties_away_from_zero(s, k, rounding):
    unit = 1 << k
    if rounding == "toward_zero":
        return s & ~(unit - 1)
    return (s + (unit >> 1)) & ~(unit - 1)


def test_checkers_reject_ties_away_from_zero(monkeypatch):
    monkeypatch.setattr(eb, "round_significand", ties_away_from_zero)
    assert mpmath_mismatches(lambda p, m: EmulatedFormat.of(p, None, m), "nearest")
    assert definition_mismatches(11, 5, "nearest")


@pytest.mark.parametrize("mode", MODES)
def test_checkers_reject_a_significand_one_bit_too_wide(mode):
    wide = mpmath_mismatches(lambda p, m: EmulatedFormat.of(p + 1, None, m), mode)
    assert {p for p, _ in wide} == set(WIDTHS)  # every width is caught


# --- arguments ----------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [1, 54, True, 11.0, "11"])
def test_mantissa_bits_must_be_an_integer_in_2_to_53(bits):
    with pytest.raises(ValueError, match=r"mantissa_bits must be an integer in 2\.\.53"):
        EmulatedFormat.of(bits)


@pytest.mark.parametrize("exponent", [1, 12, (0, -1), (-1023, 5), (1, 1024), "fp16", (1.0, 2)])
def test_exponent_must_be_a_width_or_a_range(exponent):
    with pytest.raises(ValueError, match="exponent"):
        EmulatedFormat.of(11, exponent)


def test_rounding_mode_is_checked_and_quoted():
    with pytest.raises(ValueError, match="'up'"):
        EmulatedFormat.of(11, None, "up")


def test_only_float64_is_rounded_and_only_to_a_format():
    with pytest.raises(TypeError, match="float32"):
        round_to_format(np.ones(3, dtype=np.float32), EmulatedFormat.of(11))
    with pytest.raises(TypeError, match=r"fmt must be an EmulatedFormat.*got 11"):
        round_to_format(np.ones(3), 11)
