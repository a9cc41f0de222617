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
  "shared": s}``: key ``t`` of sequence ``b`` sits at row ``t mod P`` of page
  ``table[b][t // P]``; the first ``s`` pages of every sequence are sequence 0's (a shared
  prompt prefix: :func:`fill` makes those keys and values equal, as a prefix cache holds
  one copy).
* ``sinks``: per query head, the sink's offset ``δ_h``: the sink logit is ``σ_h = δ_h +
  min_{b,i} lse_{b,h,i}`` (the case's float64 log-sum-exp), so ``δ_h`` sets the sink's weight
  ``p_σ`` in the rows (``δ = −20``: negligible; ``0``: the row's largest share; ``> 0``:
  above the running maximum, which a kernel that starts ``m`` at ``−∞`` mishandles).

:func:`exactattn.cases.paths.interface_fields` draws them with shares aimed where
kernels break: zero-length sequences, splits on block boundaries and empty parts, pages of
size 1 and non-powers of two, shared pages, sinks above the maximum. :func:`fill_pages`
builds a block table, :func:`share_prefix` the shared keys, :func:`coverage` names what a
case covered.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def fill_pages(template: dict[str, Any], B: int, n_k: int) -> dict[str, Any]:
    """The block table of a pages template: ``⌈n_k/P⌉`` pages per sequence (at least one),
    the first ``shared`` of them sequence 0's, all others distinct, in an order drawn from
    ``order``, from a pool with one page no sequence reads."""
    size, shared = template["size"], template["shared"]
    per = max(1, -(-n_k // size))
    own = per - shared
    pool = per + (B - 1) * own + 1
    ids = np.random.default_rng(template["order"]).permutation(pool).tolist()
    first, rest = ids[:per], ids[per:]
    table = [first]
    for _ in range(B - 1):
        table.append(first[:shared] + rest[:own])
        rest = rest[own:]
    return {"size": size, "pool": pool, "table": table, "shared": shared}


def share_prefix(x: np.ndarray, B: int, keys: int) -> None:
    """Make the first ``keys`` keys (axis −2) of every sequence equal to sequence 0's, in
    place (``x (*batch, n_k, ·)``, sequences along the first batch axis)."""
    if keys and B > 1:
        view = x.reshape((B, -1, *x.shape[-2:]))
        view[1:, :, :keys] = view[:1, :, :keys]


def coverage(case: Any) -> list[str]:
    """What a case covered of the interfaces, as counter keys (the check's coverage table)."""
    out = []
    if case.seqlens is not None:
        out.append(f"seqs/batch {len(case.seqlens)}")
        if 0 in case.seqlens:
            out.append("zero-length seq")
    if case.splits is not None:
        edges = case.splits
        out.append(f"splits {len(edges) - 1}")
        if len(set(edges)) < len(edges):
            out.append("empty split")
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
