"""The block-recomputed reverse equals the naive VJP and the derivative itself."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

import exactattn as ea

from .helpers import every_mask, inputs


@pytest.mark.parametrize("shape", [((), 5, 5, 4, 4), ((2,), 3, 7, 4, 2), ((2, 2), 6, 4, 3, 5)])
def test_tiled_reverse_equals_naive_vjp_for_every_block_size_and_mask(shape):
    batch, n_q, n_k, d, v = shape
    rng = np.random.default_rng(10)
    q, k, val = inputs(rng, batch, n_q, n_k, d, v)
    g = rng.standard_normal((*batch, n_q, v))
    for name, mask in every_mask(rng, batch, n_q, n_k).items():
        y_ref, s_ref = ea.naive_attention(q, k, val, mask=mask, return_stats=True)
        expected = ea.naive_attention_backward(q, k, val, y_ref, s_ref, g, mask=mask)
        for b in range(1, n_k + 2):
            y, stats = ea.attention(q, k, val, block_size=b, mask=mask, return_stats=True)
            grads = ea.attention_backward(q, k, val, y, stats, g, block_size=b, mask=mask)
            for label, got, want in zip("qkv", grads, expected):
                assert got.shape == want.shape
                np.testing.assert_allclose(
                    got, want, rtol=1e-12, atol=1e-13, err_msg=f"d{label} {name} b={b}"
                )


def _loss(q, k, v, g, ctx, mask):
    y = ea.attention(q, k, v, block_size=2, mask=mask, backend=ctx)
    return mpmath.fsum(a * b for a, b in zip(y.flat, g.flat))


def test_reverse_matches_mpmath_central_differences():
    """d/dx Σ G∘Y by central differences at 60 digits, step 1e-20: error ~ h² ≈ 1e-40."""
    rng = np.random.default_rng(11)
    q, k, v = inputs(rng, (), 3, 4, 2, 2)
    g = rng.standard_normal((3, 2))
    mask = ea.masks.causal("bottom-right")
    ctx = ea.MpmathContext(dps=60)
    y, stats = ea.attention(q, k, v, block_size=3, mask=mask, backend=ctx, return_stats=True)
    grads = ea.attention_backward(q, k, v, y, stats, g, block_size=3, mask=mask, backend=ctx)
    h = mpmath.mpf("1e-20")
    with mpmath.workdps(60):
        for which, grad in enumerate(grads):
            args = [ctx.asarray(x) for x in (q, k, v)]
            for index in np.ndindex(args[which].shape):
                plus = [a.copy() for a in args]
                minus = [a.copy() for a in args]
                plus[which][index] += h
                minus[which][index] -= h
                fd = (_loss(*plus, g, ctx, mask) - _loss(*minus, g, ctx, mask)) / (2 * h)
                assert abs(fd - grad[index]) < mpmath.mpf("1e-35"), (which, index)


def test_self_attention_gradient_is_sum_of_the_three_uses():
    """dX = dQ + dK + dV, checked against central differences of naive self-attention."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((4, 3))
    g = rng.standard_normal((4, 3))
    y, stats = ea.self_attention(x, block_size=3, return_stats=True)
    dx = ea.self_attention_backward(x, y, stats, g, block_size=3)
    h = 1e-6
    fd = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[index] = h
        fd[index] = (
            np.sum(g * ea.naive_attention(x + e, x + e, x + e))
            - np.sum(g * ea.naive_attention(x - e, x - e, x - e))
        ) / (2 * h)
    np.testing.assert_allclose(dx, fd, rtol=1e-7, atol=1e-8)


def test_empty_rows_opt_in_gives_zero_output_and_zero_gradients():
    rng = np.random.default_rng(13)
    q, k, v = inputs(rng, (), 5, 3, 2, 2)
    mask = ea.masks.causal("bottom-right")  # rows 0 and 1 see no key when n_q = 5 > n_k = 3
    y, stats = ea.attention(q, k, v, mask=mask, block_size=2, empty_rows="zero", return_stats=True)
    assert (y[:2] == 0).all() and np.isneginf(stats.lse[:2]).all()
    g = rng.standard_normal(y.shape)
    dq, dk, dv = ea.attention_backward(
        q, k, v, y, stats, g, mask=mask, block_size=2, empty_rows="zero"
    )
    assert (dq[:2] == 0).all()
    assert all(np.isfinite(x).all() for x in (y, dq, dk, dv))
    y_ref = ea.naive_attention(q, k, v, mask=mask, empty_rows="zero")
    np.testing.assert_allclose(y, y_ref, rtol=1e-13)
