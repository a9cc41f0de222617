"""Paged KV caches: a cache is a gather, then per-sequence attention over a packed batch.

flash-attn's ``flash_attn_with_kvcache`` (and FlashInfer, Flex's ``PagedAttention``) keep
the keys of sequence ``b`` in pages of ``P`` positions: key ``t`` of ``b`` lives at row
``t mod P`` of page ``block_table[b, ⌊t/P⌋]``, for ``t < cache_seqlens[b]``. New keys
``k_new (B, n_new, H_kv, d)`` are appended after them (positions ``cache_seqlens[b] + r``).
With a left padding ``λ_b = cache_leftpad[b]`` (flash-attn's) the sequence's keys start at
position ``λ_b``. A contiguous cache ``(B_cache, n_cache, H_kv, d)`` is the special case of
one page of size ``n_cache`` per sequence, page ``cache_batch_idx[b]`` (default ``b``).

So the keys of sequence ``b`` are one gather, ``K_b = source[index_b]`` with ``source`` the
cache's rows followed by the new keys, and the queries ``(B, n_q, H, d)`` attend to them
as a packed batch (:func:`exactattn.layouts.varlen.varlen_attention`), causal and windows
aligned bottom-right to the sequence's length ``L_b = cache_seqlens[b] + n_new − λ_b`` as
flash-attn aligns them (the key at position ``λ_b + j'`` is local key ``j'``). The gather is
written once for every number system; on torch it is differentiable, so gradients reach the
cache and the new keys.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import api
from . import varlen


@dataclass(frozen=True)
class PagedLayout:
    """Where each key of each sequence is read: rows of the cache, or of the new keys.

    ``index`` (Σ_b L_b,) indexes ``source = [cache rows (N·P); new rows (B·n_new)]``;
    ``cu_k`` are the packed key offsets; ``written`` the cache rows the new keys go to.
    """

    index: np.ndarray
    cu_k: np.ndarray
    written: np.ndarray


def _lengths(cache_seqlens: Any, batch: int) -> np.ndarray:
    if isinstance(cache_seqlens, (int, np.integer)) and not isinstance(cache_seqlens, bool):
        return np.full(batch, int(cache_seqlens), dtype=np.int64)
    lengths = varlen.host_integers("cache_seqlens", cache_seqlens)
    if lengths.shape != (batch,):
        raise ValueError(
            f"cache_seqlens has shape {lengths.shape}; give one length per sequence, ({batch},)"
        )
    if (lengths < 0).any():
        raise ValueError(f"cache_seqlens must be >= 0; got {lengths.tolist()}")
    return lengths


def cache_lengths(k_cache: Any, block_table: Any, cache_seqlens: Any, batch: int) -> np.ndarray:
    """``cache_seqlens`` as ``(B,)`` int64, checked: the keys each sequence holds (positions
    ``0 ≤ t < cache_seqlens[b]``); default, a contiguous cache's whole length."""
    if cache_seqlens is None and block_table is not None:
        raise ValueError("a paged cache needs cache_seqlens: how many keys each sequence holds")
    return _lengths(k_cache.shape[1] if cache_seqlens is None else cache_seqlens, batch)


def _starts(cache_leftpad: Any, lengths: np.ndarray) -> np.ndarray:
    """``λ_b``, checked: ``0 ≤ cache_leftpad[b] ≤ cache_seqlens[b]`` (default 0)."""
    if cache_leftpad is None:
        return np.zeros_like(lengths)
    starts = varlen.host_integers("cache_leftpad", cache_leftpad)
    if starts.shape != lengths.shape:
        raise ValueError(
            f"cache_leftpad has shape {starts.shape}; give one start per sequence, {lengths.shape}"
        )
    bad = (starts < 0) | (starts > lengths)
    if bad.any():
        b = int(np.argmax(bad))
        raise ValueError(
            f"cache_leftpad[{b}] = {int(starts[b])} is outside 0..cache_seqlens[{b}] = "
            f"{int(lengths[b])}: a sequence's cache runs from cache_leftpad to cache_seqlens"
        )
    return starts


def cache_row(page: Any, t: Any, page_size: Any) -> Any:
    """The row of the flattened cache ``(N·P, …)`` holding key ``t`` on ``page``:
    ``page·P + t mod P``."""
    return page * page_size + t % page_size


def new_row(num_pages: Any, page_size: Any, b: Any, n_new: Any, t: Any, length: Any) -> Any:
    """The row of ``source`` holding position ``t ≥ length`` of sequence ``b``: new key
    ``t − length`` of ``b``, after the ``N·P`` cache rows."""
    return num_pages * page_size + b * n_new + (t - length)


def paged_layout(
    block_table: np.ndarray, num_pages: int, page_size: int, lengths: np.ndarray, n_new: int,
    starts: np.ndarray | None = None,
) -> PagedLayout:  # fmt: skip
    """The gather of a paged cache, with the checks that make it well defined: sequence ``b``
    reads positions ``starts[b] ≤ t < lengths[b] + n_new`` (``starts`` default 0)."""
    starts = np.zeros_like(lengths) if starts is None else starts
    batch, width = block_table.shape
    totals = lengths + n_new
    capacity = width * page_size
    if (totals > capacity).any():
        b = int(np.argmax(totals > capacity))
        raise ValueError(
            f"sequence {b} needs {int(totals[b])} positions (cache_seqlens {int(lengths[b])} + "
            f"{n_new} new) but its block_table row holds {width} pages of {page_size} = "
            f"{capacity}; give it more pages"
        )
    index, written, readers = [], [], {}
    for b in range(batch):
        t = np.arange(int(starts[b]), int(totals[b]))
        pages = block_table[b, t // page_size]
        bad = (pages < 0) | (pages >= num_pages)
        if bad.any():
            slot = int(t[np.argmax(bad)] // page_size)
            raise ValueError(
                f"block_table[{b}, {slot}] = {int(block_table[b, slot])} is not a page of the "
                f"cache (it has {num_pages} pages: 0..{num_pages - 1})"
            )
        rows = cache_row(pages, t, page_size)
        for position, row in zip(t.tolist(), rows.tolist()):
            readers.setdefault(row, []).append((b, position))
        new = t >= lengths[b]
        written.append(rows[new])
        index.append(np.where(new, new_row(num_pages, page_size, b, n_new, t, lengths[b]), rows))
    written = np.concatenate(written)
    for row in written.tolist():
        if len(readers[row]) > 1:
            raise ValueError(
                f"a new key would be written to cache row {row} (page {row // page_size}), "
                f"which is read as (sequence, position) {readers[row]}; a page shared between "
                "sequences (or listed twice) cannot be appended to: give each sequence its own "
                "last page"
            )
    cu_k = np.concatenate([[0], np.cumsum(totals - starts)]).astype(np.int64)
    return PagedLayout(np.concatenate(index).astype(np.int64), cu_k, written.astype(np.int64))


def _concatenate(a: Any, b: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        return torch.cat([a, b])
    return np.concatenate([a, b])


def gather(flat: Any, index: np.ndarray) -> Any:
    """``flat[index]`` along the first axis (a torch index for tensors: differentiable)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(flat, torch.Tensor):
        return flat[torch.as_tensor(index, device=flat.device)]
    return flat[index]


def _check_cache(name: str, cache: Any) -> None:
    if getattr(cache, "ndim", None) != 4:
        raise ValueError(
            f"{name} must be (num_pages, page_size, heads_kv, dim) (or (batch, seqlen, heads_kv, "
            f"dim) without block_table); got shape {tuple(getattr(cache, 'shape', ()))}"
        )


def cache_table(
    k_cache: Any, batch: int, block_table: Any, cache_batch_idx: Any
) -> tuple[np.ndarray, int]:
    """``(block_table, page_size)``; a contiguous cache is one page per sequence."""
    if block_table is not None:
        if cache_batch_idx is not None:
            raise ValueError(
                "cache_batch_idx applies to a contiguous cache; with block_table "
                "give each sequence's pages in its row instead"
            )
        table = varlen.host_integers("block_table", block_table)
        if table.ndim != 2 or table.shape[0] != batch:
            raise ValueError(
                f"block_table has shape {table.shape}; give (batch, pages per sequence) = "
                f"({batch}, ·)"
            )
        return table, int(k_cache.shape[1])
    if cache_batch_idx is None:
        if k_cache.shape[0] < batch:
            raise ValueError(
                f"k_cache holds {k_cache.shape[0]} sequences for a batch of {batch}; give "
                "cache_batch_idx to choose them"
            )
        rows = np.arange(batch)
    else:
        rows = varlen.host_integers("cache_batch_idx", cache_batch_idx)
        if rows.shape != (batch,):
            raise ValueError(f"cache_batch_idx has shape {rows.shape}; give ({batch},)")
        bad = (rows < 0) | (rows >= k_cache.shape[0])
        if bad.any():
            b = int(np.argmax(bad))
            raise ValueError(
                f"cache_batch_idx[{b}] = {int(rows[b])} is not a row of k_cache (it has "
                f"{k_cache.shape[0]})"
            )
    return rows[:, None], int(k_cache.shape[1])


def paged_keys(
    k_cache: Any, v_cache: Any, block_table: Any, cache_seqlens: Any, k: Any, v: Any,
    batch: int, cache_batch_idx: Any = None, cache_leftpad: Any = None,
) -> tuple[Any, Any, PagedLayout]:  # fmt: skip
    """The packed keys and values ``(Σ_b L_b, H_kv, ·)`` of every sequence, and the layout
    (``cache_leftpad``: each sequence's first position ``λ_b``, default 0)."""
    _check_cache("k_cache", k_cache)
    _check_cache("v_cache", v_cache)
    if (k is None) != (v is None):
        raise ValueError("give both k and v (the new keys and their values), or neither")
    table, page_size = cache_table(k_cache, batch, block_table, cache_batch_idx)
    lengths = cache_lengths(k_cache, block_table, cache_seqlens, batch)
    starts = _starts(cache_leftpad, lengths)
    n_new = 0 if k is None else int(k.shape[1])
    if k is not None and (k.ndim != 4 or k.shape[0] != batch):
        raise ValueError(
            f"k must be (batch, n_new, heads_kv, dim) with batch {batch}; got {tuple(k.shape)}"
        )
    layout = paged_layout(table, int(k_cache.shape[0]), page_size, lengths, n_new, starts)
    packed = []
    for cache, new in ((k_cache, k), (v_cache, v)):
        flat = cache.reshape((-1, *cache.shape[2:]))
        if new is not None:
            flat = _concatenate(flat, new.reshape((-1, *new.shape[2:])))
        packed.append(gather(flat, layout.index))
    return packed[0], packed[1], layout


def paged_attention(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_table: Any = None,
    cache_seqlens: Any = None,
    k: Any = None,
    v: Any = None,
    *,
    cache_batch_idx: Any = None,
    return_stats: bool = False,
    **keywords: Any,
) -> Any:
    """Attention of ``q (B, n_q, H, d)`` to each sequence's cached keys (and new ones).

    ``k_cache``, ``v_cache``: ``(num_pages, page_size, H_kv, ·)`` with ``block_table
    (B, pages per sequence)`` (pages of any size, shared between sequences as long as none
    is appended to), or a contiguous ``(B_cache, n_cache, H_kv, ·)`` read at rows
    ``cache_batch_idx`` (default ``0..B−1``). ``cache_seqlens``: ``(B,)`` or an int, the
    keys already cached (default: the whole contiguous cache). ``k``, ``v``
    ``(B, n_new, H_kv, ·)``: new keys appended after them (this function does not write the
    cache; :func:`exactattn.layouts.flash_attn.flash_attn_with_kvcache` does, as flash-attn does).
    Keywords: :func:`exactattn.layouts.varlen.varlen_attention`'s (``causal``, ``window``,
    ``alibi_slopes``, ``softcap``, ``sinks``, ``scale``, ...), aligned bottom-right to each
    sequence's ``L_b = cache_seqlens[b] + n_new``. Returns ``y (B, n_q, H, v)``, or
    ``(y, stats)`` with ``stats.lse`` of shape ``(B, H, n_q)``.
    """
    if getattr(q, "ndim", None) != 4:
        raise ValueError(
            f"q must be (batch, n_q, heads, dim); got {tuple(getattr(q, 'shape', ()))}"
        )
    batch, n_q = int(q.shape[0]), int(q.shape[1])
    keys, values, layout = paged_keys(
        k_cache, v_cache, block_table, cache_seqlens, k, v, batch, cache_batch_idx
    )
    cu_q = np.arange(batch + 1, dtype=np.int64) * n_q
    packed_q = q.reshape((batch * n_q, *q.shape[2:]))
    y, stats = varlen.varlen_attention(
        packed_q, keys, values, cu_q, layout.cu_k, return_stats=True, **keywords
    )
    y = y.reshape((batch, n_q, *y.shape[1:]))
    stats = api.Stats(*(_per_sequence(x, batch, n_q) for x in (stats.m, stats.l, stats.lse)))
    return (y, stats) if return_stats else y


def _per_sequence(x: Any, batch: int, n_q: int) -> Any:
    """``(H, B·n_q)`` → ``(B, H, n_q)``."""
    return x.reshape((x.shape[0], batch, n_q)).swapaxes(0, 1)
