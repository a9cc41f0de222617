"""Hypothesis properties: block-size invariance, key-permutation equivariance, masked keys."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import exactattn as ea

sizes = st.tuples(st.integers(1, 6), st.integers(1, 9), st.integers(1, 4), st.integers(1, 3))


def _draw_inputs(seed, n_q, n_k, d, v):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_q, d))
    k = rng.standard_normal((n_k, d))
    val = rng.standard_normal((n_k, v))
    allowed = rng.random((n_q, n_k)) < 0.6
    allowed[np.arange(n_q), rng.integers(0, n_k, n_q)] = True  # every A_i nonempty
    return q, k, val, allowed, rng


@given(sizes, st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(1, 12))
def test_block_size_does_not_change_the_result(shape, seed, b1, b2):
    q, k, v, allowed, _ = _draw_inputs(seed, *shape)
    y1 = ea.attention(q, k, v, mask=allowed, block_size=b1)
    y2 = ea.attention(q, k, v, mask=allowed, block_size=b2)
    np.testing.assert_allclose(y1, y2, rtol=1e-12, atol=1e-13)


@given(sizes, st.integers(0, 2**32 - 1), st.integers(1, 5))
def test_permuting_keys_with_values_and_mask_leaves_y_unchanged(shape, seed, b):
    q, k, v, allowed, rng = _draw_inputs(seed, *shape)
    perm = rng.permutation(k.shape[0])
    y = ea.attention(q, k, v, mask=allowed, block_size=b)
    y_perm = ea.attention(q, k[perm], v[perm], mask=allowed[:, perm], block_size=b)
    np.testing.assert_allclose(y, y_perm, rtol=1e-12, atol=1e-13)


@given(sizes, st.integers(0, 2**32 - 1), st.integers(1, 5))
def test_masked_keys_have_no_influence_and_zero_gradient(shape, seed, b):
    q, k, v, allowed, rng = _draw_inputs(seed, *shape)
    masked_everywhere = ~allowed.any(axis=0)  # keys no query may attend
    k2, v2 = k.copy(), v.copy()
    k2[masked_everywhere] = rng.standard_normal(k2[masked_everywhere].shape) * 50
    v2[masked_everywhere] = rng.standard_normal(v2[masked_everywhere].shape) * 50
    y, stats = ea.attention(q, k, v, mask=allowed, block_size=b, return_stats=True)
    y2 = ea.attention(q, k2, v2, mask=allowed, block_size=b)
    np.testing.assert_array_equal(y, y2)
    g = rng.standard_normal(y.shape)
    _, dk, dv = ea.attention_backward(q, k, v, y, stats, g, mask=allowed, block_size=b)
    assert (dk[masked_everywhere] == 0).all() and (dv[masked_everywhere] == 0).all()
