"""Packed variable-length batches and paged caches equal per-sequence attention."""

from __future__ import annotations

import numpy as np
import pytest

import exactattn

from . import spec

LENGTHS = [  # (len_q, len_k) per sequence: an empty sequence, n_q > n_k, n_q < n_k, tails
    [(3, 4), (0, 2), (5, 5), (2, 7), (4, 1)],
    [(1, 9), (6, 6)],
    [(0, 0), (7, 3), (3, 0)],
]


def _packed(rng, lengths, heads=4, heads_kv=2, d=3, dv=2):
    cu_q = np.concatenate([[0], np.cumsum([a for a, _ in lengths])])
    cu_k = np.concatenate([[0], np.cumsum([b for _, b in lengths])])
    q = rng.normal(size=(cu_q[-1], heads, d))
    k, v = rng.normal(size=(cu_k[-1], heads_kv, d)), rng.normal(size=(cu_k[-1], heads_kv, dv))
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(causal=True),
        dict(window=(1, 2)),
        dict(causal=True, window=(2, None)),
        dict(softcap=2.0),
        dict(alibi=True),
        dict(causal=True, alibi=True, sinks=True),
    ],
)
@pytest.mark.parametrize("block_size", [1, 3, 64])
def test_varlen_equals_attention_per_sequence(lengths, options, block_size):
    rng = np.random.default_rng(block_size + len(lengths))
    q, k, v, cu_q, cu_k = _packed(rng, lengths)
    options = dict(options)
    slopes = rng.uniform(0.1, 1, size=(len(lengths), 4)) if options.pop("alibi", False) else None
    sinks = rng.normal(size=4) if options.pop("sinks", False) else None
    left, right = options.pop("window", (None, None))
    y, stats = exactattn.varlen_attention(
        q,
        k,
        v,
        cu_q,
        cu_k,
        window=(left, right),
        alibi_slopes=slopes,
        sinks=sinks,
        block_size=block_size,
        return_stats=True,
        **options,
    )
    y_ref, lse_ref = spec.varlen(
        q,
        k,
        v,
        cu_q,
        cu_k,
        left=left,
        right=right,
        slopes=slopes,
        sinks=sinks,
        causal=options.get("causal", False),
        softcap=options.get("softcap"),
    )
    np.testing.assert_allclose(y, y_ref, atol=1e-14)
    np.testing.assert_allclose(stats.lse, lse_ref, atol=1e-13)


def test_varlen_tiles_between_sequences_are_never_computed():
    from exactattn.backends import NumpyContext
    from exactattn.core import algorithm
    from exactattn.core.masks import Geometry, PackedSequences

    cu = np.array([0, 4, 8, 12])
    tiles = list(
        algorithm.tiles(NumpyContext(), PackedSequences(cu, cu), Geometry(12, 12, (1,)), 4)
    )
    assert [(t.rows, t.cols) for t in tiles] == [(slice(4 * s, 4 * s + 4),) * 2 for s in range(3)]


def test_varlen_backward_against_finite_differences():
    rng = np.random.default_rng(7)
    q, k, v, cu_q, cu_k = _packed(rng, LENGTHS[0])
    kw = dict(causal=True, window=(3, None))
    y, stats = exactattn.varlen_attention(
        q, k, v, cu_q, cu_k, block_size=2, return_stats=True, **kw
    )
    g = rng.normal(size=y.shape)
    grads = exactattn.varlen_attention_backward(
        q, k, v, y, stats, g, cu_q, cu_k, block_size=2, **kw
    )

    def loss(q, k, v):
        return float((spec.varlen(q, k, v, cu_q, cu_k, causal=True, left=3)[0] * g).sum())

    eps = 1e-6
    for t, grad in enumerate(grads):
        direction = rng.normal(size=grad.shape)
        args = [q, k, v]
        plus = [a + eps * direction if r == t else a for r, a in enumerate(args)]
        minus = [a - eps * direction if r == t else a for r, a in enumerate(args)]
        numeric = (loss(*plus) - loss(*minus)) / (2 * eps)
        assert abs(float((grad * direction).sum()) - numeric) < 1e-7


def test_varlen_over_mpmath_matches_float64():
    from exactattn import MpmathContext

    rng = np.random.default_rng(8)
    q, k, v, cu_q, cu_k = _packed(rng, LENGTHS[1], heads=2, heads_kv=1)
    y = exactattn.varlen_attention(q, k, v, cu_q, cu_k, causal=True, backend=MpmathContext(100))
    y_ref, _ = spec.varlen(q, k, v, cu_q, cu_k, causal=True)
    np.testing.assert_allclose(y.astype(float), y_ref, atol=1e-15)


@pytest.mark.parametrize("page_size", [1, 3, 4, 16])
@pytest.mark.parametrize("n_new", [0, 2])
def test_paged_cache_equals_the_contiguous_cache(page_size, n_new):
    rng = np.random.default_rng(page_size * 7 + n_new)
    batch, n_q, heads, heads_kv, d = 3, 2, 4, 2, 3
    cached = np.array([5, 0, 9])
    width = -(-(cached.max() + n_new) // page_size) + 1
    num_pages = batch * width + 2
    pages = rng.permutation(num_pages)[: batch * width].reshape(batch, width)
    k_cache = rng.normal(size=(num_pages, page_size, heads_kv, d))
    v_cache = rng.normal(size=(num_pages, page_size, heads_kv, 2))
    q = rng.normal(size=(batch, n_q, heads, d))
    k_new = rng.normal(size=(batch, n_new, heads_kv, d)) if n_new else None
    v_new = rng.normal(size=(batch, n_new, heads_kv, 2)) if n_new else None
    y, stats = exactattn.paged_attention(
        q, k_cache, v_cache, pages, cached, k_new, v_new, causal=True, return_stats=True
    )
    for b in range(batch):
        keys = spec.paged_sequence(k_cache, pages[b], cached[b]).reshape(-1, heads_kv, d)
        values = spec.paged_sequence(v_cache, pages[b], cached[b]).reshape(-1, heads_kv, 2)
        if n_new:
            keys, values = np.concatenate([keys, k_new[b]]), np.concatenate([values, v_new[b]])
        cu_q, cu_k = np.array([0, n_q]), np.array([0, len(keys)])
        y_ref, lse_ref = spec.varlen(q[b], keys, values, cu_q, cu_k, causal=True)
        np.testing.assert_allclose(y[b], y_ref, atol=1e-14)
        np.testing.assert_allclose(stats.lse[b], lse_ref, atol=1e-13)


def test_pages_shared_between_sequences_are_read_by_both():
    rng = np.random.default_rng(9)
    k_cache, v_cache = rng.normal(size=(4, 2, 1, 3)), rng.normal(size=(4, 2, 1, 2))
    table = np.array([[3, 1], [3, 0]])  # page 3 is both sequences' prefix
    q = rng.normal(size=(2, 1, 1, 3))
    y = exactattn.paged_attention(q, k_cache, v_cache, table, np.array([4, 3]))
    for b, length in enumerate((4, 3)):
        keys = spec.paged_sequence(k_cache, table[b], length)
        values = spec.paged_sequence(v_cache, table[b], length)
        y_ref, _ = spec.varlen(q[b], keys, values, np.array([0, 1]), np.array([0, length]))
        np.testing.assert_allclose(y[b], y_ref, atol=1e-15)


def test_contiguous_cache_with_batch_index():
    rng = np.random.default_rng(10)
    k_cache, v_cache = rng.normal(size=(5, 6, 2, 3)), rng.normal(size=(5, 6, 2, 3))
    q, rows = rng.normal(size=(2, 3, 2, 3)), np.array([4, 1])
    y = exactattn.paged_attention(
        q, k_cache, v_cache, None, np.array([6, 2]), cache_batch_idx=rows, causal=True
    )
    for b, length in enumerate((6, 2)):
        y_ref, _ = spec.varlen(
            q[b],
            k_cache[rows[b], :length],
            v_cache[rows[b], :length],
            np.array([0, 3]),
            np.array([0, length]),
            causal=True,
        )
        np.testing.assert_allclose(y[b], y_ref, atol=1e-15)
