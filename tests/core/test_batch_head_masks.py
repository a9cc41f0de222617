"""Masks that see the batch element and the head, compositions, and grouped-query attention.

Expected values come from :mod:`.spec` (inequalities and the textbook formula); the library
side runs at sizes with several key blocks, split query rows, n_q ≠ n_k and real batches.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import exactattn as ea
from exactattn.backends import NumpyContext
from exactattn.core import algorithm, masks
from exactattn.core.masks import Geometry, TileKind

from . import definition as spec

ALIGN = st.sampled_from(masks.ALIGNMENTS)
SIDE = st.one_of(st.none(), st.integers(0, 5))


@st.composite
def leaf(draw, n_q, n_k, batch):
    """(library mask, spec allowed (*batch, n_q, n_k)) for one structured kind."""
    kind = draw(st.sampled_from(["causal", "window", "padding"]))
    if kind == "causal":
        alignment = draw(ALIGN)
        return masks.causal(alignment), spec.causal(n_q, n_k, alignment)
    if kind == "window":
        left, right, alignment = draw(SIDE), draw(SIDE), draw(ALIGN)
        return masks.sliding_window(left, right, alignment), spec.window(
            n_q, n_k, left, right, alignment
        )
    lengths = np.array(draw(st.lists(st.integers(0, n_k), min_size=batch[0], max_size=batch[0])))
    _, j = spec.grid(n_q, n_k)
    return masks.key_padding(lengths), j < lengths[:, None, None, None]


@st.composite
def composition(draw, n_q, n_k, batch, depth=2):
    """And/Or trees up to ``depth`` over the leaves, with their spec."""
    if depth == 0 or draw(st.booleans()):
        return draw(leaf(n_q, n_k, batch))
    parts = [draw(composition(n_q, n_k, batch, depth - 1)) for _ in range(draw(st.integers(2, 3)))]
    if draw(st.booleans()):
        mask, want = (
            masks.and_masks(*(m for m, _ in parts)),
            np.logical_and.reduce(np.broadcast_arrays(*(a for _, a in parts))),
        )
    else:
        mask, want = (
            masks.or_masks(*(m for m, _ in parts)),
            np.logical_or.reduce(np.broadcast_arrays(*(a for _, a in parts))),
        )
    return mask, want


@st.composite
def composed_case(draw):
    n_q, n_k = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    batch = (2, 1)
    mask, allowed = draw(composition(n_q, n_k, batch))
    return n_q, n_k, batch, mask, np.broadcast_to(allowed, (*batch, n_q, n_k))


@given(case=composed_case(), b=st.integers(1, 10), row_block=st.sampled_from([None, 1, 2, 3]))
def test_compositions_run_and_equal_the_spec(case, b, row_block):
    n_q, n_k, batch, mask, allowed = case
    geometry = Geometry(n_q, n_k, batch)
    for start in range(0, n_k, b):
        cols = range(start, min(start + b, n_k))
        span = mask.row_span(cols, geometry)
        assert 0 <= span.start <= span.stop <= n_q, f"row span {span} outside [0, {n_q})"
        outside = np.ones(n_q, dtype=bool)
        outside[span.start : span.stop] = False
        assert not allowed[..., outside, cols.start : cols.stop].any(), "row span too narrow"
        if len(span):
            kind = mask.classify(span, cols, geometry)
            tile = allowed[..., span.start : span.stop, cols.start : cols.stop]
            assert kind is not TileKind.EMPTY or not tile.any()
            assert kind is not TileKind.FULL or tile.all()
    rng = np.random.default_rng(n_q * 31 + n_k)
    q = rng.standard_normal((*batch, n_q, 3))
    k, v = rng.standard_normal((2, *batch, n_k, 3))
    ctx = NumpyContext("float64")
    y, _ = algorithm.forward(ctx, q, k, v, scale=0.5, block_size=b, mask=mask, row_block=row_block)
    y_s = spec.attention(q, k, v, 0.5, allowed)
    np.testing.assert_allclose(y, y_s, atol=1e-13)


@pytest.mark.parametrize("backend", ["float64", "sympy"])
def test_or_of_causal_and_window_with_more_keys_than_queries(backend):
    """The or_masks row-span bug: a part's empty span past n_q widened the union."""
    rng = np.random.default_rng(0)
    q, k, v = rng.integers(-2, 3, (1, 2)), rng.integers(-2, 3, (4, 2)), rng.integers(-2, 3, (4, 2))
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    mask = masks.causal() | masks.sliding_window(None, 2)
    y = ea.attention(q, k, v, block_size=2, mask=mask, backend=backend)
    allowed = spec.causal(1, 4) | spec.window(1, 4, None, 2)
    y_s = spec.attention(q, k, v, 2**-0.5, allowed)
    np.testing.assert_allclose(np.asarray(y, dtype=np.float64), y_s, atol=1e-13)


def _document_ids(batch: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.sort(rng.integers(0, 3, (batch, n)), axis=-1)


@pytest.mark.parametrize("block_size", [2, 16])
def test_mask_mod_sees_batch_and_head(block_size):
    """Document masking per batch element, causal on even heads only."""
    B, H, n = 2, 4, 9
    doc = _document_ids(B, n, 1)

    def mask_mod(b, h, i, j):
        return (doc[b, i] == doc[b, j]) & ((h % 2 == 1) | (j <= i))

    rng = np.random.default_rng(2)
    q, k, v, g = (rng.standard_normal((B, H, n, 3)) for _ in range(4))
    y, stats = ea.attention(q, k, v, mask=mask_mod, block_size=block_size, return_stats=True)
    dq, dk, dv = ea.attention_backward(q, k, v, y, stats, g, mask=mask_mod, block_size=block_size)
    i, j = spec.grid(n, n)
    same_doc = doc[:, None, :, None] == doc[:, None, None, :]
    even = (np.arange(H) % 2 == 0)[None, :, None, None]
    allowed = same_doc & (~even | (j <= i))
    y_s = spec.attention(q, k, v, 3**-0.5, allowed)
    dq_s, dk_s, dv_s = spec.gradients(q, k, v, 3**-0.5, g, allowed)
    for got, want in ((y, y_s), (dq, dq_s), (dk, dk_s), (dv, dv_s)):
        np.testing.assert_allclose(got, want, atol=1e-13)


def test_a_four_argument_callable_is_a_mask_mod():
    assert isinstance(masks.as_mask(lambda b, h, i, j: j <= i), masks.MaskMod)
    assert isinstance(masks.as_mask(lambda i, j: j <= i), masks.Predicate)


def test_mask_mod_errors_name_the_tile():
    q = np.zeros((2, 5, 3))
    with pytest.raises(TypeError, match="mask_mod must return a boolean"):
        ea.attention(q, q, q, mask=lambda b, h, i, j: i - j)
    with pytest.raises(ValueError, match=r"mask_mod returned shape \(7,\)"):
        ea.attention(q, q, q, mask=lambda b, h, i, j: np.ones(7, dtype=bool))


# --- grouped-query attention ---------------------------------------------------------------
B, H, H_KV, N_Q, N_K, D = 2, 6, 2, 5, 7, 4
G = H // H_KV


def _gqa_inputs(seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((B, H, N_Q, D)),
        rng.standard_normal((B, H_KV, N_K, D)),
        rng.standard_normal((B, H_KV, N_K, 3)),
        rng.standard_normal((B, H, N_Q, 3)),
    )


def _repeat(x):
    """Key/value head h_kv serves query heads h_kv·g .. h_kv·g + g − 1."""
    return np.repeat(x, G, axis=1)


def _gqa_masks():
    lengths = np.array([7, 3])
    per_head = np.random.default_rng(3).random((H, N_Q, N_K)) < 0.6
    per_head[..., 0] = True
    return {
        "none": (None, None),
        "causal-bottom-right": (
            masks.causal("bottom-right"),
            spec.causal(N_Q, N_K, "bottom-right"),
        ),
        "padding": (
            masks.key_padding(lengths),
            spec.grid(N_Q, N_K)[1] < lengths[:, None, None, None],
        ),
        "dense-per-head": (per_head, per_head),
        "mask-mod-per-head": (
            lambda b, h, i, j: j <= i + h,
            spec.grid(N_Q, N_K)[1] <= spec.grid(N_Q, N_K)[0] + np.arange(H)[:, None, None],
        ),
    }


@pytest.mark.parametrize("name", sorted(_gqa_masks()))
@pytest.mark.parametrize("block_size", [3, 64])
def test_gqa_equals_attention_with_repeated_key_value_heads(name, block_size):
    q, k, v, g = _gqa_inputs()
    mask, allowed = _gqa_masks()[name]
    kw = dict(mask=mask, block_size=block_size, enable_gqa=True)
    y, stats = ea.attention(q, k, v, return_stats=True, **kw)
    dq, dk, dv = ea.attention_backward(q, k, v, y, stats, g, **kw)
    kr, vr, c = _repeat(k), _repeat(v), D**-0.5
    y_s, lse_s = spec.attention(q, kr, vr, c, allowed), spec.log_sum_exp(q, kr, c, allowed)
    dq_s, dk_s, dv_s = spec.gradients(q, kr, vr, c, g, allowed)
    np.testing.assert_allclose(y, y_s, atol=1e-13)
    np.testing.assert_allclose(stats.lse, lse_s, atol=1e-13)
    np.testing.assert_allclose(dq, dq_s, atol=1e-13)
    fold = (B, H_KV, G, N_K, -1)
    np.testing.assert_allclose(dk, dk_s.reshape(fold).sum(axis=2), atol=1e-13)
    np.testing.assert_allclose(dv, dv_s.reshape(fold).sum(axis=2), atol=1e-13)


def test_gqa_dropout_draws_the_bits_of_the_logical_head():
    """The keep-bits depend on (b, h), so GQA equals the run on repeated heads bit for bit."""
    q, k, v, _ = _gqa_inputs(4)
    kw = dict(dropout_p=0.3, seed=11, block_size=3)
    y = ea.attention(q, k, v, enable_gqa=True, **kw)
    y_rep = ea.attention(q, _repeat(k), _repeat(v), **kw)
    np.testing.assert_array_equal(y, y_rep)


def test_gqa_with_split_rows_and_a_bias_gradient():
    q, k, v, g = _gqa_inputs(5)
    bias = np.random.default_rng(6).standard_normal((H, N_Q, N_K))
    ctx = NumpyContext("float64")
    from exactattn.core import scores

    kw = dict(scale=0.5, block_size=2, score_mod=scores.bias(bias), enable_gqa=True, row_block=2)
    y, st = algorithm.forward(ctx, q, k, v, **kw)
    grads = {"bias": np.zeros(bias.shape)}
    algorithm.backward(ctx, q, k, v, y, st.m, st.l, g, mod_grads=grads, **kw)
    y_s = spec.attention(q, _repeat(k), _repeat(v), 0.5, bias=bias)
    ds_s = spec.score_gradient(q, _repeat(k), _repeat(v), 0.5, g, bias=bias)
    np.testing.assert_allclose(y, y_s, atol=1e-13)
    np.testing.assert_allclose(grads["bias"], ds_s.sum(axis=0), atol=1e-13)


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        (((2, 6, 5, 4), (2, 4, 7, 4), (2, 4, 7, 3)), "H_kv divides"),
        (((6, 5, 4)[1:], (2, 7, 4), (2, 7, 3)), "head axis"),
        (((2, 6, 5, 4), (2, 2, 7, 4), (2, 3, 7, 3)), "H_kv heads"),
    ],
)
def test_gqa_shape_errors_quote_the_shapes(shapes, match):
    q, k, v = (np.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        ea.attention(q, k, v, enable_gqa=True)


def test_create_mask_materialises_every_kind_on_the_tile_layout():
    geometry = Geometry(N_Q, N_K, (B, H), G)
    allowed = masks.create_mask(lambda b, h, i, j: j <= i + h, geometry)
    assert allowed.shape == (B, H_KV, G, N_Q, N_K)
    i, j = spec.grid(N_Q, N_K)
    want = j <= i + np.arange(H)[:, None, None]
    np.testing.assert_array_equal(
        allowed.reshape(B, H, N_Q, N_K), np.broadcast_to(want, (B, H, N_Q, N_K))
    )
