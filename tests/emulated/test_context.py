"""The emulated ctx: every operation rounds, in both granularities, and each option matters.

Specifications: ``spec_round`` of the float64 result (elementwise ops, and whole
operations in ``granularity="op"``) and mpmath's object-array ``@`` / ``np.sum`` at
``prec = p`` (sequential accumulation, ``granularity="scalar"``).
"""

from __future__ import annotations

import operator
import pickle

import mpmath
import numpy as np
import pytest

import exactattn as ea
from exactattn.backends.emulated_backend import EmulatedArray, EmulatedContext, EmulatedFormat

from .spec import ReferenceMpmath, same_bits, same_values, spec_round

P = 8


def rounded(x: np.ndarray, p: int = P, emin=None, emax=None, mode="nearest") -> np.ndarray:
    flat = [spec_round(float(v), p, emin, emax, mode) for v in np.ravel(x)]
    return np.array(flat).reshape(np.shape(x))


def in_format(x: np.ndarray, p: int = P, emin=None, emax=None) -> bool:
    x = np.asarray(x, dtype=np.float64)
    return bool(same_bits(rounded(x, p, emin, emax), x).all())


@pytest.fixture
def ctx():
    return EmulatedContext(P)


@pytest.fixture
def ab(ctx):
    rng = np.random.default_rng(0)
    return ctx.asarray(rng.standard_normal((5, 7))), ctx.asarray(rng.standard_normal((5, 7)))


@pytest.mark.parametrize(
    "op", [operator.add, operator.sub, operator.mul, operator.truediv, np.exp, np.log]
)
def test_operators_and_ufuncs_round_their_results(ctx, ab, op):
    a, b = ab
    args = (np.abs(a),) if op is np.log else (a,) if op is np.exp else (a, b)
    got = op(*args)
    assert isinstance(got, EmulatedArray)
    plain = op(*(x.view(np.ndarray) for x in args))
    assert same_bits(got, rounded(plain)).all()
    assert not in_format(plain)  # so rounding had something to do


def test_in_place_operators_and_slices_round_and_keep_the_array(ctx, ab):
    a, b = ab
    third = spec_round(1 / 3, P)
    expected = rounded(rounded(a.view(np.ndarray) * b.view(np.ndarray)) + third)
    c = a.copy()
    c *= b
    c[1:3, ::2] += ctx.scalar(1.0 / 3.0)  # a strided view, then set back
    assert isinstance(c, EmulatedArray)
    assert same_bits(c[1:3, ::2], expected[1:3, ::2]).all()
    assert same_bits(c[0], rounded(a.view(np.ndarray)[0] * b.view(np.ndarray)[0])).all()


def test_scalars_are_rounded_and_their_arithmetic_too(ctx):
    third = ctx.scalar(1) / ctx.scalar(3)
    assert isinstance(third, EmulatedArray) and third.shape == ()
    assert float(third) == spec_round(1 / 3, P)
    assert float(ctx.scalar(0.1)) == spec_round(0.1, P)
    assert float(ctx.default_scale(10)) == spec_round(1 / spec_round(10**0.5, P), P)


def test_inputs_are_rounded_to_the_storage_format(ctx):
    x = np.random.default_rng(1).standard_normal(50)
    assert same_bits(ctx.asarray(x), rounded(x)).all()
    assert isinstance(ctx.asarray(np.float32(0.1)), EmulatedArray)


def mpmath_object(x: np.ndarray, p: int) -> np.ndarray:
    with mpmath.workprec(p):
        return np.frompyfunc(mpmath.mpf, 1, 1)(np.asarray(x, dtype=np.float64))


@pytest.mark.parametrize("mode", ["nearest", "toward_zero"])
def test_scalar_granularity_matmul_and_sum_accumulate_like_mpmath(mode):
    """acc = fl(a₀b₀), acc = fl(acc + fl(a_r b_r)): mpmath's object ``@`` and ``np.sum``."""
    rng = np.random.default_rng(2)
    ctx, ref = EmulatedContext(P, rounding=mode), ReferenceMpmath(P, mode)
    a, b = ctx.asarray(rng.standard_normal((3, 4, 33))), ctx.asarray(rng.standard_normal((33, 5)))
    with ref.scope():
        ma, mb = ref.asarray(np.asarray(a)), ref.asarray(np.asarray(b))
        expected_product, expected_sum = ma @ mb, np.sum(ma, axis=-1)
        expected_total = np.sum(ma, axis=(0, 2))
    assert same_values(a @ b, expected_product).all()
    assert same_values(np.sum(a, axis=-1), expected_sum).all()
    assert same_values(np.sum(a, axis=(0, 2)), expected_total).all()


def test_op_granularity_rounds_each_float64_operation_once():
    rng = np.random.default_rng(3)
    ctx = EmulatedContext(P, granularity="op")
    a, b = ctx.asarray(rng.standard_normal((4, 64))), ctx.asarray(rng.standard_normal((64, 6)))
    plain_a, plain_b = a.view(np.ndarray), b.view(np.ndarray)
    assert same_bits(a @ b, rounded(plain_a @ plain_b)).all()
    assert same_bits(ctx.rowsum(a), rounded(np.sum(plain_a, axis=-1))).all()


def test_granularity_changes_dot_products_and_attention():
    rng = np.random.default_rng(4)
    scalar, op = EmulatedContext(P), EmulatedContext(P, granularity="op")
    x, y = rng.standard_normal((8, 64)), rng.standard_normal((64, 8))
    assert not same_bits(scalar.asarray(x) @ scalar.asarray(y), op.asarray(x) @ op.asarray(y)).all()
    q, k, v = rng.standard_normal((3, 32, 32))
    ys = [ea.attention(q, k, v, block_size=8, backend=c) for c in (scalar, op)]
    assert not same_bits(*ys).all()


def test_every_array_of_a_run_is_in_the_format():
    rng = np.random.default_rng(5)
    q, k, v, g = rng.standard_normal((4, 2, 12, 4))
    for ctx in (EmulatedContext(P), EmulatedContext(P, rounding="toward_zero", granularity="op")):
        y, stats = ea.attention(q, k, v, block_size=5, backend=ctx, return_stats=True)
        grads = ea.attention_backward(q, k, v, y, stats, g, block_size=5, backend=ctx)
        for x in (y, stats.m, stats.l, stats.lse, *grads):
            assert in_format(x)
        assert type(y) is np.ndarray  # outputs are plain float64: the caller's arithmetic is exact


def test_rounding_mode_changes_attention():
    rng = np.random.default_rng(6)
    q, k, v = rng.standard_normal((3, 16, 8))
    ys = [
        ea.attention(q, k, v, block_size=4, backend=EmulatedContext(P, rounding=mode))
        for mode in ("nearest", "toward_zero")
    ]
    assert not same_bits(*ys).all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf − inf in the overflowing run
def test_a_bounded_exponent_underflows_gradually_and_overflows():
    """fp16: tiny values land on the subnormal grid 2^-24; scores beyond 65504 overflow."""
    rng = np.random.default_rng(7)
    q, k = rng.standard_normal((2, 8, 4))
    v = rng.standard_normal((8, 4)) * 1e-6  # near fp16's subnormal range
    fp16, unbounded = EmulatedContext(11, exponent=5), EmulatedContext(11)
    y16, y = (ea.attention(q, k, v, block_size=4, backend=c) for c in (fp16, unbounded))
    assert in_format(y16, 11, -14, 15) and not in_format(y, 11, -14, 15)
    assert np.all(np.abs(y16) < 2.0**-14) and np.all(y16 % 2.0**-24 == 0)
    with pytest.raises(FloatingPointError, match="overflowed"):
        ea.attention(q * 300, k * 300, v, backend=fp16)


def test_storage_and_p_cast_formats_are_the_precision_policy():
    """FlashAttention-2 in emulation: fp16 inputs, outputs and p; fp32 arithmetic."""
    fp16 = EmulatedFormat.of(11, 5)
    policy = EmulatedContext(24, exponent=8, storage=fp16, p_cast=fp16)
    no_cast = EmulatedContext(24, exponent=8, storage=fp16)
    rng = np.random.default_rng(8)
    q, k, v = rng.standard_normal((3, 16, 8))
    y, stats = ea.attention(q, k, v, block_size=4, backend=policy, return_stats=True)
    assert in_format(y, 11, -14, 15) and in_format(stats.l, 24, -126, 127)
    assert not in_format(stats.l, 11, -14, 15)  # statistics stay in the compute format
    assert same_bits(policy.asarray(q), rounded(q, 11, -14, 15)).all()
    p = policy.as_compute(rng.random((4, 4)))
    assert same_bits(policy.round_p(p), rounded(p.view(np.ndarray), 11, -14, 15)).all()
    assert not same_bits(y, ea.attention(q, k, v, block_size=4, backend=no_cast)).all()


def test_arrays_pickle_with_their_context(ctx):
    x = ctx.asarray([1.0, 2.0])
    back = pickle.loads(pickle.dumps(x))
    assert isinstance(back, EmulatedArray) and back._ctx == ctx
    assert float((back / 3)[0]) == spec_round(1 / 3, P)


# --- arguments ----------------------------------------------------------------------------
def test_bad_arguments_are_named_and_quoted():
    with pytest.raises(ValueError, match=r"granularity.*'block'"):
        EmulatedContext(11, granularity="block")
    with pytest.raises(TypeError, match="storage must be an EmulatedFormat"):
        EmulatedContext(11, storage=11)
    with pytest.raises(ValueError, match="mantissa_bits"):
        EmulatedContext(0)
    ones = np.ones((2, 2))
    with pytest.raises(TypeError, match="q: expected real numbers; got an array of dtype complex"):
        ea.attention(ones.astype(complex), ones, ones, backend=EmulatedContext(8))


def test_mixing_formats_and_unsupported_reductions_are_refused(ctx):
    other = EmulatedContext(P + 1)
    with pytest.raises(TypeError, match="mixes arrays of different emulated formats"):
        ctx.asarray([1.0]) + other.asarray([1.0])
    with pytest.raises(TypeError, match=r"add.accumulate is not emulated"):
        ctx.asarray([1.0, 2.0]).cumsum()
    for fn in (np.dot, np.inner, np.outer, np.tensordot, np.cumsum, lambda a, b: a.dot(b)):
        with pytest.raises(TypeError, match="does not round its arithmetic"):
            fn(ctx.asarray([1.0, 2.0]), ctx.asarray([3.0, 4.0]))
