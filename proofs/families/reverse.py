"""Family 3 — the block-recomputed reverse is exact.

Theorem. For every problem in the grid below and every block size ``b`` in ``1..n_k+1``,
the library's reverse (``exactattn.attention_backward``, or ``algorithm.backward`` where
the API does not take the parameter: recompute one tile's scores, ``p = e^{s−m}/ℓ`` from
the *frozen* forward statistics ``m, ℓ``, ``δ_i = G_i·Y_i``, ``γ_ij = p_ij (ρ_ij G_i·V_j −
δ_i)``, ``dQ += c γ K``, ``dK += c γᵀ Q``, ``dV += (p∘ρ)ᵀ G``) returns exactly

    (∂L/∂Q, ∂L/∂K, ∂L/∂V),   L = Σ_{i,a} G_ia Y_ia,   Y the specification's attention,

with the derivative taken by sympy of the formula (no max, nothing frozen: the frozen
``m`` cancels). Both sides are linear in ``G``, so the claim is checked one query row at
a time (``G`` zero except that row, symbolic there), which is equivalent. Leading dims
that broadcast (batch, grouped-query heads) make the library *sum* dQ, dK, dV over them:
the derivative of the one loss does the same.

Grid (default ``--max-n 4``): cross-attention (n_q = n + 1, n_k = n, d = 2, v = 3, symbolic c)
and self-attention ``dX = dQ + dK + dV = ∂L/∂X`` (Q = K = V = X, d = 2) for n = 1..max-n;
every nonempty-row mask at n ≤ 2 and every mask case of :mod:`proofs.grid` up to
max(4, max-n) on *full* inputs (symbolic Q, K, V and c, d = 2: dQ is checked under every
mask); the cases with rows split (``row_block`` 1, 2); the torch path's statistics
(``m = lse, ℓ = 1``) with split rows; batch broadcasting and grouped-query heads; dropout
with symbolic keep-factors ``ρ_ij`` (n = 1..3) and through the library's real ``Dropout``
at p = 1/4; empty rows under ``empty_rows='zero'`` (zero gradients).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import exactattn

from ..engine import batched, symbolic_spec
from ..engine.batched import row_runs
from ..engine.checks import Problem, check_reverse, tiling
from ..engine.coverage_matrix import Coverage
from ..engine.ledger import Obligation, check_equal
from ..engine.mask_grid import (
    BY_NAME,
    CASES,
    CAUSAL,
    EMPTY_ROWS,
    MaskCase,
    full_problem,
    symbolic_dropout_problem,
)
from ..engine.symbols import C, every_block_size, every_mask_check, matrix, upstream
from ..engine.terms import TermContext

FAMILY = "reverse"
ROW_BLOCK_N = 3


def cross_attention(n: int) -> Obligation:
    pb = Problem(matrix("q", n + 1, 2), matrix("k", n, 2), matrix("v", n, 3), C)
    return Obligation(
        FAMILY,
        "dQ, dK, dV = ∂(Σ G∘Y)/∂(Q, K, V), symbolic c",
        f"n_q={n + 1} n_k={n} d=2 v=3 b=1..{n + 1}",
        every_block_size(n, lambda b: check_reverse(pb, b), lambda b: tiling(pb, b)),
        coverage=(Coverage("reverse", n=n, cross=True),),
    )


def check_self(x: np.ndarray, c: object, b: int, cache: dict) -> None:
    y, stats = exactattn.self_attention(
        x, scale=c, block_size=b, backend=TermContext(), return_stats=True
    )
    for row in range(x.shape[0]):
        g = upstream(x.shape, (row,))
        dx = exactattn.self_attention_backward(
            x, y, stats, g, scale=c, block_size=b, backend=TermContext()
        )
        if row not in cache:
            cache[row] = symbolic_spec.row_gradient(
                g[row], symbolic_spec.naive_output(x, x, x, c)[row], x
            )
        check_equal(f"b={b} row {row}: dQ + dK + dV vs ∂L/∂X", dx, cache[row])


def self_attention(n: int) -> Obligation:
    x, cache = matrix("x", n, 2), {}
    return Obligation(
        FAMILY,
        "self-attention dX = dQ + dK + dV = ∂(Σ G∘Y)/∂X",
        f"n={n} d=2 b=1..{n + 1}",
        every_block_size(
            n, lambda b: check_self(x, C, b, cache), lambda b: tiling(Problem(x, x, x), b)
        ),
        coverage=(Coverage("reverse", n=n),),
    )


def every_mask(n: int) -> Obligation:
    q, k, v = matrix("q", n, 2), matrix("k", n, 2), matrix("v", n, 1)

    problems: dict[bytes, Problem] = {}  # one per mask: its gradients serve every b

    def run(allowed: np.ndarray, b: int) -> None:
        key = allowed.tobytes()
        if key not in problems:
            problems.clear()
            problems[key] = Problem(q, k, v, C, allowed, symbolic_spec.dense(allowed))
        check_reverse(problems[key], b)

    return Obligation(
        FAMILY,
        f"every nonempty-row mask ({(2**n - 1) ** n} masks), full inputs",
        f"n={n} d=2 v=1 b=1..{n + 1}",
        every_mask_check(n, run, lambda allowed, b: tiling(Problem(q, k, v, C, allowed), b)),
        coverage=(Coverage("reverse", "every table", n=n),),
    )


def structured(case: MaskCase, n: int) -> Obligation:
    pb = full_problem(case, n)
    return Obligation(
        FAMILY,
        f"{case.name}, full inputs (dQ too)",
        f"{case.sizes(n)} d=v=2 b=1..{n + 1}",
        every_block_size(n, lambda b: check_reverse(pb, b), lambda b: tiling(pb, b)),
        coverage=(case.coverage("reverse", n),),
    )


def split_rows(case: MaskCase, n: int = ROW_BLOCK_N) -> Obligation:
    pb = full_problem(case, n, v=1)
    return Obligation(
        FAMILY,
        f"{case.name}, rows split (row_block 1, 2), full inputs",
        f"{case.sizes(n)} d=2 v=1 b=1..{n + 1}",
        row_runs(n, lambda b, rows: check_reverse(pb, b, rows), (1, 2), pb),
        coverage=(case.coverage("reverse", n, row_block=True),),
    )


def torch_statistics(n: int = ROW_BLOCK_N) -> Obligation:
    """The torch path's reverse: frozen ``m = lse``, ``ℓ = 1``, rows split into runs."""
    pb = full_problem(CAUSAL, n, v=1)
    return Obligation(
        FAMILY,
        "causal, frozen m = lse, ℓ = 1 (torch path), rows split, full inputs",
        f"n={n} d=2 v=1 b=1..{n + 1}",
        row_runs(n, lambda b, rows: check_reverse(pb, b, rows, lse_only=True), (1, 2), pb),
        coverage=(CAUSAL.coverage("reverse", n, row_block=True),),
    )


def _whole_and_split(pb: Problem, n: int) -> Callable[[], str]:
    return row_runs(n, lambda b, rows: check_reverse(pb, b, rows), problem=pb)


BATCHED_CLAIMS = {
    "grouped": ": dK, dV summed over the group",
    "enable_gqa": ", causal bottom-right, whole and split",
    "broadcast": ": gradients summed over it",
}


def symbolic_dropout(n: int) -> Obligation:
    pb = symbolic_dropout_problem(n)
    return Obligation(
        FAMILY,
        "dropout, symbolic replayed ρ_ij: exact gradient",
        f"n={n} d=v=2 b=1..{n + 1}",
        every_block_size(n, lambda b: check_reverse(pb, b), lambda b: tiling(pb, b)),
        coverage=(Coverage("reverse", n=n, dropout=True),),
    )


def library_dropout(n: int = 3) -> Obligation:
    case = BY_NAME["causal ∧ key padding"]
    pb = full_problem(case, n, v=1, dropout_p=0.25, seed=7)
    return Obligation(
        FAMILY,
        "dropout: the library's Dropout at p = 1/4, exact gradient of Σ G·Y",
        f"{case.sizes(n)} d=2 v=1 seed=7 b=1..{n + 1}",
        _whole_and_split(pb, n),
        coverage=case.whole_and_split("reverse", n, dropout=True),
    )


def empty_rows(n: int = 3) -> Obligation:
    case = EMPTY_ROWS
    pb = full_problem(case, n, v=1, empty_rows="zero")
    return Obligation(
        FAMILY,
        "empty rows (empty_rows='zero'): zero gradient from them",
        f"{case.sizes(n)} d=2 v=1 b=1..{n + 1}",
        _whole_and_split(pb, n),
        coverage=case.whole_and_split("reverse", n, empty_rows=True),
    )


def obligations(max_n: int = 4) -> list[Obligation]:
    out = []
    for n in range(1, max_n + 1):
        out += [cross_attention(n), self_attention(n)]
    out += [every_mask(n) for n in (1, 2)]
    for n in range(2, max(4, max_n) + 1):
        out += [structured(case, n) for case in CASES if n >= case.min_n]
    out += [split_rows(case) for case in CASES]
    out += [torch_statistics()]
    out += batched.obligations(FAMILY, check_reverse, BATCHED_CLAIMS)
    out += [symbolic_dropout(n) for n in (1, 2, 3)]
    out += [library_dropout(), empty_rows()]
    return out
