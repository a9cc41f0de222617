"""The interface fields of a case: how today's kernel interfaces lay out one problem.

A dense case ``(B, H, n_q, n_k)`` reaches a kernel through an interface (a packed varlen
batch, a paged KV cache, split-KV partials merged by their lse, a sink). Four optional
fields of :class:`~exactattn.cases.Case` say how (``None``: absent; the check conventions
of :mod:`exactattn.targets.interface_conventions` then derive a layout from the case's contents):

* ``seqlens``: each sequence's key length ``ℓ_b ∈ 0..n_k`` (``cu_seqlens_k`` is their
  running sum; ``cache_seqlens`` the same). It is the maths too: the mask is the key
  padding ``j < ℓ_b`` (:mod:`.spec`), so a zero-length sequence is rows with no key
  (``Y = 0``, ``lse = −∞``, ``empty_rows='zero'``).
* ``splits``: the key boundaries ``0 = e_0 ≤ e_1 ≤ … ≤ e_S = n_k`` of the split-KV
  partials (part ``t`` holds keys ``e_{t−1} ≤ j < e_t``; equal boundaries are an empty part,
  the partial ``(0, −∞)``).
* ``pages``: a paged cache, ``{"size": P, "pool": N, "table": [[page ids] per sequence],
  "shared": s}`` (the one schema, in a :class:`~exactattn.cases.Draw` as in a case): key
  ``t`` of sequence ``b`` sits at row ``t mod P`` of page ``table[b][t // P]``; the first
  ``s`` pages of every sequence are sequence 0's (a shared prompt prefix:
  :func:`shared_prefix` makes those keys and values equal, as a prefix cache holds one
  copy). :func:`fill_pages` builds it; :data:`PAGE_SIZES` is the distribution of ``P``.
* ``sinks``: per query head, the sink's offset ``δ_h``: the sink logit is ``σ_h = δ_h +
  min_{b,i} lse_{b,h,i}`` (the case's float64 log-sum-exp), so ``δ_h`` sets the sink's weight
  ``p_σ`` in the rows (``δ = −20``: negligible; ``0``: the row's largest share; ``> 0``:
  above the running maximum, which a kernel that starts ``m`` at ``−∞`` mishandles).

:func:`exactattn.cases.paths.interface_fields` draws them with shares aimed where
kernels break: zero-length sequences, splits on block boundaries and empty parts, pages of
size 1 and non-powers of two, shared pages, sinks above the maximum. :func:`fill_pages`
builds a block table, :func:`shared_prefix` the shared keys, :func:`coverage` names what a
case covered.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from . import mask_kinds

# the page sizes P, by weight: 1 and non-powers of two, where kernels break; "b" the claimed
# key-block size, "n_k" one page a sequence
PAGE_SIZES = {1: 20, 2: 8, 3: 15, 5: 12, 7: 10, 16: 10, "b": 15, "n_k": 10}


def weighted(u: float, table: dict[Any, int]) -> Any:
    """The key of ``table`` at ``u ∈ [0, 1)`` of the distribution its weights give (keys in
    order, each with probability proportional to its weight)."""
    point = u * sum(table.values())
    for name, weight in table.items():
        point -= weight
        if point < 0:
            return name
    return next(iter(table))


def page_size(u: float, b: int, n_k: int) -> int:
    """The page size at ``u ∈ [0, 1)`` of :data:`PAGE_SIZES` for key-block size ``b`` and
    ``n_k`` keys (at least 1)."""
    size = weighted(u, PAGE_SIZES)
    return max(1, int({"b": b, "n_k": n_k}.get(size, size)))


def fill_pages(size: int, shared: int, order: int, B: int, n_k: int) -> dict[str, Any]:
    """The paged cache of ``B`` sequences of ``n_k`` keys in pages of ``size``: ``⌈n_k/P⌉``
    pages per sequence (at least one), the first ``shared`` of them sequence 0's, all
    others distinct, in the order the seed ``order`` shuffles, from a pool with one page
    no sequence reads."""
    per = max(1, -(-n_k // size))
    own = per - shared
    pool = per + (B - 1) * own + 1
    ids = np.random.default_rng(order).permutation(pool).tolist()
    first, rest = ids[:per], ids[per:]
    table = [first]
    for _ in range(B - 1):
        table.append(first[:shared] + rest[:own])
        rest = rest[own:]
    return {"size": size, "pool": pool, "table": table, "shared": shared}


def shared_prefix(x: np.ndarray, pages: dict[str, Any]) -> np.ndarray:
    """``x`` (``(*batch, n_k, ·)``, sequences along the first batch axis) with the keys of
    the shared pages of every sequence equal to sequence 0's (a new array)."""
    keys = min(x.shape[-2], pages["shared"] * pages["size"])
    view = x.reshape((len(pages["table"]), -1, *x.shape[-2:]))
    out = view.copy()
    if keys:
        out[1:, :, :keys] = view[:1, :, :keys]
    return out.reshape(x.shape)


def coverage(case: Any) -> list[str]:
    """What a case (or its :class:`~exactattn.cases.Draw`) covered of the interfaces, as
    counter keys (the check's coverage table): sequences per batch, uneven query lengths,
    a sequence with more queries than keys, zero-length sequences (keys, queries), a varlen
    causal / window mask; the number of split-KV parts, empty ones, ones of a single key,
    rows a varlen batch leaves without keys (so empty in every part), splits on a block
    edge; page sizes, shared pages, sinks above the lse."""
    out = []
    empty_rows = False  # rows no sequence gives a key: every split-KV part of theirs is empty
    if case.seqlens is not None:
        n_q = case.n_q if hasattr(case, "n_q") else case.sizes["n_q"]  # a Draw or a Case
        q_lengths = case.q_seqlens or [n_q] * len(case.seqlens)
        out.append(f"seqs/batch {len(case.seqlens)}")
        if len(set(q_lengths)) > 1:
            out.append("q lens uneven")
        if any(lq > lk for lq, lk in zip(q_lengths, case.seqlens, strict=True)):
            out.append("seqlen_q > seqlen_k")
        if 0 in case.seqlens:
            out.append("zero-length seq")
        if 0 in q_lengths:
            out.append("zero-length q seq")
        for kind in sorted({leaf["kind"] for leaf in mask_kinds.leaves(case.mask)}):
            if kind in mask_kinds.VARLEN_KINDS:
                out.append(f"varlen {kind}")
        empty_rows = 0 in case.seqlens or min(q_lengths) < n_q
    if case.splits is not None:
        edges = case.splits
        out.append(f"splits {len(edges) - 1}")
        if len(set(edges)) < len(edges):
            out.append("empty split")
        if any(stop - start == 1 for start, stop in itertools.pairwise(edges)):
            out.append("single-key split")
        if empty_rows:
            out.append("row empty in every split")
        n_k = edges[-1]
        if any(0 < e < n_k and e % case.block_size == 0 for e in edges):
            out.append("split at block edge")
    if case.pages is not None:
        out.append(f"page {case.pages['size']}")
        if case.pages["shared"]:
            out.append("shared pages")
    if case.sinks is not None and max(case.sinks) > 0:
        out.append("sink above lse")
    return out
