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
* ``kvcache``: how a KV-cache decode call (flash-attn's ``flash_attn_with_kvcache``) holds
  the keys, :func:`resolve_kvcache`: ``append`` the number ``a`` of each sequence's last
  keys passed as new keys ``k=, v=`` (written into the cache by the kernel, the other
  ``ℓ_b − a`` already cached: ``cache_seqlens = λ_b + ℓ_b − a``); ``paged`` the case's
  ``pages`` as the block table, else a contiguous cache of ``rows`` rows of ``length``
  positions, sequence ``b`` in row ``batch_idx[b]`` (``cache_batch_idx``) from position
  ``leftpad[b]`` (``cache_leftpad``), every other position NaN, which a kernel that reads
  it shows; ``rotary`` the rotary embedding the kernel applies to the queries and the new
  keys (``rotary_dim`` ``dim``, ``interleaved``, and the ``seed`` of its table of quarter
  turns, :func:`quarter_turns`); ``num_splits`` the split-KV count asked for (0: the
  kernel's heuristic).

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


# what a KV-cache call appends, by weight (resolved per case by :func:`resolve_kvcache`):
# nothing, one key (decode), a few (speculative decoding), the last page from its first
# row, keys across a page boundary, every key (a prefill into an empty cache)
APPENDS = {"none": 15, "one": 25, "few": 15, "page-edge": 15, "cross-page": 20, "all": 10}
ROTARY_FRACTIONS = (1.0, 0.5, 0.25)  # rotary_dim / headdim: partial rotary too
ROTARY_MULTIPLE = 16  # flash-attn's kernels take a rotary_dim divisible by 16 (d >= 16)


def resolve_kvcache(
    spec: dict[str, Any], lengths: list[int], pages: dict[str, Any] | None, d: int
) -> dict[str, Any]:
    """The case's ``kvcache`` field from its drawn ``spec`` (``append`` one of
    :data:`APPENDS`, ``few``, ``paged``, ``leftpad`` and ``batch_idx`` booleans,
    ``rotary`` ``{"fraction", "interleaved"}`` or None, ``num_splits``, ``seed``) once the
    key lengths ``ℓ_b`` and the pages are known: ``a ≤ min_b ℓ_b`` (every sequence appends
    the same ``a``), a page boundary inside or at the start of sequence 0's appended keys for
    ``cross-page`` / ``page-edge`` (page size ``P``: the first keys of its last page, or one
    key before it), rotary only where ``rotary_dim`` is a multiple of
    :data:`ROTARY_MULTIPLE` (and ``≤ d``; even, for heads of fewer dims) and with an append
    (flash-attn rotates the new keys); a paged cache takes neither ``leftpad`` nor
    ``batch_idx`` (flash-attn refuses them together), and its shared prefix pages get no
    appended key."""
    rng = np.random.default_rng(spec["seed"])
    B, shortest = len(lengths), min(lengths, default=0)
    paged = bool(spec["paged"]) and pages is not None
    size = pages["size"] if paged else max(1, shortest)
    first = lengths[0] if lengths else 0
    last_page = size * ((first - 1) // size) if first > 0 else 0
    append = {
        "none": 0,
        "one": 1,
        "few": spec["few"],
        "page-edge": first - last_page,
        "cross-page": first - last_page + 1,
        "all": shortest,
    }[spec["append"]]
    if paged and pages["shared"]:  # appends go to a sequence's own pages, not the prefix's
        shortest -= pages["shared"] * pages["size"]
    append = max(0, min(append, shortest))
    out: dict[str, Any] = {"append": int(append), "paged": paged, "num_splits": spec["num_splits"]}
    if not paged:
        leftpad = [int(rng.integers(0, 4)) for _ in range(B)] if spec["leftpad"] else None
        rows = B + (int(rng.integers(1, 3)) if spec["batch_idx"] else 0)
        starts = leftpad or [0] * B
        out.update(
            leftpad=leftpad,
            batch_idx=rng.permutation(rows)[:B].tolist() if spec["batch_idx"] else None,
            rows=rows,
            length=max([s + n for s, n in zip(starts, lengths)], default=0) + spec["slack"],
        )
    rotary = spec.get("rotary")
    multiple = ROTARY_MULTIPLE if d >= ROTARY_MULTIPLE else 2  # small heads: any pair
    dim = 0 if rotary is None else int(d * rotary["fraction"]) // multiple * multiple
    out["rotary"] = (
        {"dim": dim, "interleaved": bool(rotary["interleaved"]), "seed": spec["seed"]}
        if dim > 0 and append > 0
        else None
    )
    return out


def quarter_turns(seed: int, positions: int, half: int) -> tuple[np.ndarray, np.ndarray]:
    """The rotary tables ``rotary_cos, rotary_sin`` ``(positions, half)`` of the kvcache
    field's ``seed``: each entry the cosine and sine of a multiple of a quarter turn, so
    ``cos, sin ∈ {0, ±1}`` and the rotation of any float is exact in its own format (the
    case's keys stay its keys: the reference needs no rounding of a rotation). The angle of
    each (position, frequency) is drawn, so a kernel that rotates at the wrong position,
    pairs the wrong dims or skips a part of the head shows it."""
    turns = np.random.default_rng([seed, 1]).integers(0, 4, size=(positions, half))
    cos = np.array([1.0, 0.0, -1.0, 0.0])[turns]
    sin = np.array([0.0, 1.0, 0.0, -1.0])[turns]
    return cos, sin


def rotated(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, at: np.ndarray, interleaved: bool, sign: int
) -> np.ndarray:
    """``x (B, n, H, d)`` with each row ``x[b, r]`` turned by the angles of position
    ``at[b, r]`` (``sign = −1``: the inverse turn): the pairs ``(2u, 2u + 1)`` (interleaved)
    or ``(u, u + R/2)`` of the first ``R = 2·half`` dims, written from the definition
    ``(x_a, x_b) ↦ (x_a cos θ − x_b sin θ, x_b cos θ + x_a sin θ)``."""
    half = cos.shape[1]
    a = np.arange(0, 2 * half, 2) if interleaved else np.arange(half)
    b = a + 1 if interleaved else a + half
    c = cos[at][:, :, None, :]
    s = sign * sin[at][:, :, None, :]
    out = x.copy()
    out[..., a] = x[..., a] * c - x[..., b] * s
    out[..., b] = x[..., b] * c + x[..., a] * s
    return out


def sequence_lengths(mask: dict[str, Any], seqlens: Any, B: int, n_k: int) -> list[int]:
    """Each sequence's key length: ``seqlens``, else the mask's key padding per batch element
    (the shortest over heads where it has one per head), else ``n_k``."""
    if seqlens is not None:
        return [int(n) for n in seqlens]
    lengths = mask_kinds.key_lengths(mask)
    if lengths is None:
        return [n_k] * B
    lengths = np.asarray(lengths).reshape(B, -1) if B else np.asarray(lengths).reshape(1, -1)
    return lengths.min(axis=1).astype(int).tolist()


def kvcache_coverage(
    field: dict[str, Any], lengths: list[int], page: int | None, d: int
) -> list[str]:
    """What a kvcache field covered: the appends (and whether an append crosses a page
    boundary or starts on one), the cache's form, left padding, a permuted batch, rotary
    (interleaved or not, partial), split-KV."""
    a = field["append"]
    out = [f"append {a if a <= 4 else '>4'}", "paged cache" if field["paged"] else "contiguous"]
    if a and page:
        starts = [n - a for n in lengths]
        if any(s // page != (n - 1) // page for s, n in zip(starts, lengths)):
            out.append("append crosses page")
        if any(s % page == 0 for s in starts):
            out.append("append at page edge")
    if field.get("leftpad") and any(field["leftpad"]):
        out.append("cache_leftpad")
    if field.get("batch_idx") is not None:
        out.append("cache_batch_idx")
    rotary = field["rotary"]
    if rotary is not None:
        out.append("rotary interleaved" if rotary["interleaved"] else "rotary halves")
        if rotary["dim"] < d:
            out.append("rotary partial")
    if field["num_splits"] != 0:
        out.append(f"num_splits {field['num_splits']}")
    return out


FIELDS = ("seqlens", "splits", "pages", "sinks", "kvcache")  # what a convention can read


def coverage(case: Any, reads: tuple[str, ...] = FIELDS) -> list[str]:
    """What a case covered of the interface fields a convention ``reads`` (default all), as
    counter keys (the check's coverage table): sequences per batch, uneven query lengths,
    a sequence with more queries than keys, zero-length sequences (keys, queries), a varlen
    causal / window mask; the number of split-KV parts, empty ones, ones of a single key,
    rows a varlen batch leaves without keys (so empty in every part), splits on a block
    edge; page sizes, shared pages; sinks above the lse; a KV cache's appends, page
    crossings, form and rotary (:func:`kvcache_coverage`)."""
    out = []
    n_q = case.n_q if hasattr(case, "n_q") else case.sizes["n_q"]  # a Draw or a Case
    q_lengths = case.q_seqlens or [n_q] * len(case.seqlens or ())
    if case.seqlens is not None and "seqlens" in reads:
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
    if case.splits is not None and "splits" in reads:
        # rows no sequence gives a key: every split-KV part of theirs is empty
        empty_rows = case.seqlens is not None and (0 in case.seqlens or min(q_lengths) < n_q)
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
    if case.pages is not None and "pages" in reads:
        out.append(f"page {case.pages['size']}")
        if case.pages["shared"]:
            out.append("shared pages")
    if case.sinks is not None and max(case.sinks) > 0 and "sinks" in reads:
        out.append("sink above lse")
    kvcache = getattr(case, "kvcache", None)
    if kvcache is not None and "kvcache" in reads and hasattr(case, "sizes"):  # a built Case
        B, n_k, d = (case.batch or (1,))[0], case.sizes["n_k"], case.sizes["d"]
        lengths = sequence_lengths(case.mask, case.seqlens, B, n_k)
        page = case.pages["size"] if kvcache["paged"] else None
        out += kvcache_coverage(kvcache, lengths, page, d)
    return out
