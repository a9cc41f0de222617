"""Attention sinks: one logit per head in the denominator only, forward and reverse."""

from __future__ import annotations

import numpy as np
import pytest

import exactattn
from exactattn.core import masks

from .spec import softmax_rows


def _spec(q, k, v, sinks, allowed=None):
    """``(Y, lse)`` with ``e^{σ_h}`` added to each row's denominator; q (B, H, n, d)."""
    y = np.zeros((*q.shape[:-1], v.shape[-1]))
    lse = np.zeros(q.shape[:-1])
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = q[b, h] @ k[b, h].T / np.sqrt(q.shape[-1])
            if allowed is not None:
                s = np.where(allowed, s, -np.inf)
            y[b, h], lse[b, h] = softmax_rows(s, v[b, h], sinks[h])
    return y, lse


def _loss(q, k, v, sinks, g, allowed=None):
    return float((_spec(q, k, v, sinks, allowed)[0] * g).sum())


@pytest.mark.parametrize("block_size", [1, 4, 64])
def test_sinks_forward_and_every_gradient(block_size):
    rng = np.random.default_rng(block_size)
    q, k, v = (rng.normal(size=(2, 3, n, 4)) for n in (5, 9, 9))
    v = rng.normal(size=(2, 3, 9, 2))
    sinks = rng.normal(size=3) * 2
    allowed = np.arange(9)[None, :] <= np.arange(5)[:, None] + 4
    mask = masks.causal("bottom-right")
    y, stats = exactattn.attention(
        q, k, v, sinks=sinks, mask=mask, block_size=block_size, return_stats=True
    )
    y_ref, lse_ref = _spec(q, k, v, sinks, allowed)
    np.testing.assert_allclose(y, y_ref, atol=1e-14)
    np.testing.assert_allclose(stats.lse, lse_ref, atol=1e-14)
    g = rng.normal(size=y.shape)
    grads = exactattn.attention_backward(
        q, k, v, y, stats, g, sinks=sinks, mask=mask, block_size=block_size
    )
    args, eps = [q, k, v, sinks], 1e-6
    for t, grad in enumerate(grads):
        direction = rng.normal(size=args[t].shape)
        plus = [a + eps * direction if r == t else a for r, a in enumerate(args)]
        minus = [a - eps * direction if r == t else a for r, a in enumerate(args)]
        numeric = (_loss(*plus, g, allowed) - _loss(*minus, g, allowed)) / (2 * eps)
        assert abs(float((grad * direction).sum()) - numeric) < 1e-7, t


def test_a_row_with_no_key_has_the_sink_as_lse_and_zero_output():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 2))
    sinks = np.array([0.25, -1.5])
    none_for_row_0 = lambda i, j: i > 0  # noqa: E731
    y, stats = exactattn.attention(q, k, v, sinks=sinks, mask=none_for_row_0, return_stats=True)
    assert (y[:, 0] == 0).all()
    np.testing.assert_array_equal(stats.lse[:, 0], sinks)


def test_sinks_are_the_merge_with_an_empty_partial():
    rng = np.random.default_rng(2)
    q, k, v = rng.normal(size=(3, 4, 4)), rng.normal(size=(3, 6, 4)), rng.normal(size=(3, 6, 2))
    sinks = rng.normal(size=3)
    y, stats = exactattn.attention(q, k, v, return_stats=True)
    sink_part = (np.zeros_like(y), np.broadcast_to(sinks[:, None], stats.lse.shape))
    y_merged, lse_merged = exactattn.merge_partials([(y, stats.lse), sink_part])
    y_sink, stats_sink = exactattn.attention(q, k, v, sinks=sinks, return_stats=True)
    np.testing.assert_allclose(y_sink, y_merged, atol=1e-15)
    np.testing.assert_allclose(stats_sink.lse, lse_merged, atol=1e-14)


def test_sinks_with_grouped_heads_and_on_the_naive_reference():
    rng = np.random.default_rng(3)
    q = rng.normal(size=(1, 4, 3, 4))
    k, v = rng.normal(size=(1, 2, 5, 4)), rng.normal(size=(1, 2, 5, 2))
    sinks = rng.normal(size=4)
    y = exactattn.attention(q, k, v, sinks=sinks, enable_gqa=True, block_size=2)
    y_naive = exactattn.naive_attention(q, k, v, sinks=sinks, enable_gqa=True)
    y_ref, _ = _spec(q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1), sinks)
    np.testing.assert_allclose(y, y_ref, atol=1e-14)
    np.testing.assert_allclose(y_naive, y_ref, atol=1e-14)


def test_sinks_over_sympy_are_exact():
    import sympy

    q = np.array([[[sympy.Integer(1), sympy.Integer(0)]]], dtype=object)
    k = np.array(
        [[[sympy.Integer(1), sympy.Integer(1)], [sympy.Integer(0), sympy.Integer(2)]]], dtype=object
    )
    v = np.array([[[sympy.Integer(3)], [sympy.Integer(-1)]]], dtype=object)
    sigma = sympy.Symbol("sigma", real=True)
    y, stats = exactattn.attention(
        q, k, v, sinks=np.array([sigma], dtype=object), scale=sympy.Integer(1), return_stats=True
    )
    e1, e2, es = sympy.exp(1), sympy.exp(0), sympy.exp(sigma)
    assert sympy.simplify(y[0, 0, 0] - (3 * e1 - e2) / (e1 + e2 + es)) == 0
    assert sympy.simplify(sympy.exp(stats.lse[0, 0]) - (e1 + e2 + es)) == 0
