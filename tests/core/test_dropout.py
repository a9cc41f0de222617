"""Dropout: counter-based keep-bits replayed in the reverse, same as the naive reference."""

from __future__ import annotations

import numpy as np

import exactattn as ea
from exactattn.core.dropout import Dropout

from .helpers import inputs


def test_tiled_dropout_equals_naive_dropout_forward_and_reverse():
    rng = np.random.default_rng(0)
    q, k, v = inputs(rng, (2, 2), 7, 9, 3, 4)
    g = rng.standard_normal((2, 2, 7, 4))
    kw = dict(dropout_p=0.3, seed=1234, mask=ea.masks.causal("bottom-right"))
    y_ref, s_ref = ea.naive_attention(q, k, v, return_stats=True, **kw)
    expected = ea.naive_attention_backward(q, k, v, y_ref, s_ref, g, **kw)
    for b in (1, 3, 9, 10):
        y, stats = ea.attention(q, k, v, block_size=b, return_stats=True, **kw)
        np.testing.assert_allclose(y, y_ref, rtol=1e-13, atol=1e-14)
        grads = ea.attention_backward(q, k, v, y, stats, g, block_size=b, **kw)
        for got, want in zip(grads, expected):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


def test_dropout_changes_the_output_and_depends_on_the_seed():
    rng = np.random.default_rng(1)
    q, k, v = inputs(rng, (), 8, 8, 4, 4)
    plain = ea.attention(q, k, v)
    a = ea.attention(q, k, v, dropout_p=0.5, seed=1)
    b = ea.attention(q, k, v, dropout_p=0.5, seed=2)
    assert not np.allclose(a, plain) and not np.allclose(a, b)
    np.testing.assert_array_equal(a, ea.attention(q, k, v, dropout_p=0.5, seed=1))


def test_keep_fraction_matches_one_minus_p_and_bits_differ_across_heads():
    dropout = Dropout(0.25, seed=7)
    batch_index = np.arange(4).reshape(4, 1, 1)
    keep = dropout.keep(batch_index, np.arange(256)[:, None], np.arange(256)[None, :])
    assert keep.shape == (4, 256, 256)
    # 262144 Bernoulli(0.75) draws: the fraction is within 5 standard deviations of 0.75.
    assert abs(keep.mean() - 0.75) < 5 * np.sqrt(0.75 * 0.25 / keep.size)
    assert (keep[0] != keep[1]).mean() > 0.3


def test_keep_bits_are_a_pure_function_of_the_indices():
    dropout = Dropout(0.5, seed=2**40 + 3)
    whole = dropout.keep(
        np.zeros((1, 1, 1), dtype=np.int64), np.arange(10)[:, None], np.arange(10)[None, :]
    )
    part = dropout.keep(
        np.zeros((1, 1, 1), dtype=np.int64), np.arange(4, 7)[:, None], np.arange(2, 9)[None, :]
    )
    np.testing.assert_array_equal(whole[:, 4:7, 2:9], part)
