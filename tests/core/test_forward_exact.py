"""Tiled forward == naive attention: every block size, every mask kind, every number system."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import sympy

import exactattn as ea

from .helpers import every_mask, inputs

SHAPES = [  # (batch, n_q, n_k, d, v): self, cross both ways, v != d, batch and heads
    ((), 5, 5, 4, 4),
    ((2,), 3, 7, 4, 2),
    ((2, 3), 6, 4, 3, 5),
    ((1, 2), 1, 1, 2, 3),
]


@pytest.mark.parametrize("shape", SHAPES)
def test_float64_tiled_equals_naive_for_every_block_size_and_mask(shape):
    batch, n_q, n_k, d, v = shape
    rng = np.random.default_rng(0)
    q, k, val = inputs(rng, batch, n_q, n_k, d, v)
    for name, mask in every_mask(rng, batch, n_q, n_k).items():
        y_ref, stats_ref = ea.naive_attention(q, k, val, mask=mask, return_stats=True)
        for b in range(1, n_k + 2):
            y, stats = ea.attention(q, k, val, block_size=b, mask=mask, return_stats=True)
            assert y.shape == (*batch, n_q, v)
            np.testing.assert_allclose(y, y_ref, rtol=1e-13, atol=1e-14, err_msg=f"{name} b={b}")
            np.testing.assert_allclose(stats.lse, stats_ref.lse, rtol=1e-14, atol=1e-14)


def test_leading_dims_broadcast_like_multi_query_attention():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 4, 5, 3))
    k = rng.standard_normal((2, 1, 6, 3))  # one K/V head shared by 4 query heads
    v = rng.standard_normal((1, 1, 6, 2))
    y = ea.attention(q, k, v, block_size=4)
    expected = ea.naive_attention(
        q, np.broadcast_to(k, (2, 4, 6, 3)), np.broadcast_to(v, (2, 4, 6, 2))
    )
    np.testing.assert_allclose(y, expected, rtol=1e-13)


def test_mpmath_50_digits_tiled_equals_naive_to_1e45():
    rng = np.random.default_rng(2)
    q, k, v = inputs(rng, (), 4, 6, 3, 2)
    ctx = ea.MpmathContext(dps=50)
    mask = ea.masks.causal("bottom-right")
    y_ref = ea.naive_attention(q, k, v, mask=mask, backend=ctx)
    for b in (1, 2, 4, 7):
        y = ea.attention(q, k, v, block_size=b, mask=mask, backend=ctx)
        assert all(isinstance(e, mpmath.mpf) for e in y.flat)
        assert max(abs(a - r) for a, r in zip(y.flat, y_ref.flat)) < mpmath.mpf("1e-45")
    assert mpmath.mp.prec == 53, "the backend must restore mpmath's precision"


def exact_zero(expr) -> bool:
    """Split every exp of a sum, bring to one fraction, and expand the numerator to 0."""
    split = expr.replace(
        lambda e: isinstance(e, sympy.exp) and isinstance(e.args[0], sympy.Add),
        lambda e: sympy.Mul(*[sympy.exp(a) for a in e.args[0].args]),
    )
    numerator, _ = sympy.fraction(sympy.together(split))
    return sympy.expand(numerator) == 0


def symbols(name, shape):
    return np.array(sympy.symbols(f"{name}0:{int(np.prod(shape))}", real=True)).reshape(shape)


@pytest.mark.parametrize("n_q,n_k", [(1, 1), (2, 3), (3, 3)])
def test_sympy_tiled_minus_naive_is_exactly_zero(n_q, n_k):
    q, k, v = symbols("q", (n_q, 2)), symbols("k", (n_k, 2)), symbols("v", (n_k, 1))
    c = sympy.Symbol("c", positive=True)
    y_ref = ea.naive_attention(q, k, v, scale=c, backend="sympy")
    for b in range(1, n_k + 2):
        y = ea.attention(q, k, v, block_size=b, scale=c, backend="sympy")
        assert all(exact_zero(a - r) for a, r in zip(y.flat, y_ref.flat)), f"b={b}"


def test_exact_zero_detects_a_real_difference():
    x, y = sympy.symbols("x y", real=True)
    assert exact_zero(sympy.exp(x + y) - sympy.exp(x) * sympy.exp(y))
    assert not exact_zero(sympy.exp(x + y) - sympy.exp(x))


def test_logits_of_1e4_do_not_overflow():
    q = np.array([[100.0, 0.0], [0.0, 100.0]])
    k = np.array([[100.0, 0.0], [-100.0, 100.0], [0.0, 0.0]])
    v = np.array([[1.0], [2.0], [3.0]])
    y, stats = ea.attention(q, k, v, scale=1.0, block_size=1, return_stats=True)
    assert np.isfinite(y).all() and np.isfinite(stats.lse).all()
    # Row 0 puts all weight on key 0 (score 1e4 vs 0, -1e4); row 1 on key 1 (1e4).
    np.testing.assert_allclose(y[:, 0], [1.0, 2.0])
    np.testing.assert_allclose(stats.lse, [1e4, 1e4])


def test_float16_with_fa2_policy_is_closer_than_pure_float16():
    rng = np.random.default_rng(3)
    q, k, v = inputs(rng, (), 64, 64, 16, 16)
    exact = ea.attention(q, k, v, backend=ea.MpmathContext(prec=80))
    exact = exact.astype(float)
    pure = ea.attention(q, k, v, backend=ea.NumpyContext("float16")).astype(float)
    fa2 = ea.attention(
        q, k, v, backend=ea.NumpyContext("float16", compute="float32", p_cast="float16")
    ).astype(float)
    assert np.abs(fa2 - exact).max() < np.abs(pure - exact).max()
