"""The interfaces for every length: varlen, paged, split-KV merge and sinks (all n).

The enumerated theorems of :mod:`proofs.interfaces` run the library end to end at small
sizes; these are the links that carry them to every length, each about the code that runs:

* **varlen.** ``PackedSequences.tile`` (its own code, run on z3 terms) allows ``(i, j)`` iff
  some sequence ``s`` owns both (``cu_q[s] ≤ i < cu_q[s+1]``, ``cu_k[s] ≤ j < cu_k[s+1]``)
  and the window allows the local positions, aligned bottom-right (``o_s = len_k − len_q``):
  a packed batch is the block-diagonal mask, so per-sequence attention is the forward and
  reverse theorems for that mask. Its structure meets the contracts the iterator needs:
  ``packed_tile_kind`` (EMPTY ⇒ no pair allowed, FULL ⇒ every pair) and the row span (every
  row with an allowed key in the keys' block). For every number of sequences ``S``, every
  nondecreasing ``cu_q``, ``cu_k`` from 0 (uninterpreted functions; what
  ``check_cu_seqlens`` validates), every window side (unbounded or any ``L, R ≥ 0``) and
  every tile. The maps ``query_seq``, ``query_pos``, ``key_seq``, ``key_pos`` are restated
  from their construction (``searchsorted(cu, p, 'right') − 1`` is the ``s`` with
  ``cu[s] ≤ p < cu[s+1]``; ``query_pos = i − cu_q[s] + o_s``; ``key_pos = j − cu_k[s]``).
* **paged.** ``cache_row`` puts key ``t`` of a sequence at page ``table[b, ⌊t/P⌋]``, row
  ``t mod P`` of the cache flattened to ``N·P`` rows, and ``new_row`` the appended key
  ``t − L_b`` at row ``b·n_new + t − L_b`` of the new keys after them: the gather is the
  layout's definition for every page size ``P``, pool ``N``, table, length and position; the
  keys then attend as a packed batch (the varlen link).
* **split-KV merge.** ``merge_partials`` over ``k`` free partials ``(y_t, lse_t)`` is
  ``Σ_t e^{lse_t} y_t / Σ_t e^{lse_t}`` with ``e^lse = Σ_t e^{lse_t}`` (k = 1..4, the loop's
  base and steps); for any k, order and bracketing it follows from a partial being the
  summary ``(lse, 1, y)``, ``φ(a ⋆ b) = φ(a) + φ(b)`` (Lemma B) and Lemma C, by induction
  on the parts (a nested merge is again a partial).
* **sinks.** ``sinks.initial_summary`` is ``(σ_h, 1, 0)`` with ``φ = (e^{σ_h}, 0)``, so the
  fold from it (Lemma B, the forward's links) has ``φ_ℓ = e^σ + Σ_j e^{s_ij}``,
  ``φ_z = Σ_j e^{s_ij} V_j``, and Lemma C gives ``Y`` and ``lse`` with the sink; and
  ``sink_gradient`` is ``∂L/∂σ_h`` of ``L = Σ_i G_i·Y_i`` for rows of any width (each row's
  ``Σ_j e^{s_ij}`` and ``Σ_j e^{s_ij} V_j`` are free symbols), the frozen statistics being
  the forward's with the sink (dQ, dK, dV are Lemmas P, F, D, E with those statistics).

Each has a broken twin in :mod:`proofs.mutants`.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import sympy

import exactattn
from exactattn.core import masks, sinks
from exactattn.layouts import paged

from ..engine import solver
from ..engine.context import ProofContext
from ..engine.dual import derivatives
from ..engine.ledger import Obligation, check_equal
from ..engine.solver import Z3

FAMILY = "interfaces"
VARLEN_MASK = "all n: a packed batch is the block-diagonal mask (PackedSequences.tile)"
VARLEN_STRUCTURE = "all n: packed_tile_kind and the packed row span meet the contracts"
PAGED_GATHER = "all n: the paged gather reads key t at page table[b, ⌊t/P⌋], row t mod P"
MERGE_FOLD = "merge_partials of k free partials = Σ_t e^{lse_t} y_t / Σ_t e^{lse_t}"
SINK_START = "all n: a sink's row starts at (σ, 1, 0), φ = (e^σ, 0)"
SINK_GRADIENT = "all n: dσ = −Σ_i p_σ,i δ_i = ∂L/∂σ (rows of any width)"


# --- varlen: packed sequences over z3 ------------------------------------------------------
class _Packed:
    """``S`` sequences with nondecreasing offsets ``cu_q``, ``cu_k`` from 0 (z3 functions),
    and the owner of each position the code looks up (a fresh constant per position)."""

    def __init__(self) -> None:
        z3 = solver.load()
        self.S = z3.Int("S")
        self.cu_q = z3.Function("cu_q", z3.IntSort(), z3.IntSort())
        self.cu_k = z3.Function("cu_k", z3.IntSort(), z3.IntSort())
        a, b = z3.Ints("a b")
        rising = [
            z3.ForAll([a, b], z3.Implies(z3.And(a >= 0, a <= b, b <= self.S), cu(a) <= cu(b)))
            for cu in (self.cu_q, self.cu_k)
        ]
        self.hypotheses = [self.S >= 1, self.cu_q(0) == 0, self.cu_k(0) == 0, *rising]
        self._owners: dict[str, Any] = {}

    def owner(self, cu: Any, p: Any) -> Any:
        """``searchsorted(cu, p, 'right') − 1``: the ``s`` with ``cu[s] ≤ p < cu[s+1]``."""
        key = f"{cu}({p})"
        if key not in self._owners:
            z3 = solver.load()
            s = z3.Int(f"seq_{cu}_{len(self._owners)}")
            self.hypotheses += [s >= 0, s < self.S, cu(s) <= p, p < cu(s + 1)]
            self._owners[key] = s
        return self._owners[key]

    def offset(self, s: Any) -> Any:
        """``o_s = len_k(s) − len_q(s)``."""
        return (self.cu_k(s + 1) - self.cu_k(s)) - (self.cu_q(s + 1) - self.cu_q(s))

    def code(self, left: Any, right: Any) -> masks.PackedSequences:
        """A ``PackedSequences`` whose maps are these symbols (its ``tile`` is the code)."""
        out = masks.PackedSequences.__new__(masks.PackedSequences)
        query_seq = _Lookup(lambda i: self.owner(self.cu_q, i))
        key_seq = _Lookup(lambda j: self.owner(self.cu_k, j))
        query_pos = _Lookup(lambda i: i - self.cu_q(query_seq[i]) + self.offset(query_seq[i]))
        key_pos = _Lookup(lambda j: j - self.cu_k(key_seq[j]))
        out.__dict__.update(maps=(query_seq, query_pos, key_seq, key_pos), left=left, right=right)
        return out

    def allowed(self, s: Any, i: Any, j: Any, left: Any, right: Any) -> Any:
        """The definition: sequence ``s`` owns ``i`` and ``j`` and its window allows them."""
        z3 = solver.load()
        i_local, j_local, o = i - self.cu_q(s), j - self.cu_k(s), self.offset(s)
        out = [s >= 0, s < self.S, self.cu_q(s) <= i, i < self.cu_q(s + 1)]
        out += [self.cu_k(s) <= j, j < self.cu_k(s + 1)]
        if left is not None:
            out.append(j_local >= i_local + o - left)
        if right is not None:
            out.append(j_local <= i_local + o + right)
        return z3.And(*out)

    def in_range(self, i: Any, j: Any) -> list[Any]:
        return [i >= 0, i < self.cu_q(self.S), j >= 0, j < self.cu_k(self.S)]


class _Lookup:
    """An index map as the mask's code reads it (``map[i]``), returning z3 terms."""

    def __init__(self, at: Any) -> None:
        self.at = at

    def __getitem__(self, x: Any) -> Any:
        return self.at(x)


def _sides() -> list[tuple[Any, Any, str]]:
    """Window sides: unbounded (None) or a symbolic ``L, R ≥ 0``."""
    z3 = solver.load()
    left, right = z3.Ints("L R")
    return [
        (lo, hi, f"left={'L' if lo is not None else '-'}, right={'R' if hi is not None else '-'}")
        for lo, hi in itertools.product((None, left), (None, right))
    ]


def _nonnegative(left: Any, right: Any) -> list[Any]:
    return [side >= 0 for side in (left, right) if side is not None]


def varlen_mask() -> str:
    z3 = solver.load()
    for left, right, sides in _sides():
        world = _Packed()
        i, j, s = z3.Ints("i j s")
        tile = world.code(left, right).tile(i, j, None)
        tile = solver.boolean(tile)
        hyps = [*world.in_range(i, j), *_nonnegative(left, right)]
        owner = world.owner(world.cu_q, i)
        solver.prove(
            f"PackedSequences.tile ({sides}) ⇒ the definition (i's own sequence)",
            z3.Implies(tile, world.allowed(owner, i, j, left, right)),
            [*world.hypotheses, *hyps],
        )
        solver.prove(
            f"the definition (any sequence s) ⇒ PackedSequences.tile ({sides})",
            z3.Implies(world.allowed(s, i, j, left, right), tile),
            [*world.hypotheses, *hyps],
        )
    return "4 window kinds, all S, offsets, i, j"


def varlen_structure() -> str:
    z3 = solver.load()
    for left, right, sides in _sides():
        world = _Packed()
        r0, r1, a, e, i, j, s = z3.Ints("r0 r1 a e i j s")
        hyps = [r0 >= 0, r0 < r1, r1 <= world.cu_q(world.S), a >= 0, a < e]
        hyps += [e <= world.cu_k(world.S), r0 <= i, i < r1, a <= j, j < e]
        hyps += _nonnegative(left, right)
        # PackedSequences.classify's lookups, then its formula
        q0, q1 = world.owner(world.cu_q, r0), world.owner(world.cu_q, r1 - 1)
        k0, k1 = world.owner(world.cu_k, a), world.owner(world.cu_k, e - 1)
        base_q, base_k = world.cu_q(q0), world.cu_k(q0)
        empty, full = masks.packed_tile_kind(
            (q0, q1, k0, k1), r0 - base_q, r1 - base_q, a - base_k, e - base_k,
            world.offset(q0), left, right, Z3,
        )  # fmt: skip
        allowed_s = world.allowed(s, i, j, left, right)
        solver.prove(
            f"packed_tile_kind ({sides}): EMPTY ⇒ (i, j) not allowed",
            solver.implies(empty, z3.Not(allowed_s)),
            [*world.hypotheses, *hyps],
        )
        solver.prove(
            f"packed_tile_kind ({sides}): FULL ⇒ (i, j) allowed",
            solver.implies(full, world.allowed(q0, i, j, left, right)),
            [*world.hypotheses, *hyps],
        )
        # PackedSequences.row_span: the queries of the sequences owning keys [a, e)
        first, last = k0, k1
        start, stop = world.cu_q(first), world.cu_q(last + 1)
        solver.prove(
            f"packed row span ({sides}): an allowed (i, j), j in [a, e), has i in the span",
            z3.Implies(allowed_s, z3.And(start <= i, i < stop)),
            [*world.hypotheses, *hyps],
        )
        solver.prove(
            f"packed row span ({sides}) lies in [0, n_q)",
            z3.And(start >= 0, start <= stop, stop <= world.cu_q(world.S)),
            [*world.hypotheses, *hyps],
        )
    return "4 window kinds, all S, offsets, tiles"


# --- paged: the gather's rows --------------------------------------------------------------
def paged_gather() -> str:
    z3 = solver.load()
    P, N, t, page, L, n_new, B, b = z3.Ints("P N t page L n_new B b")
    row = paged.cache_row(page, t, P)
    solver.prove(
        "cache_row: key t on page p is row t mod P of page p of the (N·P) flattened cache",
        z3.And(row / P == page, row % P == t % P, row >= 0, row < N * P),
        [P >= 1, N >= 1, t >= 0, page >= 0, page < N],
        {"row": row},
    )
    new = paged.new_row(N, P, b, n_new, t, L)
    base = N * P
    solver.prove(
        "new_row: position t ≥ L of sequence b is new key t − L of b, after the cache rows",
        z3.And(base <= new, new < base + B * n_new, (new - base) / n_new == b,
               (new - base) % n_new == t - L),
        [P >= 1, N >= 1, B >= 1, b >= 0, b < B, L >= 0, t >= L, t < L + n_new],
        {"row": new},
    )  # fmt: skip
    return "all P, N, tables, lengths, t"


# --- split-KV merge ------------------------------------------------------------------------
def merge_fold(max_parts: int = 4) -> str:
    for k in range(1, max_parts + 1):
        ys = [sympy.Symbol(f"y{t}", real=True) for t in range(k)]
        lses = [sympy.Symbol(f"lse{t}", real=True) for t in range(k)]
        parts = [
            (np.array([[y]], dtype=object), np.array([x], dtype=object)) for y, x in zip(ys, lses)
        ]
        y, lse = exactattn.merge_partials(parts)
        total = sum(sympy.exp(x) for x in lses)
        want = sum(sympy.exp(x) * y_t for x, y_t in zip(lses, ys)) / total
        check_equal(f"{k} parts: y", y, np.array([[want]], dtype=object))
        check_equal(f"{k} parts: e^lse", ProofContext().exp(lse), np.array([total], dtype=object))
    return f"k = 1..{max_parts}"


# --- sinks ---------------------------------------------------------------------------------
def sink_start() -> str:
    ctx = ProofContext()
    sigma = np.array([sympy.Symbol(f"sigma{h}", real=True) for h in range(2)], dtype=object)
    geometry = masks.Geometry(n_q=2, n_k=3, batch=(2,))  # two heads, two rows each
    start = sinks.initial_summary(ctx, sigma, geometry, 2)
    scale = ctx.exp(start.m)
    check_equal("φ_ℓ(initial)", start.l * scale, np.stack([[sympy.exp(s)] * 2 for s in sigma]))
    check_equal("φ_z(initial)", start.z * scale[..., None], np.zeros((2, 2, 2), dtype=int))
    return "2 heads × 2 rows"


def sink_gradient() -> str:
    ctx = ProofContext()
    sigma = sympy.Symbol("sigma", real=True)
    rows, v = 2, 2
    a = [sympy.Symbol(f"A{i}", positive=True) for i in range(rows)]  # Σ_j e^{s_ij}
    z = [[sympy.Symbol(f"Z{i}_{c}", real=True) for c in range(v)] for i in range(rows)]
    g = [[sympy.Symbol(f"g{i}_{c}", real=True) for c in range(v)] for i in range(rows)]
    m = [sympy.Symbol(f"m{i}", real=True) for i in range(rows)]  # any frozen shift
    y = [[z[i][c] / (sympy.exp(sigma) + a[i]) for c in range(v)] for i in range(rows)]
    loss = sum(g[i][c] * y[i][c] for i in range(rows) for c in range(v))
    ell = [(sympy.exp(sigma) + a[i]) * sympy.exp(-m[i]) for i in range(rows)]

    def arr(x: Any) -> np.ndarray:
        return np.array([x], dtype=object)  # batch (H = 1,)

    got = sinks.sink_gradient(
        ctx, np.array([sigma], dtype=object), arr(y), arr(g), arr(m), arr(ell)
    )
    want = derivatives("∂L/∂σ", loss, [sigma])
    check_equal("dσ vs ∂L/∂σ", got, np.array(want, dtype=object))
    return f"{rows} rows, any width"


def obligations() -> list[Obligation]:
    return [
        Obligation(FAMILY, VARLEN_MASK, "all S, cu, windows, i, j", varlen_mask),
        Obligation(FAMILY, VARLEN_STRUCTURE, "all S, cu, windows, tiles", varlen_structure),
        Obligation(FAMILY, PAGED_GATHER, "all P, N, tables, t", paged_gather),
        Obligation(FAMILY, MERGE_FOLD, "k = 1..4 free partials; all k by Lemma B", merge_fold),
        Obligation(FAMILY, SINK_START, "any σ_h, heads, rows", sink_start),
        Obligation(FAMILY, SINK_GRADIENT, "any σ, rows of any width", sink_gradient),
    ]
