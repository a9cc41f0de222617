"""The emulator against mpmath at the same width: elementwise, then the whole algorithm.

Bit-identical where double rounding through float64 is harmless: ``+ − × ÷`` at
``p ≤ 25`` (``53 ≥ 2p + 2``), so the tiled forward and backward, whose other steps
(max, where, −∞) round nothing, equal mpmath's run at ``prec = p`` once ``exp``/``log``
are correctly rounded on both sides. ``exp``/``log`` are libm's float64 results rounded
to ``p`` bits: they differ from the correctly rounded value only where a midpoint of
the format lies between libm's result and the true value, then by one ulp of the
format; measured, never at ``p ≤ 32`` and at a rate near ``2^{p−54}`` above. mpmath's own
``exp`` at ``prec = p`` misrounds about 1 in 10^4 near-midpoint arguments (every width
8..52), so the reference here (:class:`~tests.emulated.spec.ReferenceMpmath`) evaluates
them 64 bits wider and rounds once.
"""

from __future__ import annotations

import operator

import mpmath
import numpy as np
import pytest

import exactattn as ea
from exactattn.backends import emulated_backend as eb
from exactattn.backends.emulated_backend import EmulatedContext

from .spec import ReferenceMpmath, same_bits, same_values
from .test_rounding import ties_away_from_zero

OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def operands(rng, ctx, spread: int, size: int = 2000):
    """p-bit operands whose exponents differ by up to ``spread`` (gaps make sums inexact)."""
    x = rng.standard_normal((2, size)) * np.exp2(rng.integers(-spread, spread + 1, (2, size)))
    return ctx.asarray(x[0]), ctx.asarray(x[1])


def elementwise_mismatches(p: int, symbol: str, spread: int, seed: int = 0) -> int:
    ctx = EmulatedContext(p)
    a, b = operands(np.random.default_rng(seed), ctx, spread)
    got = OPERATORS[symbol](a, b)
    with mpmath.workprec(p):
        pairs = [(mpmath.mpf(float(x)), mpmath.mpf(float(y))) for x, y in zip(a, b)]
        expected = [OPERATORS[symbol](x, y) for x, y in pairs]
    return int((~same_values(got, np.array(expected, dtype=object))).sum())


@pytest.mark.parametrize("symbol", OPERATORS)
def test_arithmetic_is_bit_identical_to_mpmath_up_to_25_bits(symbol):
    for spread in (10, 60):
        assert [p for p in range(2, 26) if elementwise_mismatches(p, symbol, spread)] == []


@pytest.mark.parametrize(
    "symbol,a,b",
    [  # exact results 1 + 2^-40 + 2^-54 and 1 + 2^-19 + 2^-35 + 2^-40 + 2^-55
        ("+", 1.0, 2.0**-40 + 2.0**-54),
        ("*", 1 + 2.0**-20, 1 + 2.0**-20 + 2.0**-35),
    ],
)
def test_double_rounding_shows_beyond_the_bound(symbol, a, b):
    """At p = 40 the exact result lies just above a midpoint of the format; float64 drops
    the excess (below its half ulp) and leaves an exact tie, which goes to even (down):
    the emulator gives 1 ulp less than mpmath. The p ≤ 25 limit is real."""
    ctx = EmulatedContext(40)
    got = float(OPERATORS[symbol](ctx.asarray(a), ctx.asarray(b)))
    with mpmath.workprec(40):
        correct = float(OPERATORS[symbol](mpmath.mpf(a), mpmath.mpf(b)))
    assert correct - got == 2.0**-39


def ulp(x: np.ndarray, p: int) -> np.ndarray:
    return np.exp2(np.floor(np.log2(np.abs(x))) - p + 1)


def exp_log_disagreements(p: int, count: int, seed: int = 0) -> dict[str, tuple[int, float]]:
    """Per function: (how many differ from the correctly rounded value, worst in ulps)."""
    rng = np.random.default_rng(seed)
    ctx, ref = EmulatedContext(p), ReferenceMpmath(p)
    found = {}
    for name, fn, arg in (
        ("exp", np.exp, ctx.asarray(rng.uniform(-40, 10, count))),
        ("log", np.log, ctx.asarray(np.exp2(rng.uniform(-60, 60, count)))),
    ):
        got = np.asarray(fn(arg))
        with ref.scope():
            correct = getattr(ref, name)(ref.asarray(np.asarray(arg)))
        correct = np.array([float(c) for c in correct])
        differ = got != correct
        worst = np.max(np.abs(got - correct)[differ] / ulp(correct[differ], p), initial=0.0)
        found[name] = (int(differ.sum()), float(worst))
    return found


def test_exp_and_log_are_correctly_rounded_up_to_25_bits():
    for p in range(2, 26):
        assert exp_log_disagreements(p, 600, seed=p) == {"exp": (0, 0.0), "log": (0, 0.0)}


def test_exp_and_log_stay_within_one_ulp_at_every_width():
    """Stated limit: at most 1 ulp of the format, in at most 2^{p−52} of the arguments
    (measured: about 2^{p−54}; ``+ 3`` absorbs the noise of counts near zero)."""
    for p in range(26, 53):
        count = 2000
        for name, (differ, worst) in exp_log_disagreements(p, count, seed=p).items():
            assert worst <= 1.0, (p, name, worst)
            assert differ <= count * 2.0 ** (p - 52) + 3, (p, name, differ)


# --- the whole algorithm ----------------------------------------------------------------
def run(ctx, q, k, v, g, **keywords):
    """y, lse, dq, dk, dv of the tiled passes (and the naive ones) on ``ctx``."""
    y, stats = ea.attention(q, k, v, backend=ctx, return_stats=True, **keywords)
    grads = ea.attention_backward(q, k, v, y, stats, g, backend=ctx, **keywords)
    naive = ea.naive_attention(q, k, v, backend=ctx, **keywords)
    return (y, stats.lse, *grads, naive)


def mismatches_against_mpmath(ctx, p: int, mode: str = "nearest", seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, 6, 4)), rng.standard_normal((2, 9, 4))
    v, g = rng.standard_normal((2, 9, 3)), rng.standard_normal((2, 6, 3))
    ref = ReferenceMpmath(p, mode)
    found = []
    masks = {"none": None, "causal": ea.masks.causal(), "window": ea.masks.sliding_window(2, 1)}
    for label, mask in masks.items():
        for b in (1, 4, 9):
            for dropout in (0.0, 0.25):
                keywords = dict(block_size=b, mask=mask, dropout_p=dropout, seed=7)
                got, expected = run(ctx, q, k, v, g, **keywords), run(ref, q, k, v, g, **keywords)
                for name, a, r in zip(("y", "lse", "dq", "dk", "dv", "naive y"), got, expected):
                    if not same_values(a, r).all():
                        found.append(f"{name} mask={label} b={b} dropout={dropout}")
    return found


@pytest.mark.parametrize("p", [3, 5, 8, 11, 16, 24, 25])
def test_tiled_forward_and_backward_are_bit_identical_to_mpmath(p):
    """Every y, lse, dq, dk, dv (and the naive y) equals mpmath's at prec = p, bit for bit.

    Masks, block sizes 1..n_k, dropout, cross-attention, a batch: each step of the
    algorithm is a + − × ÷ (harmless double rounding at p ≤ 25), a correctly rounded
    exp/log, or exact (max, where); dot products and row sums accumulate left to right on
    both sides (mpmath's object ``@`` and ``np.sum`` do).
    """
    assert mismatches_against_mpmath(EmulatedContext(p), p) == []


@pytest.mark.parametrize("p", [5, 11, 24])
def test_toward_zero_is_bit_identical_to_mpmath_rounding_down(p):
    """Truncating float64 results equals mpmath's round-down here.

    The two differ only where a float64 result rounded *up* onto a number of the format
    (a sum whose addends' exponents differ by more than 53 − p); these inputs have none.
    """
    ctx = EmulatedContext(p, rounding="toward_zero")
    assert mismatches_against_mpmath(ctx, p, "toward_zero") == []


def test_the_whole_algorithm_check_rejects_a_wrong_width_and_ties_away(monkeypatch):
    assert mismatches_against_mpmath(EmulatedContext(9), 8)
    assert mismatches_against_mpmath(EmulatedContext(11, rounding="toward_zero"), 11)
    monkeypatch.setattr(eb, "round_significand", ties_away_from_zero)
    assert mismatches_against_mpmath(EmulatedContext(5), 5)


def test_granularity_op_is_not_mpmath():
    """Whole-operation rounding of float64 matmuls and sums differs from per-scalar rounding."""
    assert mismatches_against_mpmath(EmulatedContext(5, granularity="op"), 5)


def test_same_bits_sees_a_one_ulp_difference():
    x = np.array([1.0, 2.0])
    assert not same_bits(x, np.nextafter(x, 3)).any()


def test_toward_zero_truncates_the_float64_result_not_the_exact_one():
    """1 − 2^-60 is 1 in float64, and truncating 1 keeps 1; true round-down gives 1 − 2^-11."""
    ctx = EmulatedContext(11, rounding="toward_zero")
    got = float(ctx.asarray(1.0) - ctx.asarray(2.0**-60))
    ref = ReferenceMpmath(11, "toward_zero")
    with ref.scope():
        exact = float(mpmath.mpf(1) - mpmath.mpf(2.0**-60))
    assert (got, exact) == (1.0, 1 - 2.0**-11)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_larger_runs_are_bit_identical_in_both_modes(seed):
    rng = np.random.default_rng(seed)
    q, k, v, g = rng.standard_normal((4, 2, 24, 8))
    keywords = dict(block_size=7, mask=ea.masks.causal(), dropout_p=0.1, seed=1)
    for mode in ("nearest", "toward_zero"):
        for p in (5, 11, 24):
            got = run(EmulatedContext(p, rounding=mode), q, k, v, g, **keywords)
            expected = run(ReferenceMpmath(p, mode), q, k, v, g, **keywords)
            assert all(same_values(a, r).all() for a, r in zip(got, expected)), (mode, p)


@pytest.mark.slow
def test_exp_and_log_with_many_arguments():
    for p in range(2, 53):
        count = 20000
        for name, (differ, worst) in exp_log_disagreements(p, count, seed=100 + p).items():
            assert worst <= 1.0, (p, name, worst)
            limit = 0 if p <= 25 else count * 2.0 ** (p - 52) + 3
            assert differ <= limit, (p, name, differ)
