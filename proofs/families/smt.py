"""Family 10 — the tile iterator visits every allowed (b, i, j) exactly once, for all n (SMT).

The loop of ``algorithm.tiles``, stated (``ρ`` the row_block, None: whole spans):

    for t = 0, 1, …, ⌈n_k/b⌉ − 1:   J_t = [tb, min((t+1)b, n_k)),  S_t = row_span(J_t) = [s, e)
        for f = f_0 = s, f_1 = s + w₀, f_{k+1} = f_k + w, while f < e  (w = max(1, ρ or e − s);
                                     w₀ = min(w, b) with edge_first and a row_block, else w):
            R = [f, min(f + w', e)) (w' = w₀ for the first run, w after),  κ = classify(R, J_t)
            κ = EMPTY: nothing;  FULL: every pair of R × J_t;
            PARTIAL: the pairs allowed(R × J_t) marks (the tile is dropped if it marks none)

(no mask: ``S_t = [0, n_q)`` and ``κ = FULL``). A mask's *contracts*, for every batch
element and head, every nonempty key interval ``J = [a, e) ⊆ [0, n_k)`` and row interval
``R = [r0, r1) ⊆ [0, n_q)``: (span) every row ``i ∈ [0, n_q)`` with an allowed ``(b, i, j)``,
``j ∈ J``, lies in ``row_span(J) = [s, t)``, and ``s < t ⇒ 0 ≤ s ∧ t ≤ n_q``; (kind)
``classify(R, J) = EMPTY`` ⇒ no pair of ``R × J`` is allowed, ``FULL`` ⇒ every pair is.

Theorem (for all integers, unless a size is named). Each statement is a solver query whose
negation is unsatisfiable (z3), run on the library's own formulas over symbols:

* **window**: ``window_allows(L, R, alignment_offset(…))`` is the definition
  ``i + o − L ≤ j ≤ i + o + R`` (``o = 0`` top-left, ``n_k − n_q`` bottom-right; every
  side None or any ``≥ 0``); ``window_row_span`` and ``window_tile_kind`` meet the contracts
  for every offset ``o``, ``n_q, n_k ≥ 1``, key interval and row interval;
* **padding**: ``padding_tile_kind`` meets the kind contract and ``padding_row_span`` the
  span contract for lengths anywhere in ``[shortest, longest]``;
* **compositions**: for every combination of the parts' kinds (1–3 parts, and depth 2),
  ``And``/``Or.classify`` meet the kind contract for ``∧``/``∨`` of parts that meet it; and
  ``And``/``Or.row_span`` meet the span contract for parts that meet it, checked at every
  order type of the parts' span ends (1–3 parts): the spans are built from ``min``/``max``
  and comparisons of those ends, so one representative per order type stands for all
  integers. The composed mask meets the contracts its parts meet, so compositions of any
  depth do;
* **the loop**: the runs ``[f, min(f + w, e))``, ``f = s, s + w, …`` (and the key blocks,
  ``s = 0``, ``e = n_k``, ``w = b``) are disjoint, nonempty, inside ``[s, e)`` and cover it
  (induction over the loop as checked steps); given the contracts, a pair is counted iff it
  is allowed, and no row outside ``[0, n_q)`` is visited;
* **lowering**: the :class:`~exactattn.core.masks.Band` of ``Mask.lower`` — a window's, key
  padding's, ``And``'s through ``Band.intersect`` (symbolic window sides, every path of its
  ``min``) — allows exactly what the mask's definition allows.

* **the code's loop is the stated loop**: ``tiles()`` keeps its integer logic in
  ``algorithm.key_block``, ``run_widths``, ``row_run`` and the loop ``algorithm.runs``; run
  on symbols (every comparison decided by the solver, once per feasible outcome), from any
  state of the stated loop they yield its run and then stop exactly where it stops or yield
  its next run (induction over the loop; the key blocks from ``0``, the runs from ``s``).

Checked exhaustively besides: ``tiles()`` end to end — the same tiles, in the same order,
with the same allowed tiles — against the stated loop and against its previous twin
(:func:`previous_tiles`, the iterator before its logic became the formulas above) for
n_q, n_k ≤ 6, every b = 1..n_k+1, row_block ∈ {-, 1, 2, 3} and edge_first, over masks with
arbitrary spans, kinds and tiles. Without z3 the solver obligations are SKIPPED
(``pip install 'exactattn[proofs]'``), never PROVED; an ``unknown`` is UNKNOWN.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from exactattn.backends import NumpyContext
from exactattn.core import algorithm, masks
from exactattn.core.masks import Geometry, TileKind

from ..engine import symbolic_spec
from ..engine.counterexamples import Counterexample
from ..engine.ledger import Obligation, Refuted
from ..engine.solver import Z3, Paths, SymInt, boolean, implies, ints, load, prove, term
from . import blockmask

FAMILY = "smt"
SIDES = ((False, False), (True, False), (False, True), (True, True))  # left, right symbolic?
KINDS = tuple(TileKind)


def _sides(symbolic: tuple[bool, bool], left: Any, right: Any) -> tuple[Any, Any]:
    return (left if symbolic[0] else None, right if symbolic[1] else None)


def _side_text(left: Any, right: Any) -> str:
    return f"left={'L' if left is not None else '-'}, right={'R' if right is not None else '-'}"


def _nonnegative(*sides: Any) -> list[Any]:
    return [x >= 0 for x in sides if x is not None]


def _all(*claims: Any) -> Any:
    """The conjunction (Python bools, which formulas give for absent sides, included)."""
    return load().And(*(boolean(c) for c in claims))


# --- windows ----------------------------------------------------------------------------------
def window_definition() -> None:
    n_q, n_k, i, j, left_, right_ = ints("n_q n_k i j L R")
    for alignment in masks.ALIGNMENTS:
        offset = masks.alignment_offset(alignment, n_q, n_k)
        for symbolic in SIDES:
            left, right = _sides(symbolic, left_, right_)
            code = boolean(masks.window_allows(left, right, offset, i, j, Z3))
            definition = symbolic_spec.window(left, right, alignment).ok(0, i, j, n_q, n_k)
            prove(
                f"{alignment} window_allows ({_side_text(left, right)}) = the definition",
                code == boolean(definition),
                [n_q >= 1, n_k >= 1, i >= 0, i < n_q, j >= 0, j < n_k, *_nonnegative(left, right)],
                {"window_allows": code, "definition": definition},
            )


def _block(n_k: Any, a: Any, e: Any) -> list[Any]:
    return [n_k >= 1, a >= 0, a < e, e <= n_k]


def window_span() -> None:
    n_q, n_k, o, a, e, i, j, left_, right_ = ints("n_q n_k o a e i j L R")
    for symbolic in SIDES:
        left, right = _sides(symbolic, left_, right_)
        start, stop = masks.window_row_span(left, right, o, a, e, n_q, Z3)
        base = [n_q >= 1, *_block(n_k, a, e), *_nonnegative(left, right)]
        show = {"start": start, "stop": stop}
        text = f"window_row_span ({_side_text(left, right)})"
        prove(
            f"{text}: s < t ⇒ 0 ≤ s, t ≤ n_q", implies(start < stop, _all(start >= 0, stop <= n_q)),
            base, show,
        )  # fmt: skip
        allowed = boolean(masks.window_allows(left, right, o, i, j, Z3))
        prove(
            f"{text} holds every row with an allowed key in [a, e)",
            implies(allowed, _all(start <= i, i < stop)),
            [*base, i >= 0, i < n_q, a <= j, j < e],
            {**show, "allowed": allowed},
        )


def window_kind() -> None:
    n_q, n_k, o, a, e, r0, r1, i, j, left_, right_ = ints("n_q n_k o a e r0 r1 i j L R")
    for symbolic in SIDES:
        left, right = _sides(symbolic, left_, right_)
        empty, full = (boolean(x) for x in masks.window_tile_kind(left, right, o, r0, r1, a, e, Z3))
        allowed = boolean(masks.window_allows(left, right, o, i, j, Z3))
        hypotheses = [
            r0 >= 0, r0 < r1, r1 <= n_q, *_block(n_k, a, e), r0 <= i, i < r1, a <= j, j < e,
            *_nonnegative(left, right),
        ]  # fmt: skip
        show = {"empty": empty, "full": full, "allowed(i, j)": allowed}
        text = f"window_tile_kind ({_side_text(left, right)})"
        prove(f"{text}: EMPTY ⇒ (i, j) not allowed", implies(empty, ~allowed), hypotheses, show)
        prove(f"{text}: FULL ⇒ (i, j) allowed", implies(full, allowed), hypotheses, show)


# --- key padding ----------------------------------------------------------------------------
def padding_kind() -> None:
    n_k, a, e, j, shortest, longest, length = ints("n_k a e j shortest longest len_b")
    empty, full = (boolean(x) for x in masks.padding_tile_kind(shortest, longest, a, e))
    allowed = j < length  # the definition: key j of batch element b is real iff j < len[b]
    hypotheses = [shortest >= 0, shortest <= length, length <= longest, *_block(n_k, a, e)]
    hypotheses += [a <= j, j < e]
    show = {"empty": empty, "full": full}
    prove("padding_tile_kind: EMPTY ⇒ j ≥ len[b]", implies(empty, ~allowed), hypotheses, show)
    prove("padding_tile_kind: FULL ⇒ j < len[b]", implies(full, allowed), hypotheses, show)


def padding_span() -> None:
    n_q, n_k, a, e, i, j, longest, length = ints("n_q n_k a e i j longest len_b")
    start, stop = masks.padding_row_span(longest, a, n_q, Z3)
    hypotheses = [n_q >= 1, length >= 0, length <= longest, *_block(n_k, a, e)]
    allowed = load().And(a <= j, j < e, j < length, i >= 0, i < n_q)  # row i sees key j
    show = {"start": start, "stop": stop}
    prove(
        "padding_row_span: an allowed (i, j) with j in the block has i in [start, stop)",
        implies(allowed, load().And(start <= i, i < stop)), hypotheses, show,
    )  # fmt: skip
    prove(
        "padding_row_span: 0 ≤ start ≤ stop ≤ n_q",
        load().And(start >= 0, start <= stop, stop <= n_q), hypotheses, show,
    )  # fmt: skip


# --- compositions ----------------------------------------------------------------------------
class _Part(masks.Mask):
    """An abstract part: any predicate, with the kind and span it reports (the contracts are
    the hypotheses about it)."""

    def __init__(self, kind: TileKind = TileKind.PARTIAL, span: range = range(0)) -> None:
        self.kind, self.span = kind, span

    def classify(self, rows: range, cols: range, geometry: Geometry) -> TileKind:
        return self.kind

    def row_span(self, cols: range, geometry: Geometry) -> range:
        return self.span


_GEOMETRY = Geometry(4, 4)
_ROWS, _COLS = range(1, 3), range(1, 3)


def _kind_contract(kind: TileKind, allowed: Any) -> Any:
    """What ``kind`` promises about one pair of the tile, whose allowedness is ``allowed``."""
    z3 = load()
    if kind is TileKind.EMPTY:
        return z3.Not(allowed)
    return allowed if kind is TileKind.FULL else z3.BoolVal(True)


def _combine(op: type, values: list[Any]) -> Any:
    z3 = load()
    return z3.And(*values) if op is masks.And else z3.Or(*values)


def composition_kinds() -> str:
    """``And``/``Or.classify`` over abstract parts of every kind: 1–3 parts and depth 2."""
    z3 = load()
    checked = 0
    for op in (masks.And, masks.Or):
        for count in (1, 2, 3):
            for kinds in itertools.product(KINDS, repeat=count):
                allowed = list(z3.Bools(" ".join(f"p{k}" for k in range(count))))
                kind = op(tuple(_Part(x) for x in kinds)).classify(_ROWS, _COLS, _GEOMETRY)
                what = f"{op.__name__}.classify of parts {[x.name for x in kinds]} = {kind.name}"
                prove(
                    what, _kind_contract(kind, _combine(op, allowed)),
                    [_kind_contract(x, p) for x, p in zip(kinds, allowed)],
                )  # fmt: skip
                checked += 1
    for outer, inner in itertools.product((masks.And, masks.Or), repeat=2):
        for kinds in itertools.product(KINDS, repeat=3):
            allowed = list(z3.Bools("p0 p1 p2"))
            nested = inner((_Part(kinds[0]), _Part(kinds[1])))
            kind = outer((nested, _Part(kinds[2]))).classify(_ROWS, _COLS, _GEOMETRY)
            combined = _combine(outer, [_combine(inner, allowed[:2]), allowed[2]])
            what = (
                f"{outer.__name__}({inner.__name__}(·, ·), ·).classify of parts "
                f"{[x.name for x in kinds]} = {kind.name}"
            )
            prove(what, _kind_contract(kind, combined),
                  [_kind_contract(x, p) for x, p in zip(kinds, allowed)])  # fmt: skip
            checked += 1
    return f"{checked} kind combinations"


def _order_types(count: int) -> Iterator[tuple[int, list[range]]]:
    """``(n_q, spans)`` for ``count`` spans ``0 ≤ s ≤ t ≤ n_q``: one representative of every
    order type of their ends (levels 0..top, interior levels used without gaps), every end
    an even number so that a row fits strictly between any two distinct ends."""
    top = 2 * count + 1
    pairs = [(s, t) for s in range(top + 1) for t in range(s, top + 1)]
    for choice in itertools.product(pairs, repeat=count):
        interior = {x for pair in choice for x in pair} - {0, top}
        if interior != set(range(1, len(interior) + 1)):
            continue
        yield 2 * top, [range(2 * s, 2 * t) for s, t in choice]


def composition_spans() -> str:
    """``And``/``Or.row_span`` meet the span contract for parts that meet it (order types)."""
    checked = 0
    for op in (masks.And, masks.Or):
        for count in (1, 2, 3):
            for n_q, spans in _order_types(count):
                _check_span(op, n_q, spans)
                checked += 1
    return f"{checked} order types"


def _check_span(op: type, n_q: int, spans: list[range]) -> None:
    """The composed span holds every row an allowed pair can lie in, within [0, n_q)."""
    span = op(tuple(_Part(span=s) for s in spans)).row_span(_COLS, Geometry(n_q, 4))
    rows = np.arange(n_q)
    inside = np.array([(s.start <= rows) & (rows < s.stop) for s in spans])
    may = inside.all(axis=0) if op is masks.And else inside.any(axis=0)
    missed = may & ~((span.start <= rows) & (rows < span.stop))
    outside = len(span) > 0 and (span.start < 0 or span.stop > n_q)
    if missed.any() or outside:
        why = f"misses row {int(np.argmax(missed))}" if missed.any() else "leaves [0, n_q)"
        raise Refuted(
            Counterexample(
                f"{op.__name__}.row_span of parts with spans "
                + ", ".join(f"[{s.start}, {s.stop})" for s in spans),
                {"n_q": str(n_q)}, f"[{span.start}, {span.stop})", why, "—",
            )
        )  # fmt: skip


# --- the loop -------------------------------------------------------------------------------
def loop_partition() -> None:
    """``for f in range(s, e, w)``: runs ``[f, min(f + w, e))`` partition ``[s, e)``.

    Induction over the loop: ``C_f = [s, f)`` is what the runs before ``f`` covered, each
    row once (base ``C_s = ∅``). Step: a run is nonempty, inside ``[s, e)``, disjoint from
    ``C_f``, and ``C_f ∪ run = C_{f+w} ∩ [s, e)``. End: the first ``f ≥ e`` leaves
    ``C = [s, min(f, e)) = [s, e)`` (and nothing runs when ``s ≥ e``).
    """
    z3 = load()
    s, e, w, f, x = ints("s e w f x")
    stop = z3.If(f + w <= e, f + w, e)  # min(f + w, e), the run's end
    before, run = (s <= x) & (x < f), (f <= x) & (x < stop)
    step = [w >= 1, s <= f, f < e]
    show = {"run stop": stop}
    prove("a run is nonempty and inside [s, e)", (f < stop) & (stop <= e), step, show)
    prove("a run is disjoint from the rows before it", ~(before & run), step, show)
    prove(
        "the runs so far cover [s, min(f + w, e)) exactly",
        (before | run) == ((s <= x) & (x < stop)), step, show,
    )  # fmt: skip
    prove("the last run ends at e", implies(f + w >= e, stop == e), step, show)
    prove("the loop advances", f + w > f, [w >= 1])


def loop_counts() -> None:
    """Given the contracts, the stated loop counts a pair iff it is allowed, inside the grid.

    ``(i, j)`` lies in exactly one key block ``J = [a, e)`` and, when ``i ∈ [s, t)``, in
    exactly one run ``R`` (the partition lemma); the tile ``R × J`` counts it iff it is not
    EMPTY and it is FULL or its allowed tile marks the pair (a PARTIAL tile *is* the
    predicate). No visited row leaves ``[0, n_q)``: runs lie in ``[s, t)``.
    """
    z3 = load()
    n_q, i, s, t, r0, r1 = ints("n_q i s t r0 r1")
    kind = z3.Int("kind")  # of the tile R × J holding (i, j): 0 EMPTY, 1 PARTIAL, 2 FULL
    allowed = z3.Bool("allowed")  # the mask's predicate at (b, i, j), j in the block J
    in_span = _all(s <= i, i < t)
    contracts = [
        implies(allowed, in_span),  # span (with 0 ≤ i < n_q)
        implies(s < t, _all(s >= 0, t <= n_q)),
        implies(kind == 0, ~allowed),  # kind
        implies(kind == 2, allowed),
        kind >= 0, kind <= 2,
    ]  # fmt: skip
    run = [s <= r0, r0 < r1, r1 <= t]  # a run of the span (the partition lemma) ...
    holding = [implies(in_span, _all(r0 <= i, i < r1))]  # ... the one holding row i
    counted = _all(in_span, kind != 0, z3.Or(kind == 2, allowed))
    show = {"kind": kind, "allowed": allowed}
    prove(
        "the run holding (i, j) counts it iff allowed", counted == allowed,
        [i >= 0, i < n_q, *contracts, *run, *holding], show,
    )  # fmt: skip
    prove("every visited row is in [0, n_q)", _all(r0 >= 0, r1 <= n_q), [*contracts, *run])


# --- lowering ----------------------------------------------------------------------------------
def _band_allows(band: masks.Band, b: int, i: Any, j: Any, n_q: Any, n_k: Any) -> Any:
    """The band's documented meaning, from the definition (not ``window_allows``)."""
    z3 = load()
    o = {"top-left": 0, "bottom-right": n_k - n_q}[band.alignment]
    terms = [z3.BoolVal(True)]
    if band.left is not None:
        terms.append(j >= i + o - term(band.left))
    if band.right is not None:
        terms.append(j <= i + o + term(band.right))
    if band.kv_lengths is not None:
        terms.append(j < band.kv_lengths[b])
    return z3.And(*terms)


def _symbolic_window(left: Any, right: Any, alignment: str) -> masks.SlidingWindow:
    """A window with symbolic sides (the constructor checks that sides are concrete ints)."""
    window = object.__new__(masks.SlidingWindow)
    for name, value in (("left", left), ("right", right), ("alignment", alignment)):
        object.__setattr__(window, name, value)
    return window


def lowering() -> str:
    n_q, n_k, i, j = ints("n_q n_k i j")
    lengths = np.array(ints("len0 len1"), dtype=object)
    grid = [n_q >= 1, n_k >= 1, i >= 0, i < n_q, j >= 0, j < n_k, *(x >= 0 for x in lengths)]
    padding = masks.KeyPadding(lengths.reshape(2, 1))
    geometry = Geometry(n_q, n_k, (2, 3))
    checked = 0
    for alignment, other in itertools.product(masks.ALIGNMENTS, repeat=2):
        for pattern, pattern2 in itertools.product(SIDES, repeat=2):
            paths = Paths(grid)
            sides = [paths.symbol(x) for x in ("L1", "R1", "L2", "R2")]
            paths.hypotheses += [x.term >= 0 for x in sides]
            first = _symbolic_window(*_sides(pattern, *sides[:2]), alignment)
            second = _symbolic_window(*_sides(pattern2, *sides[2:]), other)
            cases = [masks.And((first, masks.And((second, padding))))]
            if (other, pattern2) == (alignment, SIDES[0]):  # once per first window
                cases += [first, masks.And((first, padding))]
            for mask in cases:
                checked += _prove_lowered(mask, paths, geometry, i, j)
    return f"{checked} lowered bands"


def _parts(mask: masks.Mask) -> list[masks.Mask]:
    if isinstance(mask, masks.And):
        return [leaf for part in mask.parts for leaf in _parts(part)]
    return [mask]


def _prove_lowered(mask: masks.Mask, paths: Paths, geometry: Geometry, i: Any, j: Any) -> int:
    """The band of every path of ``mask.lower`` against the conjunction of the definitions."""
    n_q, n_k, checked = geometry.n_q, geometry.n_k, 0
    for condition, band in paths.explore(lambda: mask.lower(geometry)):
        if band is None:
            continue  # the generic path: nothing lowered, nothing to prove
        for b in range(2):
            definition = _all(*(_definition(p, b, i, j, n_q, n_k) for p in _parts(mask)))
            lowered = _band_allows(band, b, i, j, n_q, n_k)
            prove(
                f"{_describe(mask)} lowered, b={b}", lowered == definition, condition,
                {"band": lowered, "mask": definition},
            )  # fmt: skip
            checked += 1
    return checked


def _definition(mask: masks.Mask, b: int, i: Any, j: Any, n_q: Any, n_k: Any) -> Any:
    if isinstance(mask, masks.KeyPadding):
        return j < mask.lengths.reshape(-1)[b]
    left, right = (None if x is None else term(x) for x in (mask.left, mask.right))
    return boolean(symbolic_spec.window(left, right, mask.alignment).ok(b, i, j, n_q, n_k))


def _describe(mask: masks.Mask) -> str:
    if isinstance(mask, masks.And):
        return "And(" + ", ".join(_describe(p) for p in mask.parts) + ")"
    if isinstance(mask, masks.KeyPadding):
        return "padding"
    sides = _side_text(mask.left, mask.right)
    return f"window({sides}, {'TL' if mask.alignment == 'top-left' else 'BR'})"


# --- the code's loop is the stated loop (all n) ------------------------------------------------
def _first_two(paths: Paths, loop: Callable[[], Iterator]) -> Any:
    """The code's loop (``loop()``, built inside each path) from its state: its first run and
    the one after it (None where it stops), on every feasible path of its comparisons."""

    def two() -> tuple[Any, Any]:
        runs = loop()
        return next(runs, None), next(runs, None)

    return paths.explore(two)


def _same_run(code: Any, stated: tuple[Any, Any]) -> Any:
    z3 = load()
    return z3.And(term(code[0]) == stated[0], term(code[1]) == stated[1])


def _prove_loop_step(what: str, paths: Paths, loop: Callable[[], Iterator], stated) -> None:
    """From the stated loop's state ``k`` (``start`` = its run k's first element, which is
    below ``stop``): the code yields run k, and then stops iff the stated loop has no run
    k + 1, or yields run k + 1 (so, by induction from the first state, every run)."""
    z3 = load()
    now, after, more = stated
    for condition, (first, second) in _first_two(paths, loop):
        if first is None:
            prove(f"{what}: the loop runs at state k", z3.BoolVal(False), condition)
        show = {"run start": term(first[0]), "run stop": term(first[1])}
        prove(f"{what}: run k is the stated run k", _same_run(first, now), condition, show)
        if second is None:
            prove(f"{what}: the code stops only where the stated loop does", ~more, condition)
        else:
            show = {"next start": term(second[0]), "next stop": term(second[1])}
            prove(f"{what}: run k + 1 is the stated run k + 1", more, condition, show)
            prove(f"{what}: run k + 1 is the stated run k + 1", _same_run(second, after),
                  condition, show)  # fmt: skip


def key_blocks_are_stated() -> str:
    """``J_t = [tb, min((t+1)b, n_k))`` for ``t = 0, 1, …`` while ``tb < n_k``."""
    z3 = load()
    t_, b_, n_k_ = ints("t b n_k")

    def block(t: Any) -> tuple[Any, Any]:
        return t * b_, z3.If((t + 1) * b_ <= n_k_, (t + 1) * b_, n_k_)

    paths = Paths([b_ >= 1, n_k_ >= 1, t_ >= 0, t_ * b_ < n_k_])
    b, n_k = paths.symbol("b"), paths.symbol("n_k")
    start = SymInt(t_ * b_, paths)
    run = functools.partial(algorithm.key_block, block_size=b, n_k=n_k)
    stated = (block(t_), block(t_ + 1), (t_ + 1) * b_ < n_k_)
    _prove_loop_step("key blocks", paths, lambda: algorithm.runs(start, n_k, run), stated)
    return "the step from any block t (tiles() starts the loop at 0 = 0·b)"


def row_runs_are_stated() -> str:
    """A span ``[s, e)``: ``w = max(1, ρ)`` (a ``row_block``) or ``max(1, e − s)``, ``w₀ =
    min(w, b)`` with ``edge`` else ``w``; the runs are ``[f, min(f + w', e))`` for ``f = f_0
    = s, f_1 = s + w₀, f_{k+1} = f_k + w`` while ``f < e``, ``w' = w₀`` for the first, ``w``
    after it. The state is ``(first?, f)``, with the invariant ``f = s`` for the first run
    and ``f ≥ s + w₀`` after it (checked to be kept)."""
    z3 = load()
    checked = 0
    f_, s_, e_, b_, rho_ = ints("f s e b rho")
    is_first = z3.Bool("first")
    for row_block, edge in ((None, False), (rho_, False), (rho_, True)):
        w = z3.If(rho_ >= 1, rho_, 1) if row_block is not None else z3.If(e_ - s_ >= 1, e_ - s_, 1)
        w0 = z3.If(w <= b_, w, b_) if edge else w
        width = z3.If(is_first, w0, w)
        end = f_ + width
        now = (f_, z3.If(end <= e_, end, e_))
        after = (end, z3.If(end + w <= e_, end + w, e_))  # the run after it is not a first
        invariant = z3.If(is_first, f_ == s_, f_ >= s_ + w0)
        paths = Paths([b_ >= 1, invariant, f_ < e_])
        s, e, b = paths.symbol("s"), paths.symbol("e"), paths.symbol("b")
        rho = None if row_block is None else paths.symbol("rho")
        start = paths.symbol("f")

        def loop(s=s, e=e, b=b, rho=rho, edge=edge, start=start) -> Iterator:
            widths = algorithm.run_widths(s, e, b, rho, edge)  # inside the path: it branches
            run = functools.partial(algorithm.row_run, start=s, stop=e, widths=widths)
            return algorithm.runs(start, e, run)

        what = f"row runs (row_block {'-' if row_block is None else 'ρ'}, edge {edge})"
        _prove_loop_step(what, paths, loop, (now, after, end < e_))
        prove(f"{what}: the invariant is kept", end >= s_ + w0, [b_ >= 1, invariant, f_ < e_])
        checked += 1
    return f"{checked} kinds of split, the step from any run (the loop starts at f = s)"


# --- the code's loop is the stated loop and the previous iterator (exhaustive) ------------
class _Arbitrary(masks.Mask):
    """Spans, kinds and allowed tiles drawn at random (no contract): the loop alone is judged."""

    def __init__(self, seed: int, n_q: int) -> None:
        self.seed, self.n_q = seed, n_q

    def _rng(self, *key: int) -> random.Random:
        return random.Random(hash((self.seed, *key)))

    def row_span(self, cols: range, geometry: Geometry) -> range:
        rng = self._rng(cols.start, cols.stop)
        start = rng.randint(0, self.n_q)
        return range(start, rng.randint(max(start - 1, 0), self.n_q))

    def classify(self, rows: range, cols: range, geometry: Geometry) -> TileKind:
        return self._rng(rows.start, rows.stop, cols.start, cols.stop).choice(KINDS)

    def allowed(self, index: masks.TileIndex, geometry: Geometry) -> Any:
        rng = self._rng(index.rows.start, index.rows.stop, index.cols.start, -index.cols.stop)
        shape = (len(index.rows), len(index.cols))
        if rng.random() < 0.3:
            return np.zeros(shape, dtype=bool)  # a PARTIAL tile that allows nothing
        return np.array([rng.random() < 0.5 for _ in range(shape[0] * shape[1])]).reshape(shape)


def stated_tiles(
    mask: masks.Mask | None, geometry: Geometry, b: int, row_block: int | None, edge: bool
) -> Iterator[tuple[range, range, Any]]:
    """The stated loop (module docstring): ``(rows, cols, allowed tile or None)`` in order."""
    ctx = NumpyContext()
    n_q, n_k = geometry.n_q, geometry.n_k
    edge = edge and mask is not None and row_block is not None
    for t in range(-(-n_k // b)):
        cols = range(t * b, min((t + 1) * b, n_k))
        span = range(n_q) if mask is None else mask.row_span(cols, geometry)
        size = max(span.stop - span.start, 0)
        w = max(1, size if row_block is None else row_block)
        w0 = min(w, b) if edge else w
        firsts = [span.start, *range(span.start + w0, span.stop, w)]
        for f in firsts if size else []:
            rows = range(f, min(f + (w0 if f == span.start else w), span.stop))
            kind = TileKind.FULL if mask is None else mask.classify(rows, cols, geometry)
            if kind is TileKind.EMPTY:
                continue
            allowed = None
            if kind is TileKind.PARTIAL:
                allowed = mask.allowed(masks.tile_index(ctx, geometry, rows, cols), geometry)
                if not np.any(allowed):
                    continue
            yield rows, cols, allowed


def previous_tiles(ctx, mask, geometry, block_size, row_block=None, edge_first=False):
    """``algorithm.tiles`` as it was before its integer logic became the formulas z3 checks
    (kept as its twin: the two must give the same tiles)."""
    for start in range(0, geometry.n_k, block_size):
        cols = range(start, min(start + block_size, geometry.n_k))
        span = range(geometry.n_q) if mask is None else mask.row_span(cols, geometry)
        step = max(1, len(span) if row_block is None else row_block)
        edge = edge_first and mask is not None and row_block is not None
        first = span.start
        while first < span.stop:
            size = min(step, block_size) if edge and first == span.start else step
            rows = range(first, min(first + size, span.stop))
            first = rows.stop
            kind = TileKind.FULL if mask is None else mask.classify(rows, cols, geometry)
            if kind is TileKind.EMPTY:
                continue
            allowed = None
            if kind is TileKind.PARTIAL:
                allowed = mask.allowed(masks.tile_index(ctx, geometry, rows, cols), geometry)
                if not ctx.any(allowed):
                    continue
            yield rows, cols, allowed


LOOP_N = 6
ROW_BLOCKS = (None, 1, 2, 3)


def code_is_the_stated_loop() -> str:
    """``tiles()`` against the stated loop and against :func:`previous_tiles`: the same
    tiles in the same order with the same allowed tiles, EMPTY / FULL / PARTIAL and
    nothing-allowed tiles drawn at random (the tile dispatch reads only a tile's kind and
    allowed tile, so these cases are all it has)."""
    ctx, runs = NumpyContext(), 0
    for n_q, n_k in itertools.product(range(1, LOOP_N + 1), repeat=2):
        geometry = Geometry(n_q, n_k)
        for mask in (None, *(_Arbitrary(seed, n_q) for seed in range(3))):
            for b, row_block, edge in itertools.product(
                range(1, n_k + 2), ROW_BLOCKS, (False, True)
            ):
                code = [
                    (t.index.rows, t.index.cols, t.allowed)
                    for t in algorithm.tiles(ctx, mask, geometry, b, row_block, edge_first=edge)
                ]
                point = (mask, n_q, n_k, b, row_block, edge)
                _compare(code, list(stated_tiles(mask, geometry, b, row_block, edge)), *point)
                twin = list(previous_tiles(ctx, mask, geometry, b, row_block, edge))
                _compare(code, twin, *point, against="the previous iterator")
                runs += 1
    return f"{runs} loops"


def _compare(
    code: list, stated: list, mask: Any, n_q: int, n_k: int, b: int, row_block, edge: bool,
    against: str = "the stated loop",
) -> None:  # fmt: skip
    for k, (x, y) in enumerate(itertools.zip_longest(code, stated)):
        if x is None or y is None or not _same_tile(x, y):
            point = {"mask": "none" if mask is None else f"arbitrary seed {mask.seed}"}
            point.update(n_q=str(n_q), n_k=str(n_k), b=str(b), row_block=str(row_block))
            point.update(edge_first=str(edge))
            raise Refuted(Counterexample(
                f"tiles() vs {against}, tile {k}", point, _show(x), _show(y), "≠",
            ))  # fmt: skip


def _same_tile(x: tuple, y: tuple) -> bool:
    if x[:2] != y[:2] or (x[2] is None) != (y[2] is None):
        return False
    return x[2] is None or np.array_equal(np.asarray(x[2]), np.asarray(y[2]))


def _show(tile: tuple | None) -> str:
    if tile is None:
        return "no tile"
    rows, cols, allowed = tile
    kind = "all pairs" if allowed is None else f"allowed {np.asarray(allowed).astype(int).tolist()}"
    return f"rows {rows.start}..{rows.stop - 1} × keys {cols.start}..{cols.stop - 1}, {kind}"


# --- the family ----------------------------------------------------------------------------
WINDOW = (
    "window_allows is the definition, both alignments",
    "window_row_span holds every row with an allowed key, in [0, n_q)",
    "window_tile_kind: EMPTY ⇒ none allowed, FULL ⇒ all allowed",
)
PADDING = (
    "padding_tile_kind: EMPTY ⇒ none allowed, FULL ⇒ all allowed",
    "padding_row_span holds every row with an allowed key, in [0, n_q)",
)
COMPOSITION = (
    "And/Or.classify meet the kind contract (parts' contracts)",
    "And/Or.row_span meet the span contract (parts' contracts)",
)
LOOP = (
    "the loop's runs and key blocks partition their range",
    "the stated loop counts a pair iff allowed, rows in [0, n_q)",
    "tiles() = the stated loop and its previous twin (tiles, order)",
    "tiles()'s key blocks are the stated J_t (its formulas)",
    "tiles()'s row runs are the stated runs (its formulas)",
)
LOWERING = "Mask.lower / Band.intersect allow what the mask allows"
# The obligations the iterator's correctness for all n rests on, per mask kind (a mask
# without structure — none, a caller's table — meets the contracts trivially: every tile
# PARTIAL, every row in the span).
FOR_ALL_N = {
    "none": LOOP,
    "every table": LOOP,
    "causal": LOOP + WINDOW,
    "window": LOOP + WINDOW,
    "padding": LOOP + PADDING,
    "and": LOOP + WINDOW + PADDING + COMPOSITION,
    "or": LOOP + WINDOW + PADDING + COMPOSITION,
}


def obligations(max_n: int = 4) -> list[Obligation]:
    every = "all n, offsets, sides"
    sizes = {
        WINDOW[0]: "all n, i, j, sides", WINDOW[1]: every, WINDOW[2]: every + ", rows",
        PADDING[0]: "all lengths, blocks", PADDING[1]: "all n, lengths, blocks",
        COMPOSITION[0]: "1–3 parts, depth 2",
        COMPOSITION[1]: "1–3 parts, order types", LOOP[0]: "all s, e, w",
        LOOP[1]: "all n (contracts)", LOWERING: "all n, sides, lengths",
        LOOP[2]: f"n_q, n_k ≤ {LOOP_N}, b=1..n_k+1, row_block ∈ {{-,1,2,3}}, edge",
        LOOP[3]: "all n_k, b, t", LOOP[4]: "all spans, b, row_block, edge",
    }  # fmt: skip
    checks = {
        WINDOW[0]: window_definition, WINDOW[1]: window_span, WINDOW[2]: window_kind,
        PADDING[0]: padding_kind, PADDING[1]: padding_span, COMPOSITION[0]: composition_kinds,
        COMPOSITION[1]: composition_spans, LOOP[0]: loop_partition, LOOP[1]: loop_counts,
        LOWERING: lowering, LOOP[2]: code_is_the_stated_loop,
        LOOP[3]: key_blocks_are_stated, LOOP[4]: row_runs_are_stated,
    }  # fmt: skip
    out = [Obligation(FAMILY, name, sizes[name], check) for name, check in checks.items()]
    return out + blockmask.obligations()
