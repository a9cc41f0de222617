"""Variable-length packed batches: flash-attn's ``cu_seqlens`` layout, as a mask and an index map.

A packed batch holds ``S`` sequences one after another along the position axis: sequence
``s`` owns queries ``cu_q[s] ≤ i < cu_q[s+1]`` and keys ``cu_k[s] ≤ j < cu_k[s+1]``
(``cu_seqlens``: ``(S+1,)`` integers from 0, nondecreasing, ending at the packed length).
Per-sequence attention over the packed arrays is ordinary attention over the whole packed
length with the block-diagonal mask :class:`~exactattn.core.masks.PackedSequences` (causal and
windows aligned bottom-right within each sequence, as flash-attn does), so it is one call of
the tiled algorithm: tiles between two sequences are EMPTY and never computed. The layout
``(total, H, d)`` becomes the algorithm's ``(H, total, d)`` by swapping two axes; ALiBi reads
the same index maps (local positions, the sequence's slopes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import api
from ..core.masks import Geometry, PackedSequences, TileIndex
from ..core.scores import ScoreMod, TileMod


def host_integers(name: str, x: Any) -> np.ndarray:
    """A caller's integer vector (list, array, tensor on any device) as NumPy int64."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype == bool or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{name} must hold integers; got dtype {arr.dtype}")
    return arr.astype(np.int64)


def check_cu_seqlens(name: str, cu: Any, total: int, max_seqlen: Any = None) -> np.ndarray:
    """``cu_seqlens`` as int64 ``(S+1,)``: starts at 0, nondecreasing, ends at ``total``."""
    arr = host_integers(name, cu)
    if arr.ndim != 1 or arr.shape[0] < 2:
        raise ValueError(
            f"{name} must be a 1-D array of S+1 offsets (S >= 1 sequences); got shape {arr.shape}"
        )
    if arr[0] != 0:
        raise ValueError(f"{name} must start at 0; got {name}[0] = {int(arr[0])}")
    steps = np.diff(arr)
    if (steps < 0).any():
        s = int(np.argmax(steps < 0))
        raise ValueError(
            f"{name} must be nondecreasing; {name}[{s}] = {int(arr[s])} > "
            f"{name}[{s + 1}] = {int(arr[s + 1])}"
        )
    if arr[-1] != total:
        raise ValueError(
            f"{name} ends at {int(arr[-1])} but the packed inputs have {total} positions; the "
            f"last offset must be the packed length"
        )
    if max_seqlen is not None:
        longest = int(steps.max())
        if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, (int, np.integer)):
            raise TypeError(f"max_seqlen for {name} must be an integer; got {max_seqlen!r}")
        if max_seqlen < longest:
            s = int(np.argmax(steps))
            raise ValueError(
                f"max_seqlen {max_seqlen} is smaller than sequence {s} of {name}, which has "
                f"{longest} positions; pass max_seqlen >= {longest}"
            )
    return arr


def window_sides(causal: bool, window: Any) -> tuple[int | None, int | None]:
    """``(left, right)`` of the window (None: unbounded); causal caps ``right`` at 0."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {causal!r}")
    if not (isinstance(window, (tuple, list)) and len(window) == 2):
        raise TypeError(f"window must be a (left, right) pair of ints or None; got {window!r}")
    left, right = window
    for side, value in (("left", left), ("right", right)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0
        ):
            raise ValueError(f"window {side} must be a non-negative integer or None; got {value!r}")
    if causal:
        right = 0 if right is None else min(int(right), 0)
    return (None if left is None else int(left)), (None if right is None else int(right))


class PackedAlibi(ScoreMod):
    """ALiBi per sequence: ``s_ij − slope · |i' + o_s − j'|`` on local positions.

    ``slopes`` is ``(H,)`` or ``(S, H)`` (one row per sequence, flash-attn's
    ``(batch, nheads)``), read at the query's sequence ``query_seq[i]`` and head ``h``.
    """

    def __init__(self, slopes: Any, packed: PackedSequences):
        self.slopes, self.packed = slopes, packed

    def adopt(self, ctx: Any) -> PackedAlibi:
        return PackedAlibi(ctx.as_compute(self.slopes), self.packed.adopt(ctx))

    def validate(self, geometry: Geometry) -> None:
        heads, sequences = geometry.heads, len(self.packed.cu_q) - 1
        if tuple(self.slopes.shape) not in ((heads,), (sequences, heads)):
            raise ValueError(
                f"alibi_slopes has shape {tuple(self.slopes.shape)}; give ({heads},) or "
                f"({sequences}, {heads}) (one slope per head, optionally per sequence)"
            )

    def at(self, ctx: Any, index: TileIndex, geometry: Geometry) -> TileMod:
        query_seq, query_pos, _, key_pos = self.packed.maps
        h = index.h  # (*tile_batch, 1, 1) with the head last of the logical batch
        # per head: (*tile_batch, 1, 1); per sequence and head: (*tile_batch, r, 1)
        slope = self.slopes[h] if self.slopes.ndim == 1 else self.slopes[query_seq[index.i], h]
        distance = query_pos[index.i] - key_pos[index.j]
        return _AlibiTile(-slope * ctx.as_compute(abs(distance)))


class _AlibiTile(TileMod):
    def __init__(self, tile: Any):
        self.tile = tile

    def apply(self, s: Any) -> Any:
        return s + self.tile

    def pullback(self, gamma: Any, grads: dict[str, Any]) -> Any:
        return gamma


def packed_heads(name: str, x: Any) -> Any:
    """``(total, H, d)`` → the algorithm's ``(H, total, d)``: swap the first two axes."""
    if getattr(x, "ndim", None) != 3:
        raise ValueError(
            f"{name} must be packed as (total, heads, dim); got shape "
            f"{tuple(getattr(x, 'shape', ()))}"
        )
    return x.swapaxes(0, 1)


def packed_problem(
    q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
    max_seqlen_q: int | None = None, max_seqlen_k: int | None = None, *,
    causal: bool = False, window: tuple[int | None, int | None] = (None, None),
    alibi_slopes: Any = None, **keywords: Any,
) -> tuple[Any, Any, Any, dict[str, Any]]:  # fmt: skip
    """The packed call as one attention call: ``(q, k, v)`` as ``(H, total, ·)`` and the
    keywords of :func:`exactattn.attention` (the packed mask, ALiBi, GQA, empty rows)."""
    for name in ("mask", "bias", "enable_gqa", "key_range"):
        if name in keywords:
            raise TypeError(
                f"varlen attention takes no {name}= (the packed mask, ALiBi and grouped heads "
                "come from cu_seqlens, causal, window, alibi_slopes and the head counts)"
            )
    qh, kh, vh = packed_heads("q", q), packed_heads("k", k), packed_heads("v", v)
    cu_q = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q)
    cu_k = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k)
    if cu_q.shape != cu_k.shape:
        raise ValueError(
            f"cu_seqlens_q has {cu_q.shape[0] - 1} sequences but cu_seqlens_k "
            f"{cu_k.shape[0] - 1}; give both the same batch"
        )
    packed = PackedSequences(cu_q, cu_k, *window_sides(causal, window))
    keywords = {"empty_rows": "zero", **keywords, "mask": packed}
    if alibi_slopes is not None:
        keywords["bias"] = PackedAlibi(alibi_slopes, packed)
    keywords["enable_gqa"] = qh.shape[0] != kh.shape[0]
    return qh, kh, vh, keywords


def varlen_attention(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] = (None, None),
    alibi_slopes: Any = None,
    return_stats: bool = False,
    **keywords: Any,
) -> Any:
    """Attention within each sequence of a packed batch, flash-attn's varlen semantics.

    ``q (total_q, H, d)``, ``k (total_k, H_kv, d)``, ``v (total_k, H_kv, v)`` (``H_kv``
    divides ``H``: grouped-query attention); ``cu_seqlens_q``, ``cu_seqlens_k`` the
    ``(S+1,)`` offsets; ``max_seqlen_*`` optional (checked against the sequences).
    ``causal`` and ``window=(left, right)`` (None: unbounded) are aligned bottom-right per
    sequence: query ``i'`` of a sequence with ``len_q`` queries and ``len_k`` keys sees keys
    ``i' + len_k − len_q − left ≤ j' ≤ i' + len_k − len_q + right``. ``alibi_slopes``
    ``(H,)`` or ``(S, H)`` adds ``−slope·|i' + len_k − len_q − j'|``. The other keywords are
    :func:`exactattn.attention`'s (``scale``, ``softcap``, ``sinks``, ``dropout_p``/``seed``,
    ``block_size``, ``backend``, ``check_finite``; ``empty_rows`` defaults to ``'zero'``: a
    query with no key gets ``y = 0``, lse −∞ or its sink; a ``score_mod`` sees the packed
    positions ``i``, ``j``). Returns ``y (total_q, H, v)``, or
    ``(y, stats)`` with ``stats.lse`` ``(H, total_q)`` (flash-attn's ``softmax_lse``).
    """
    qh, kh, vh, keywords = packed_problem(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        causal=causal, window=window, alibi_slopes=alibi_slopes, **keywords,
    )  # fmt: skip
    y, stats = api.attention(qh, kh, vh, return_stats=True, **keywords)
    y = y.swapaxes(0, 1)
    return (y, stats) if return_stats else y


def varlen_attention_backward(
    q: Any,
    k: Any,
    v: Any,
    y: Any,
    stats: api.Stats,
    grad_y: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] = (None, None),
    alibi_slopes: Any = None,
    **keywords: Any,
) -> tuple[Any, ...]:
    """The VJP of :func:`varlen_attention`: ``(dq, dk, dv[, dsinks])`` in the packed layout."""
    qh, kh, vh, keywords = packed_problem(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        causal=causal, window=window, alibi_slopes=alibi_slopes, **keywords,
    )  # fmt: skip
    grads = api.attention_backward(
        qh, kh, vh, packed_heads("y", y), stats, packed_heads("grad_y", grad_y), **keywords
    )
    return (*(g.swapaxes(0, 1) for g in grads[:3]), *grads[3:])
