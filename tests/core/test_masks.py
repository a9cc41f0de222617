"""Masks: block classification agrees with the predicate, and tiles are really skipped."""

from __future__ import annotations

import tracemalloc
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import exactattn as ea
from exactattn.core import algorithm, masks
from exactattn.core.masks import Geometry, TileKind

from .helpers import dense_of

STRUCTURED = st.one_of(
    st.builds(masks.causal, st.sampled_from(masks.ALIGNMENTS)),
    st.builds(
        masks.sliding_window,
        st.one_of(st.none(), st.integers(0, 6)),
        st.one_of(st.none(), st.integers(0, 6)),
        st.sampled_from(masks.ALIGNMENTS),
    ),
)


@given(
    mask=STRUCTURED,
    n_q=st.integers(1, 12),
    n_k=st.integers(1, 12),
    b=st.integers(1, 5),
    use_padding=st.booleans(),
    lengths=st.lists(st.integers(0, 12), min_size=2, max_size=2),
)
def test_classify_and_row_span_agree_with_the_predicate(mask, n_q, n_k, b, use_padding, lengths):
    if use_padding:
        mask = masks.and_masks(mask, masks.key_padding(lengths))
    batch = (2,)
    geometry = Geometry(n_q, n_k, batch)
    allowed = dense_of(mask, batch, n_q, n_k)
    for start in range(0, n_k, b):
        cols = range(start, min(start + b, n_k))
        span = mask.row_span(cols, geometry)
        outside = np.ones(n_q, dtype=bool)
        outside[span.start : span.stop] = False
        assert not allowed[..., outside, cols.start : cols.stop].any(), "row_span too narrow"
        if len(span) == 0:
            continue
        tile = allowed[..., span.start : span.stop, cols.start : cols.stop]
        kind = mask.classify(span, cols, geometry)
        if kind is TileKind.EMPTY:
            assert not tile.any()
        if kind is TileKind.FULL:
            assert tile.all()


def test_causal_mask_at_n_equals_b_squared_skips_the_upper_blocks():
    """A causal run computes scores only for the T(T+1)/2 tiles on or below the diagonal."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 4))
    calls = []
    real = algorithm.tile_scores

    def counting(ctx, q, k, scale, allowed, mod=None):
        calls.append((q.shape[-2], k.shape[-2], allowed is None))
        return real(ctx, q, k, scale, allowed, mod)

    with mock.patch.object(algorithm, "tile_scores", counting):
        ea.self_attention(x, block_size=8, mask=masks.causal())
    assert len(calls) == 4  # one key block each, rows narrowed to i >= block start
    assert [rows for rows, _, _ in calls] == [32, 24, 16, 8]


def test_a_block_no_row_may_see_is_never_scored():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((6, 2)) for _ in range(3))
    allowed = np.ones((6, 6), dtype=bool)
    allowed[:, 2:4] = False  # the middle block of size 2
    calls = []
    real = algorithm.tile_scores

    def counting(ctx, q_, k_, scale, allowed_tile, mod=None):
        calls.append(k_.shape[-2])
        return real(ctx, q_, k_, scale, allowed_tile, mod)

    with mock.patch.object(algorithm, "tile_scores", counting):
        ea.attention(q, k, v, block_size=2, mask=allowed)
    assert len(calls) == 2


@pytest.mark.parametrize("which", ["forward", "backward"])
def test_no_n_q_by_n_k_array_is_allocated(which):
    """Peak traced memory stays far below one (n_q, n_k) float64 array."""
    n, d, b = 2048, 16, 64
    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((n, d)) for _ in range(4))
    y, stats = ea.attention(q, k, v, block_size=b, return_stats=True)
    tracemalloc.start()
    if which == "forward":
        ea.attention(q, k, v, block_size=b)
    else:
        ea.attention_backward(q, k, v, y, stats, g, block_size=b)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < n * n * 8 / 4, f"peak {peak} bytes"
    # Tiles of n x b, a few at a time, plus O(n d) state.
    assert peak < 12 * n * b * 8 + 16 * n * d * 8
