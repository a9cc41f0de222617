"""Family — today's kernel interfaces are the one algorithm: varlen, paged, split-KV, sinks.

Theorems, each for the library's own code (``exactattn.varlen_attention``,
``exactattn.paged_attention``, ``exactattn.merge_partials``, ``attention(sinks=)`` and
``attention_backward``) run over sympy on free symbols, against a specification written from
the definitions (no mask method, no gather, no merge of the library on the spec side):

* **packed varlen = attention per sequence.** For packed ``q, k, v`` with offsets
  ``cu_q, cu_k`` (empty sequences, ``len_q ≠ len_k``), every key-block size ``b``, with and
  without the causal mask aligned bottom-right per sequence: row ``i = cu_q[s] + i'`` of the
  packed output is ``Σ_{j'∈A} e^{s_ij} v_j / Σ_{j'∈A} e^{s_ij}`` over the keys
  ``j = cu_k[s] + j'`` of its own sequence (``A``: all, or ``j' ≤ i' + len_k − len_q``), 0 when
  ``A = ∅``. Scores are free symbols (``Q = I``, ``K = Sᵀ``, ``c = 1``).
* **paged cache = contiguous cache.** For every placement of the sequences' keys into pages
  (every injective block table over a pool of pages, page sizes 1..3, and tables where two
  sequences share a prefix page), attention of each sequence's queries to its paged keys
  equals attention to its contiguous keys ``K_b``.
* **merging any partition equals the whole.** For every set partition of the keys
  ``{0..n−1}`` (n ≤ max_n − 1, at most 4), partial results computed with the part as the
  mask and merged in every order, left-folded and right-nested, equal attention over all keys
  (y and e^lse). For all n: the partial ``(y, lse)`` is the summary ``(lse, 1, y)`` (lemma
  below: ``φ(lse, 1, y) = φ(m, ℓ, z)`` when ``y = z/ℓ``, ``lse = m + log ℓ``), ``merge_partials``
  is the fold of ``⋆`` over those summaries, and the monoid family proves ``⋆`` associative and
  commutative with ``φ(a ⋆ b) = φ(a) + φ(b)`` and ``Σ(I ∪ I') = Σ(I) ⋆ Σ(I')``; so by induction
  on the number of parts the fold of any partition, in any order and bracketing, has
  ``φ = Σ_{j} (e^{s_j}, e^{s_j} v_j)``, the whole's. The finite checks confirm the code path.
  **No overflow:** every exponential the merge evaluates has a nonpositive argument (the max
  is subtracted), for free lse's.
* **sinks.** With a free sink logit ``σ``: ``Y_i = Σ_j e^{s_ij} v_j / (e^σ + Σ_j e^{s_ij})``,
  ``e^{lse_i} = e^σ + Σ_j e^{s_ij}``; and the reverse's ``dQ, dK, dV, dsinks`` equal
  ``sympy.diff`` of ``L = Σ G∘Y`` (the spec's Y) with respect to each input and ``σ``.

Broken twins, each refuted here: a ``cu_seqlens_k`` with one offset moved by one, a block table
with one page read from the wrong block, a merge that rescales by 0 instead of subtracting the
max (its exponent arguments are the lse's themselves), a sink added to the numerator as well
(the sink's value 1 instead of 0).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import sympy

import exactattn
from exactattn.core import algorithm, merge, sinks

from ..engine.dual import derivatives
from ..engine.ledger import Obligation, check_equal, check_nonpositive
from ..engine.symbols import tensor
from . import layouts_all_n

FAMILY = "interfaces"
CTX = exactattn.SympyContext()
ONE = sympy.Integer(1)


# --- the specification -----------------------------------------------------------------------
def _spec_rows(scores: np.ndarray, allowed: np.ndarray, v: np.ndarray, sink: Any = None):
    """``(Y, e^lse)`` of one sequence from the definition (no shift): free ``scores``."""
    e = np.vectorize(sympy.exp, otypes=[object])(scores)
    e = np.where(allowed, e, sympy.S.Zero)
    total = e.sum(axis=1) + (sympy.S.Zero if sink is None else sympy.exp(sink))
    y = np.empty((scores.shape[0], v.shape[1]), dtype=object)
    for i in range(scores.shape[0]):
        row = e[i] @ v if v.shape[0] else np.full(v.shape[1], sympy.S.Zero, dtype=object)
        y[i] = row / total[i] if total[i] != 0 else row * 0
    return y, total


def _bottom_right_causal(n_q: int, n_k: int) -> np.ndarray:
    """``j' ≤ i' + n_k − n_q``."""
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + n_k - n_q


def _spec_sequence(scores, v, causal):
    n_q, n_k = scores.shape
    allowed = _bottom_right_causal(n_q, n_k) if causal else np.ones((n_q, n_k), dtype=bool)
    return _spec_rows(scores, allowed, v)


def _objects(x: Any) -> np.ndarray:
    return np.array(x, dtype=object)


# --- packed variable-length batches --------------------------------------------------------
def _packed_inputs(lengths):
    """``Q = I`` (one head), ``K = Sᵀ`` with free scores ``S``, symbolic ``V``; offsets."""
    cu_q = np.concatenate([[0], np.cumsum([a for a, _ in lengths])]).astype(int)
    cu_k = np.concatenate([[0], np.cumsum([b for _, b in lengths])]).astype(int)
    scores = tensor("s", cu_q[-1], cu_k[-1])
    q = np.eye(cu_q[-1], dtype=int).astype(object)[:, None, :] * ONE
    k = scores.T.copy()[:, None, :]
    v = tensor("v", cu_k[-1], 1, 1)
    return q, k, v, cu_q, cu_k, scores


def varlen(lengths, causal: bool, offset_error: int = 0) -> Obligation:
    def check() -> str:
        q, k, v, cu_q, cu_k, scores = _packed_inputs(lengths)
        read_k = cu_k.copy()
        read_k[1] += offset_error  # the broken twin reads one boundary off by one
        for b in range(1, cu_k[-1] + 1):
            y = exactattn.varlen_attention(
                q, k, v, cu_q, read_k, causal=causal, block_size=b, scale=ONE
            )
            for s in range(len(lengths)):
                rows, cols = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
                y_ref, _ = _spec_sequence(scores[rows, cols], v[cols, 0], causal)
                check_equal(f"sequence {s}, b={b}", y[rows, 0], y_ref)
        return f"b = 1..{cu_k[-1]}"

    name = "packed varlen = attention per sequence"
    if offset_error:
        name = "BROKEN cu_seqlens_k offset moved by one: " + name
    sizes = f"(len_q, len_k) = {lengths}{' causal' if causal else ''}"
    return Obligation(FAMILY, name, sizes, check, expect_refuted=bool(offset_error))


# --- paged caches --------------------------------------------------------------------------
def _tables(batch_pages: tuple[int, ...], pool: int) -> Iterator[np.ndarray]:
    """Every injective block table giving sequence ``b`` ``batch_pages[b]`` pages of ``pool``."""
    need = sum(batch_pages)
    for chosen in itertools.permutations(range(pool), need):
        rows, start = [], 0
        for count in batch_pages:
            rows.append(list(chosen[start : start + count]))
            start += count
        width = max(batch_pages)
        yield np.array([row + [0] * (width - len(row)) for row in rows])


def _place(table: np.ndarray, lengths, page_size: int, pool: int, keys: list[np.ndarray]):
    """The cache with key ``t`` of sequence ``b`` at row ``t mod P`` of page ``table[b, t//P]``
    (written from the definition; a shared row must hold the same key for every reader)."""
    cache = np.full((pool, page_size, 1, keys[0].shape[-1]), sympy.S.Zero, dtype=object)
    for b, length in enumerate(lengths):
        for t in range(length):
            cache[table[b, t // page_size], t % page_size, 0] = keys[b][t]
    return cache


def _paged_check(lengths, page_size, pool, tables, wrong_page=False, keys=None, values=None):
    keys = keys or [tensor(f"k{b}_", length, 1) for b, length in enumerate(lengths)]
    values = values or [tensor(f"v{b}_", length, 1) for b, length in enumerate(lengths)]

    def check() -> str:
        n_q, count = 1, 0
        q = _objects([[[[ONE]]] for _ in lengths])  # (B, 1, 1, 1): scores are the keys
        for table in tables:
            k_cache = _place(table, lengths, page_size, pool, keys)
            v_cache = _place(table, lengths, page_size, pool, values)
            read = table.copy()
            if wrong_page:  # the broken twin reads sequence 0's first page from another block
                read[0, 0] = (read[0, 0] + 1) % pool
            y = exactattn.paged_attention(
                q, k_cache, v_cache, read, np.array(lengths), causal=True, scale=ONE
            )
            for b, length in enumerate(lengths):
                y_ref, _ = _spec_rows(
                    keys[b].T.copy(), _bottom_right_causal(n_q, length), values[b]
                )
                check_equal(f"table {table.tolist()} sequence {b}", y[b, :, 0], y_ref)
            count += 1
        return f"{count} layouts"

    return check


def paged(lengths, page_size: int, pool: int, wrong_page: bool = False) -> Obligation:
    pages = tuple(-(-n // page_size) for n in lengths)
    check = _paged_check(lengths, page_size, pool, list(_tables(pages, pool)), wrong_page)
    name = "paged cache = contiguous cache (every injective block table)"
    if wrong_page:
        name = "BROKEN a page read from the wrong block: " + name
    sizes = f"lengths {lengths}, page {page_size}, {pool} pages"
    return Obligation(FAMILY, name, sizes, check, expect_refuted=wrong_page)


def shared_prefix(page_size: int) -> Obligation:
    """Two sequences reading one prefix page (its keys are both sequences' first keys)."""

    def check() -> str:
        keys, values = [], []
        for name, out in (("k", keys), ("v", values)):
            prefix = tensor(f"{name}p", page_size, 1)
            out += [np.concatenate([prefix, tensor(f"{name}{b}_", 1, 1)]) for b in range(2)]
        lengths = (page_size + 1, page_size + 1)
        table = np.array([[2, 0], [2, 1]])  # page 2 is both sequences' prefix
        return _paged_check(lengths, page_size, 3, [table], False, keys, values)()

    return Obligation(
        FAMILY, "paged cache = contiguous cache, a prefix page shared", f"page {page_size}", check
    )


# --- split-KV merges -----------------------------------------------------------------------
def _set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in _set_partitions(rest):
        for t in range(len(partition)):
            yield [*partition[:t], [first, *partition[t]], *partition[t + 1 :]]
        yield [[first], *partition]


def _partial(q, k, v, part: list[int], n: int):
    allowed = np.zeros((1, n), dtype=bool)
    allowed[0, part] = True
    y, stats = exactattn.attention(
        q, k, v, mask=allowed, empty_rows="zero", return_stats=True, scale=ONE
    )
    return y, stats.lse


def _right_nested(parts: list[Any]) -> tuple[Any, Any]:
    if len(parts) == 1:
        return parts[0]
    return exactattn.merge_partials([parts[0], _right_nested(parts[1:])])


def merge_partition(n: int, partition: list[list[int]]) -> Obligation:
    def check() -> str:
        scores, v = tensor("s", 1, n), tensor("v", n, 1)
        q, k = _objects([[ONE]]), scores.T.copy()
        y_ref, e_lse_ref = _spec_rows(scores, np.ones((1, n), dtype=bool), v)
        parts = [_partial(q, k, v, part, n) for part in partition]
        orders = list(itertools.permutations(range(len(parts))))
        for order in orders:
            ordered = [parts[t] for t in order]
            for how, (y, lse) in (
                ("left fold", exactattn.merge_partials(ordered)),
                ("right nested", _right_nested(ordered)),
            ):
                check_equal(f"order {order} {how} y", y, y_ref)
                check_equal(f"order {order} {how} e^lse", CTX.exp(lse), e_lse_ref)
        return f"{len(orders)} orders × 2 bracketings"

    return Obligation(FAMILY, "merge of any partition = the whole", f"n={n} {partition}", check)


def partial_is_a_summary() -> Obligation:
    """``φ(lse, 1, y) = φ(m, ℓ, z)`` for ``y = z/ℓ``, ``lse = m + log ℓ`` (the all-n lemma)."""

    def check() -> None:
        m = sympy.Symbol("m", real=True)
        l = sympy.Symbol("l", positive=True)
        z = sympy.Symbol("z", real=True)
        y, lse = (
            algorithm.finalize(CTX, _summary(m, l, z)),
            algorithm.log_sum_exp(CTX, _objects([m]), _objects([l])),
        )
        pair = merge.partial_summary(CTX, y, lse)
        check_equal("ℓ·e^m", pair.l * CTX.exp(pair.m), _objects([l * sympy.exp(m)]))
        check_equal("z·e^m", pair.z * CTX.exp(pair.m)[..., None], _objects([[z * sympy.exp(m)]]))

    return Obligation(FAMILY, "a partial (y, lse) is the summary (lse, 1, y) under φ", "", check)


def _summary(m, l, z) -> algorithm.Summary:
    return algorithm.Summary(_objects([m]), _objects([l]), _objects([[z]]))


class _ExpArguments(exactattn.SympyContext):
    """The sympy context, recording the argument of every ``exp`` the merge evaluates."""

    def __init__(self):
        super().__init__()
        self.arguments: list[Any] = []

    def exp(self, x: np.ndarray) -> np.ndarray:
        self.arguments += list(np.asarray(x, dtype=object).flat)
        return super().exp(x)


def _operands(x: Any) -> set[Any]:
    return set(x.args) if isinstance(x, sympy.Max) else {x}


def _below_its_max(argument: Any) -> bool:
    """``x − Max(a_1, …, a_k) ≤ 0`` when every operand of ``x`` (``x`` itself, or the ``a``'s
    of a ``Max``) is among the ``a_i``: a max is at least each of its operands."""
    terms = sympy.Add.make_args(sympy.sympify(argument))
    if len(terms) != 2:
        return False
    maxima = [t for t in terms if isinstance(-t, sympy.Max)]
    if len(maxima) != 1:
        return False
    (x,) = (t for t in terms if t is not maxima[0])
    return _operands(x) <= set((-maxima[0]).args)


def _shift_by_zero(ctx, m):
    return ctx.where(ctx.is_neg_inf(m), ctx.scalar(0), m * 0)


def merge_without_overflow(broken: bool = False) -> Obligation:
    def check() -> None:
        ctx = _ExpArguments()
        lse = [sympy.Symbol(f"lse{t}", real=True) for t in range(3)]
        parts = [merge.partial_summary(ctx, _objects([[ONE]]), _objects([x])) for x in lse]
        patch = mock.patch.object(algorithm, "safe_shift", _shift_by_zero)
        with patch if broken else contextlib.nullcontext():
            merge.fold(ctx, parts)
        for t, argument in enumerate(ctx.arguments):
            if not _below_its_max(argument):
                check_nonpositive(f"exp argument {t}: {argument}", argument)

    name = "the merge's exponentials have arguments ≤ 0 (no overflow)"
    if broken:
        name = "BROKEN merge without max-subtract: " + name
    return Obligation(FAMILY, name, "3 parts, free lse", check, expect_refuted=broken)


# --- sinks ---------------------------------------------------------------------------------
_SINK_SUMMARY = sinks.initial_summary


def _sink_numerator(ctx, sink, geometry, v_dim):
    """The broken twin: the sink's summary with value 1, so ``e^σ`` enters the numerator."""
    summary = _SINK_SUMMARY(ctx, sink, geometry, v_dim)
    return algorithm.Summary(summary.m, summary.l, summary.z + ONE)


def sinks_exact(n_q: int, n_k: int, broken: bool = False) -> Obligation:
    def check() -> None:
        scores, v = tensor("s", n_q, n_k), tensor("v", n_k, 1)
        sigma = sympy.Symbol("sigma", real=True)
        q, k = (np.eye(n_q, dtype=int).astype(object) * ONE)[None], scores.T.copy()[None]
        args = (q, k, v[None])
        kw = dict(sinks=_objects([sigma]), scale=ONE)
        patch = mock.patch.object(sinks, "initial_summary", _sink_numerator)
        with patch if broken else contextlib.nullcontext():
            y, stats = exactattn.attention(*args, return_stats=True, block_size=1, **kw)
        allowed = np.ones((n_q, n_k), dtype=bool)
        y_ref, e_lse_ref = _spec_rows(scores, allowed, v, sigma)
        check_equal("Y", y[0], y_ref)
        check_equal("e^lse", CTX.exp(stats.lse[0]), e_lse_ref)
        g = tensor("g", 1, n_q, 1)
        _, dk, dv, dsinks = exactattn.attention_backward(*args, y, stats, g, block_size=1, **kw)
        loss = sum((g[0] * y_ref).flat)
        wrt = [*k[0].flat, *v.flat, sigma]
        d = dict(zip(wrt, derivatives("∂L/∂(K, V, σ)", loss, wrt)))
        check_equal("dK", dk[0], np.vectorize(d.__getitem__, otypes=[object])(k[0]))
        check_equal("dV", dv[0], np.vectorize(d.__getitem__, otypes=[object])(v))
        check_equal("dsinks", dsinks, _objects([d[sigma]]))

    name = "sinks: Y, lse and dK, dV, dsinks = sympy.diff of Σ G∘Y"
    if broken:
        name = "BROKEN sink in the numerator: " + name
    return Obligation(FAMILY, name, f"n_q={n_q} n_k={n_k}", check, expect_refuted=broken)


# --- the family ----------------------------------------------------------------------------
VARLEN_LENGTHS = [[(1, 2), (2, 1)], [(2, 2), (0, 1), (1, 3)], [(1, 0), (2, 2)]]


def obligations(max_n: int = 4) -> list[Obligation]:
    out = [varlen(lengths, causal) for lengths in VARLEN_LENGTHS for causal in (False, True)]
    out.append(varlen(VARLEN_LENGTHS[0], True, offset_error=1))
    out += [paged((2, 1), 1, 3), paged((3, 2), 2, 4), paged((3, 1), 3, 3), shared_prefix(2)]
    out.append(paged((2, 1), 1, 3, wrong_page=True))
    for n in range(1, max(2, min(max_n - 1, 4)) + 1):  # 15 partitions at n = 4: --max-n 5
        out += [merge_partition(n, p) for p in _set_partitions(list(range(n)))]
    out += [partial_is_a_summary(), merge_without_overflow(), merge_without_overflow(True)]
    out += [sinks_exact(1, 2), sinks_exact(2, 2), sinks_exact(1, 2, broken=True)]
    return out + layouts_all_n.obligations()
