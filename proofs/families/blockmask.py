"""A torch ``BlockMask`` for every length: ``create_block_mask``'s classes and exactattn's use.

A ``BlockMask`` carries, per block of ``Q × K`` positions (``BLOCK_SIZE = (Q, K)``), a class:
FULL, PARTIAL or EMPTY. exactattn reads it into :class:`exactattn.core.masks.FlexBlockMask`,
whose tiles (of any key width ``b``, not only ``K``) take their kind and row span from the
classes. Proved for all ``n_q, n_k, Q, K``, every tile and every block classification:

* **the construction** (``create_block_mask`` → ``_convert_mask_to_block_mask``, restated
  from torch's source): the mask is padded with False to ``⌈n/Q⌉·Q`` (its
  ``_round_up_to_multiple``), viewed as blocks, and a block is FULL iff its sum is ``Q·K``,
  EMPTY iff it is 0. The padded length is ``≥ n``, a multiple of ``Q`` and ``< n + Q``, with
  ``⌈n/Q⌉`` blocks — the count ``from_block_mask`` checks; a real position ``p < n`` is
  offset ``p mod Q`` of block ``⌊p/Q⌋``; a block that reaches past ``n`` holds the padding
  position ``n``, so its sum is below ``Q·K`` and it is never FULL. Hence (a sum of 0/1
  terms is its count) FULL ⇒ every pair of the block is real and allowed, EMPTY ⇒ none is:
  **the classes are sound**. (``FlexBlockMask.validate`` also checks this at run time, for
  BlockMasks built by hand.)
* **exactattn's use**: ``FlexBlockMask.classify`` reads the classes of the blocks
  ``blocks_of(rows)`` × ``blocks_of(cols)`` (a NumPy slice, clipped to the ``⌈n/Q⌉`` blocks)
  and ``row_span`` the rows ``block_rows(first, last)`` of the first and last query block
  with a non-EMPTY class among the key blocks: every pair of the tile lies in a block the
  slice holds, so all EMPTY ⇒ no pair allowed and all FULL ⇒ every pair allowed, and every
  row with an allowed key in the tile's keys lies in the span, which lies in ``[0, n_q)``.
  ``blocks_of`` and ``block_rows`` are the code's own functions, run on z3 terms; the
  classes and the predicate are uninterpreted, constrained only by soundness.

With the iterator's all-n obligations this is link 1 of the chains for a BlockMask: the
tiles of ``attention(..., mask=create_block_mask(mask_mod, ...))`` visit exactly the pairs
its mask_mod allows, for every length.
"""

from __future__ import annotations

from typing import Any

from exactattn.core import masks

from ..engine import solver
from ..engine.ledger import Obligation
from ..engine.solver import Z3

FAMILY = "smt"
CONSTRUCTION = "create_block_mask's classes are sound (padding, ⌈n/Q⌉ blocks)"
KIND = "FlexBlockMask.classify: EMPTY ⇒ none allowed, FULL ⇒ all (sound classes)"
SPAN = "FlexBlockMask.row_span holds every row with an allowed key, in [0, n_q)"
NAMES = (CONSTRUCTION, KIND, SPAN)


def round_up(n: Any, size: Any) -> Any:
    """torch's ``_round_up_to_multiple(n, Q) = (n + Q − 1) // Q · Q`` (the padded length),
    on z3 terms (``/`` is SMT-LIB's floor division for ``Q > 0``)."""
    return (n + size - 1) / size * size


def construction() -> str:
    """torch's padding and block view, for every length and block size."""
    z3 = solver.load()
    n, size, p, x = z3.Ints("n Q p x")
    rounded = round_up(n, size)
    hyps = [n >= 1, size >= 1]
    solver.prove(
        "padded length: ≥ n, a multiple of Q, < n + Q, ⌈n/Q⌉ blocks (from_block_mask's count)",
        z3.And(rounded >= n, rounded % size == 0, rounded < n + size,
               rounded / size == -(-n / size)),
        hyps,
        {"padded": rounded},
    )  # fmt: skip
    solver.prove(
        "a real position p < n is offset p mod Q of block ⌊p/Q⌋, a block of the view",
        z3.And(p == p / size * size + p % size, p % size >= 0, p % size < size,
               p / size < rounded / size),
        [*hyps, p >= 0, p < n],
    )  # fmt: skip
    solver.prove(
        "a block reaching past n holds the padding position n (so it is never FULL)",
        z3.And(x * size <= n, n < x * size + size, n < rounded),
        [*hyps, x >= 0, x < rounded / size, x * size + size > n],
    )
    return "all n, Q"


class _Blocks:
    """Uninterpreted classes ``cls(x, y)`` of a grid of ``Q × K`` blocks, sound for an
    uninterpreted predicate ``allowed(i, j)`` on ``[0, n_q) × [0, n_k)``."""

    def __init__(self) -> None:
        z3 = solver.load()
        self.n_q, self.n_k, self.Q, self.K = z3.Ints("n_q n_k Q K")
        self.cls = z3.Function("cls", z3.IntSort(), z3.IntSort(), z3.IntSort())
        self.allowed = z3.Function("allowed", z3.IntSort(), z3.IntSort(), z3.BoolSort())
        i, j = z3.Ints("pi pj")
        block = self.cls(i / self.Q, j / self.K)
        real = z3.And(i >= 0, i < self.n_q, j >= 0, j < self.n_k)
        sound = z3.And(
            z3.Implies(block == masks.BLOCK_FULL, self.allowed(i, j)),
            z3.Implies(block == masks.BLOCK_EMPTY, z3.Not(self.allowed(i, j))),
        )
        self.rows_of_blocks = -(-self.n_q / self.Q)  # the classes' shape: ⌈n/Q⌉ × ⌈n/K⌉
        self.cols_of_blocks = -(-self.n_k / self.K)
        self.hypotheses = [
            self.n_q >= 1, self.n_k >= 1, self.Q >= 1, self.K >= 1,
            z3.ForAll([i, j], z3.Implies(real, sound)),
        ]  # fmt: skip

    def every(self, rows: tuple[Any, Any], cols: tuple[Any, Any], kind: int) -> Any:
        """Every class of the slice ``classes[rows, cols]`` (clipped to the grid) is ``kind``."""
        z3 = solver.load()
        x, y = z3.Ints("bx by")
        inside = z3.And(
            rows[0] <= x, x < rows[1], x < self.rows_of_blocks,
            cols[0] <= y, y < cols[1], y < self.cols_of_blocks,
        )  # fmt: skip
        return z3.ForAll([x, y], z3.Implies(inside, self.cls(x, y) == kind))


def _tile(world: _Blocks) -> tuple[list[Any], Any, Any, Any, Any, Any, Any]:
    z3 = solver.load()
    r0, r1, a, e, i, j = z3.Ints("r0 r1 a e i j")
    hyps = [r0 >= 0, r0 < r1, r1 <= world.n_q, a >= 0, a < e, e <= world.n_k]
    hyps += [r0 <= i, i < r1, a <= j, j < e]
    return hyps, r0, r1, a, e, i, j


def kind() -> str:
    z3 = solver.load()
    world = _Blocks()
    hyps, r0, r1, a, e, i, j = _tile(world)
    rows, cols = masks.blocks_of(r0, r1, world.Q, Z3), masks.blocks_of(a, e, world.K, Z3)
    solver.prove(
        "classify: every class EMPTY ⇒ (i, j) not allowed",
        z3.Implies(world.every(rows, cols, masks.BLOCK_EMPTY), z3.Not(world.allowed(i, j))),
        [*world.hypotheses, *hyps],
        {"query blocks": rows[0], "to": rows[1], "key blocks": cols[0], "to ": cols[1]},
    )
    solver.prove(
        "classify: every class FULL ⇒ (i, j) allowed",
        z3.Implies(world.every(rows, cols, masks.BLOCK_FULL), world.allowed(i, j)),
        [*world.hypotheses, *hyps],
        {"query blocks": rows[0], "to": rows[1], "key blocks": cols[0], "to ": cols[1]},
    )
    return "all n, Q, K, tiles, classes"


def span() -> str:
    z3 = solver.load()
    world = _Blocks()
    hyps, _, _, a, e, i, j = _tile(world)
    first, last = z3.Ints("first last")
    cols = masks.blocks_of(a, e, world.K, Z3)
    x, y = i / world.Q, j / world.K
    solver.prove(
        "row_span: an allowed (i, j) with j in the keys makes block ⌊i/Q⌋ non-EMPTY, in range",
        z3.Implies(
            world.allowed(i, j),
            z3.And(world.cls(x, y) != masks.BLOCK_EMPTY, cols[0] <= y, y < cols[1],
                   y < world.cols_of_blocks, x >= 0, x < world.rows_of_blocks),
        ),
        [*world.hypotheses, *hyps],
    )  # fmt: skip
    start, stop = masks.block_rows(first, last, world.Q, world.n_q, Z3)
    used = [first >= 0, first <= x, x <= last, last < world.rows_of_blocks]
    solver.prove(
        "row_span: block_rows(first, last) holds a row of a used block between them, ⊆ [0, n_q)",
        z3.And(start <= i, i < stop, start >= 0, start <= stop, stop <= world.n_q),
        [*world.hypotheses, *hyps, *used],
        {"start": start, "stop": stop},
    )
    return "all n, Q, K, keys, classes"


def obligations() -> list[Obligation]:
    return [
        Obligation(FAMILY, CONSTRUCTION, "all n, Q (torch's padding and view)", construction),
        Obligation(FAMILY, KIND, "all n, Q, K, tiles, classes", kind),
        Obligation(FAMILY, SPAN, "all n, Q, K, keys, classes", span),
    ]
