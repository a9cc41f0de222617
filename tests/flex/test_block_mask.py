"""torch BlockMasks as exactattn masks: structure from the BlockMask, checked against its
mask_mod; sizes and block sizes checked; the structure's classes tested against the
predicate itself on arbitrary tiles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.optional import requires

torch = requires("torch")
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

import exactattn as ea
import exactattn.torch as exactattn_torch
from exactattn.core import masks
from exactattn.core.masks import Geometry, TileKind
from exactattn.torch import flex_attention

from . import spec


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= 3)


DOC = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3, 3, 4, 4, 5, 5, 5, 5]] * 2)
DOC[1, :7] = 9


def document(b, h, q_idx, kv_idx):
    return DOC[b, q_idx] == DOC[b, kv_idx]


def per_head(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx + 2 * h


MODS = {"causal": causal, "window": window, "document": document, "per-head": per_head}


@st.composite
def structured(draw):
    name = draw(st.sampled_from(sorted(MODS)))
    n_q, n_k = draw(st.integers(1, 20)), draw(st.integers(1, 20))
    block = (draw(st.integers(1, 8)), draw(st.integers(1, 8)))
    full = draw(st.booleans())
    bm = create_block_mask(
        MODS[name], 2, 3, n_q, n_k, device="cpu", BLOCK_SIZE=block, separate_full_blocks=full
    )
    rows = sorted(draw(st.lists(st.integers(0, n_q), min_size=2, max_size=2, unique=True)))
    start = draw(st.integers(0, n_k - 1))
    cols = range(start, draw(st.integers(start + 1, n_k)))
    return MODS[name], bm, Geometry(n_q, n_k, (2, 3)), range(*rows), cols


@given(case=structured())
def test_structure_classes_and_row_spans_hold_for_the_mask_mod(case):
    mod, bm, geometry, rows, cols = case
    mask = masks.as_mask(bm)
    mask.validate(geometry)
    b, h, i, j = spec.grid(2, 3, geometry.n_q, geometry.n_k)
    allowed = np.broadcast_to(
        mod(*(torch.from_numpy(x) for x in (b, h, i, j))).numpy(),
        (2, 3, geometry.n_q, geometry.n_k),
    )
    tile = allowed[..., rows.start : rows.stop, cols.start : cols.stop]
    kind = mask.classify(rows, cols, geometry)
    assert kind is not TileKind.EMPTY or not tile.any(), "EMPTY tile with an allowed pair"
    assert kind is not TileKind.FULL or tile.all(), "FULL tile with a masked pair"
    span = mask.row_span(cols, geometry)
    reached = np.flatnonzero(allowed[..., cols.start : cols.stop].any(axis=(0, 1, 3)))
    assert all(r in span for r in reached), f"row span {span} misses rows {reached}"


def test_block_structure_skips_tiles_and_skips_the_predicate():
    """Causal over 37 keys in 8×8 blocks: tiles on the blocks are EMPTY above the diagonal,
    FULL below it, PARTIAL on it — except the last block row, which create_block_mask pads
    to 8 rows and so lists as PARTIAL; without separate full blocks nothing is FULL."""
    geometry = Geometry(37, 37, (1, 1))
    for full, want in ((True, {TileKind.EMPTY: 10, TileKind.FULL: 6, TileKind.PARTIAL: 9}),
                       (False, {TileKind.EMPTY: 10, TileKind.PARTIAL: 15})):  # fmt: skip
        bm = create_block_mask(
            causal, 1, 1, 37, 37, device="cpu", BLOCK_SIZE=8, separate_full_blocks=full
        )
        mask = masks.as_mask(bm)
        kinds = [
            mask.classify(range(r, min(r + 8, 37)), range(c, min(c + 8, 37)), geometry)
            for r in range(0, 37, 8)
            for c in range(0, 37, 8)
        ]
        assert {kind: kinds.count(kind) for kind in set(kinds)} == want


def _qkv(batch, heads, n_q, n_k, heads_kv=None, seed=0):
    rng = np.random.default_rng(seed)
    heads_kv = heads_kv or heads
    return (
        torch.from_numpy(rng.standard_normal((batch, heads, n_q, 4))),
        torch.from_numpy(rng.standard_normal((batch, heads_kv, n_k, 4))),
        torch.from_numpy(rng.standard_normal((batch, heads_kv, n_k, 3))),
    )


def test_cross_attention_and_gqa_with_a_per_head_block_mask():
    """n_q ≠ n_k, H = 4 query heads on 2 key/value heads, a mask that depends on the head;
    the BlockMask is taken by flex_attention, exactattn.attention (NumPy, mpmath) and
    exactattn.torch.attention alike."""
    q, k, v = _qkv(2, 4, 13, 20, heads_kv=2)
    bm = create_block_mask(per_head, 2, 4, 13, 20, device="cpu", BLOCK_SIZE=(4, 8))
    got = flex_attention(q, k, v, block_mask=bm, enable_gqa=True)
    _, h, i, j = spec.grid(2, 4, 13, 20)
    want, _ = spec.naive(q, k, v, np.broadcast_to(j <= i + 2 * h, (2, 4, 13, 20)))
    torch.testing.assert_close(got, want, atol=1e-13, rtol=0)
    y = ea.attention(*(x.numpy() for x in (q, k, v)), mask=bm, enable_gqa=True, block_size=3)
    np.testing.assert_allclose(y, want.numpy(), atol=1e-13, rtol=0)
    y = exactattn_torch.attention(q, k, v, mask=bm, enable_gqa=True, block_size=5)
    torch.testing.assert_close(y, want, atol=1e-13, rtol=0)
    y = ea.attention(*(x.numpy() for x in (q, k, v)), mask=bm, enable_gqa=True, block_size=8,
                     backend=ea.MpmathContext(80))  # fmt: skip
    np.testing.assert_allclose(np.asarray(y, dtype=float), want.numpy(), atol=1e-14, rtol=0)


def test_a_coarser_but_true_structure_is_accepted():
    """Every causal block listed as PARTIAL (none FULL, none skipped wrongly): same answer."""
    n, block = 20, 4
    rows = -(-n // block)
    num = torch.arange(1, rows + 1, dtype=torch.int32).reshape(1, 1, rows)
    indices = torch.arange(rows, dtype=torch.int32).expand(1, 1, rows, rows).contiguous()
    bm = BlockMask.from_kv_blocks(num, indices, BLOCK_SIZE=block, mask_mod=causal,
                                  seq_lengths=(n, n))  # fmt: skip
    q, k, v = _qkv(1, 1, n, n)
    want, _ = spec.naive(q, k, v, np.tril(np.ones((n, n), dtype=bool)))
    torch.testing.assert_close(flex_attention(q, k, v, block_mask=bm), want, atol=1e-13, rtol=0)


def test_the_no_op_block_mask_is_no_mask():
    from torch.nn.attention.flex_attention import _create_empty_block_mask

    q, k, _ = _qkv(1, 2, 5, 7)
    assert masks.as_mask(_create_empty_block_mask(q, k)) is None


def test_an_adjusted_block_mask_runs_at_its_new_lengths():
    bm = create_block_mask(causal, 1, 1, 32, 32, device="cpu", BLOCK_SIZE=8)._adjust(20, 20)
    q, k, v = _qkv(1, 1, 20, 20)
    want, _ = spec.naive(q, k, v, np.tril(np.ones((20, 20), dtype=bool)))
    torch.testing.assert_close(flex_attention(q, k, v, block_mask=bm), want, atol=1e-13, rtol=0)


# --- a BlockMask that cannot be used: an error, never a silent answer ----------------------------
def test_a_structure_claiming_full_where_the_mask_mod_masks_is_refused():
    bm = create_block_mask(causal, 1, 1, 20, 20, device="cpu", BLOCK_SIZE=4)
    bm.mask_mod = window  # narrower than the causal structure: FULL blocks are not full
    q, k, v = _qkv(1, 1, 20, 20)
    with pytest.raises(ValueError, match=r"structure disagrees .* window.* is FULL"):
        flex_attention(q, k, v, block_mask=bm)
    with pytest.raises(ValueError, match="structure disagrees"):
        ea.attention(*(x.numpy() for x in (q, k, v)), mask=bm)


def test_a_structure_skipping_blocks_the_mask_mod_allows_is_refused():
    bm = create_block_mask(window, 1, 1, 20, 20, device="cpu", BLOCK_SIZE=4)
    bm.mask_mod = causal  # wider than the window structure: skipped blocks have pairs
    q, k, v = _qkv(1, 1, 20, 20)
    with pytest.raises(ValueError, match=r"key block \d+\) of size \(4, 4\) is EMPTY"):
        flex_attention(q, k, v, block_mask=bm)


@pytest.mark.parametrize(
    "sizes, match",
    [
        ((1, 1, 24, 20), r"created for \(Q_LEN, KV_LEN\) = \(24, 20\).* n_q = 20, n_k = 20"),
        ((1, 1, 20, 16), r"created for \(Q_LEN, KV_LEN\) = \(20, 16\)"),
        ((3, 1, 20, 20), r"created for B = 3, H = 1, but the inputs have B = 2"),
        ((1, 4, 20, 20), r"created for B = 1, H = 4, but the inputs have B = 2 .* and H = 2"),
    ],
)
def test_a_block_mask_built_for_other_sizes_is_refused(sizes, match):
    bm = create_block_mask(causal, *sizes, device="cpu", BLOCK_SIZE=4)
    q, k, v = _qkv(2, 2, 20, 20)
    with pytest.raises(ValueError, match=match):
        flex_attention(q, k, v, block_mask=bm)
    with pytest.raises(ValueError, match=match):
        ea.attention(*(x.numpy() for x in (q, k, v)), mask=bm)


def test_a_block_size_that_does_not_match_the_lengths_is_refused():
    bm = create_block_mask(causal, 1, 1, 20, 20, device="cpu", BLOCK_SIZE=4)
    bm.BLOCK_SIZE = (8, 4)  # 5 query-block rows cannot cover 20 queries in blocks of 8
    with pytest.raises(ValueError, match=r"Q_LEN = 20 with Q_BLOCK_SIZE = 8 needs \(B, H, 3\)"):
        masks.as_mask(bm)


def test_key_block_indices_out_of_range_are_refused():
    num = torch.ones((1, 1, 2), dtype=torch.int32)
    indices = torch.tensor([[[[0], [5]]]], dtype=torch.int32)
    bm = BlockMask.from_kv_blocks(num, indices, BLOCK_SIZE=4, mask_mod=causal,
                                  seq_lengths=(8, 8), compute_q_blocks=False)  # fmt: skip
    with pytest.raises(ValueError, match=r"kv_indices name key blocks outside 0\.\.1"):
        masks.as_mask(bm)
