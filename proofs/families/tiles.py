"""Family 7 — the tile iterator visits every allowed (b, i, j) exactly once (exhaustive).

Theorem (at the sizes below). For every mask of the catalogue — sliding windows (left,
right ∈ {None, 0, 2}: causal is (None, 0)) in both alignments, key padding over a batch
(with lengths shared across heads), a caller's table, and the ∧ / ∨ compositions of two
and of three of them — every ``n_q, n_k`` up to N, every key-block size ``b = 1..n_k+1``
and every ``row_block`` in {None, 1, 2, 3}, the library's ``algorithm.tiles``:

* yields only rows in ``[0, n_q)`` and keys in ``[0, n_k)``, and an allowed tile (PARTIAL)
  that broadcasts to exactly the tile's ``(*batch, r, c)``;
* counts every pair the specification allows (:mod:`proofs.spec`: inequalities) exactly
  once and every other pair never — a FULL tile contributes all its pairs, a PARTIAL one
  the pairs its allowed tile marks, an EMPTY one (skipped) none.

This is the statement the induction of the ``general`` family needs (``U_T = A_i``), run
end to end; it runs no arithmetic, only the iterator and the masks' ``classify``,
``row_span`` and ``tile``. For all n it follows from the ``smt`` family (``tiles()``'s own
formulas are the stated loop, and the masks' contracts) where that family is PROVED; here
it is checked without trusting any of it, as the independent end-to-end check. N = 8 for
the single masks and 6 for compositions by default (the all-n proof carries the claim
beyond; 12 and 8 took ~30 s of CPU, half the default run's budget); ``--max-n N`` raises
both to at least N (``exactattn prove tiles --max-n 12``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from exactattn.backends import NumpyContext
from exactattn.core import algorithm, masks

from ..engine import symbolic_spec
from ..engine.counterexamples import Counterexample
from ..engine.ledger import Obligation, Refuted

FAMILY = "tiles"
SIDES = (None, 0, 2)
ROW_BLOCKS = (None, 1, 2, 3)


@dataclass(frozen=True)
class Case:
    """A library mask with its definition; ``batch`` is the leading shape it runs under."""

    name: str
    mask: masks.Mask | None
    allowed: symbolic_spec.Allowed
    batch: tuple[int, ...] = ()


def _window_cases(alignment: str) -> Iterator[Case]:
    short = "TL" if alignment == "top-left" else "BR"
    for left, right in itertools.product(SIDES, SIDES):
        yield Case(
            f"window({left},{right}) {short}",
            masks.sliding_window(left, right, alignment),
            symbolic_spec.window(left, right, alignment),
        )


def single_cases(n_q: int, n_k: int) -> list[Case]:
    """Every single mask of the catalogue for an ``n_q × n_k`` problem."""
    table = np.random.default_rng(n_q * 100 + n_k).random((n_q, n_k)) < 0.5
    out = [
        Case("no mask", None, symbolic_spec.everything()),
        Case("a caller's table", masks.dense(table), symbolic_spec.dense(table)),
    ]
    for alignment in masks.ALIGNMENTS:
        out += list(_window_cases(alignment))
    for lengths in ((n_k, 0), (max(n_k - 1, 0), 1), ((n_k + 1) // 2, n_k)):
        for batch in ((2,), (2, 3)):  # lengths shared across 3 heads in the second
            mask = masks.key_padding(np.array(lengths))
            out.append(
                Case(f"padding{lengths} batch={batch}", mask, symbolic_spec.padding(lengths), batch)
            )
    return out


def _parts(n_q: int, n_k: int) -> list[Case]:
    """The masks compositions are built from (one per kind and alignment)."""
    lengths = ((n_k + 1) // 2, n_k)
    return [
        Case("causal TL", masks.causal(), symbolic_spec.causal()),
        Case("causal BR", masks.causal("bottom-right"), symbolic_spec.causal("bottom-right")),
        Case("window(1,0) TL", masks.sliding_window(1, 0), symbolic_spec.window(1, 0)),
        Case("window(None,2) TL", masks.sliding_window(None, 2), symbolic_spec.window(None, 2)),
        Case(
            "window(2,1) BR",
            masks.sliding_window(2, 1, "bottom-right"),
            symbolic_spec.window(2, 1, "bottom-right"),
        ),
        Case("padding", masks.key_padding(np.array(lengths)), symbolic_spec.padding(lengths), (2,)),
    ]


def _combine(op: str, *cases: Case) -> Case:
    batch = max((c.batch for c in cases), key=len)
    mask = (
        masks.and_masks(*(c.mask for c in cases))
        if op == "∧"
        else masks.or_masks(*(c.mask for c in cases))
    )
    allowed = cases[0].allowed
    for c in cases[1:]:
        allowed = allowed & c.allowed if op == "∧" else allowed | c.allowed
    return Case(f" {op} ".join(f"({c.name})" for c in cases), mask, allowed, batch)


def composite_cases(n_q: int, n_k: int) -> list[Case]:
    """Every ∧ and ∨ of two parts, and (a op b) op' c for every op, op' and triple of kinds."""
    parts = _parts(n_q, n_k)
    out = [_combine(op, a, b) for op in "∧∨" for a, b in itertools.permutations(parts, 2)]
    for op, op2 in itertools.product("∧∨", repeat=2):
        for a, b, c in itertools.combinations(parts, 3):
            out.append(_combine(op2, _combine(op, a, b), c))
    return out


# --- the check -----------------------------------------------------------------------------
CTX = NumpyContext()


def visit_counts(case: Case, n_q: int, n_k: int, b: int, row_block: int | None) -> np.ndarray:
    """How many times the iterator counts each (b, i, j); raises on an out-of-range tile."""
    geometry = masks.Geometry(n_q=n_q, n_k=n_k, batch=case.batch)
    counts = np.zeros((*case.batch, n_q, n_k), dtype=np.int64)
    for tile in algorithm.tiles(CTX, case.mask, geometry, b, row_block):
        rows, cols = tile.rows, tile.cols
        if not (0 <= rows.start < rows.stop <= n_q and 0 <= cols.start < cols.stop <= n_k):
            where = f"a tile rows {rows} × keys {cols}"
            raise _refuted(case, n_q, n_k, b, row_block, where, "inside the grid")
        if tile.allowed is None:
            counts[..., rows, cols] += 1
            continue
        shape = (*case.batch, rows.stop - rows.start, cols.stop - cols.start)
        got = np.shape(tile.allowed)
        if len(got) > len(shape) or any(g not in (1, s) for g, s in zip(got[::-1], shape[::-1])):
            got = f"an allowed tile of shape {got}"
            raise _refuted(case, n_q, n_k, b, row_block, got, f"of shape {shape}")
        counts[..., rows, cols] += tile.allowed
    return counts


def _refuted(case: Case, n_q: int, n_k: int, b: int, row_block, lhs: str, rhs: str) -> Refuted:
    point = {"mask": case.name, "n_q": str(n_q), "n_k": str(n_k), "b": str(b)}
    point.update({"row_block": str(row_block), "batch": str(case.batch)})
    return Refuted(Counterexample("tile iterator", point, lhs, rhs, "should be"))


def check_case(case: Case, n_q: int, n_k: int) -> int:
    """Every b and row_block for one mask and size; the number of iterations checked."""
    want = case.allowed.grid(case.batch, n_q, n_k).astype(np.int64)
    runs = 0
    for b in range(1, n_k + 2):
        for row_block in ROW_BLOCKS:
            counts = visit_counts(case, n_q, n_k, b, row_block)
            if not np.array_equal(counts, want):
                index = tuple(int(x) for x in np.argwhere(counts != want)[0])
                raise _refuted(
                    case, n_q, n_k, b, row_block,
                    f"(b, i, j) = {index} counted {counts[index]} time(s)",
                    f"{want[index]} (allowed: {case.allowed.text})",
                )  # fmt: skip
            runs += 1
    return runs


def _family_check(cases_of, n_max: int):
    def check() -> str:
        runs = 0
        for n_q, n_k in itertools.product(range(1, n_max + 1), repeat=2):
            for case in cases_of(n_q, n_k):
                runs += check_case(case, n_q, n_k)
        return f"{runs} iterations"

    return check


SINGLE_N, COMPOSITE_N = 8, 6


def obligations(max_n: int = 4) -> list[Obligation]:
    single_n, composite_n = max(SINGLE_N, max_n), max(COMPOSITE_N, max_n)
    singles, composites = len(single_cases(1, 1)), len(composite_cases(1, 1))
    return [
        Obligation(
            FAMILY,
            f"every allowed (b, i, j) visited once: {singles} single masks",
            f"n_q, n_k ≤ {single_n}, b=1..n_k+1, row_block ∈ {{-,1,2,3}}",
            _family_check(single_cases, single_n),
        ),
        Obligation(
            FAMILY,
            f"every allowed (b, i, j) visited once: {composites} ∧/∨ compositions",
            f"n_q, n_k ≤ {composite_n}, b=1..n_k+1, row_block ∈ {{-,1,2,3}}",
            _family_check(composite_cases, composite_n),
        ),
    ]
