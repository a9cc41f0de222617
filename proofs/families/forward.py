"""Family 2 — the tiled forward is exact.

Theorem. For every problem in the grid below and every key-block size ``b`` in
``1..n_k+1``, the library's tiled forward (``exactattn.attention``, or
``algorithm.forward`` where the API does not take the parameter) returns

    Y_i = Σ_{j∈A_i} e^{s_ij} ρ_ij V_j / Σ_{j∈A_i} e^{s_ij},   s_ij = c·q_i·k_j,

as an identity in the symbols (all real Q, K, V and every scale c > 0), with
``lse_i = m_i + log ℓ_i = log Σ_{j∈A_i} e^{s_ij}``; rows with ``A_i = ∅`` under
``empty_rows='zero'`` give ``Y_i = 0``, ``lse_i = −∞``. ``A_i`` and ``ρ_ij`` are the
specification's (:mod:`proofs.spec`: inequalities, ``r_ij/(1 − p)``), never the library's.

Grid (default ``--max-n 4``; ``--max-n N`` raises the first two rows to N and the mask
rows to max(6, N)):

* self-attention (Q = K = V = X, d = v = 2) and cross-attention (n_q = n + 1, n_k = n,
  d = 2, v = 3) with a symbolic scale c, n = 1..max-n, no mask;
* every mask with nonempty rows, exhaustively, at n_q = n_k = n ≤ 3 (343 masks at n = 3),
  on score-level inputs (every score an independent symbol);
* every mask case of :mod:`proofs.grid` (causal and windows in both alignments, with
  n_q ≠ n_k; key padding over a batch of two; ∧ and ∨ compositions), score level,
  n = 1..max(6, max-n);
* the same cases with the query rows split into runs (``row_block`` 1 and 2, as the torch
  path splits them), n = 4;
* batch broadcasting (q (2, 1, n, 1) against k, v (1, 2, n, 1)) and grouped-query heads
  (q (H_kv=2, g=2, n, 1) against k, v (2, 1, n, 1)), causal bottom-right, full inputs, n = 3,
  whole and with ``row_block = 2``;
* dropout with free keep-factors ``ρ_ij`` (symbols, replayed per tile), n = 1..3, and
  through the library's real ``Dropout`` at p = 1/4 (ρ_ij = r_ij/(1 − p) with the
  specified keep-bits), a batch of two, causal ∧ padding, n = 3, whole and split;
* empty rows under ``empty_rows='zero'`` (window(left=1) with n_q = n_k + 2), n = 3.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..engine import batched, symbolic_spec
from ..engine.batched import row_runs
from ..engine.checks import Problem, check_forward, tiling
from ..engine.coverage_matrix import Coverage
from ..engine.ledger import Obligation
from ..engine.mask_grid import (
    BY_NAME,
    CASES,
    EMPTY_ROWS,
    MaskCase,
    score_problem,
    symbolic_dropout_problem,
)
from ..engine.symbols import C, every_block_size, every_mask_check, matrix, score_inputs

FAMILY = "forward"
ROW_BLOCK_N = 4


def self_attention(n: int) -> Obligation:
    x = matrix("x", n, 2)
    pb = Problem(x, x, x, C)
    return Obligation(
        FAMILY,
        "self-attention Y = naive, lse = log Σ e^s (symbolic c)",
        f"n={n} d=v=2 b=1..{n + 1}",
        every_block_size(n, lambda b: check_forward(pb, b), lambda b: tiling(pb, b)),
        coverage=(Coverage("forward", n=n),),
    )


def cross_attention(n: int) -> Obligation:
    pb = Problem(matrix("q", n + 1, 2), matrix("k", n, 2), matrix("v", n, 3), C)
    return Obligation(
        FAMILY,
        "cross-attention Y = naive, lse = log Σ e^s (symbolic c)",
        f"n_q={n + 1} n_k={n} d=2 v=3 b=1..{n + 1}",
        every_block_size(n, lambda b: check_forward(pb, b), lambda b: tiling(pb, b)),
        coverage=(Coverage("forward", n=n, cross=True),),
    )


def every_mask(n: int) -> Obligation:
    q, k, v = score_inputs(n, n, 2)

    problems: dict[bytes, Problem] = {}  # one per mask: its definition's Y serves every b

    def run(allowed: np.ndarray, b: int) -> None:
        key = allowed.tobytes()
        if key not in problems:
            problems.clear()
            problems[key] = Problem(q, k, v, 1, allowed, symbolic_spec.dense(allowed))
        check_forward(problems[key], b)

    count = (2**n - 1) ** n
    return Obligation(
        FAMILY,
        f"every nonempty-row mask ({count} masks), scores free",
        f"n={n} b=1..{n + 1}",
        every_mask_check(n, run, lambda allowed, b: tiling(Problem(q, k, v, 1, allowed), b)),
        coverage=(Coverage("forward", "every table", n=n),),
    )


def structured(case: MaskCase, n: int) -> Obligation:
    pb = score_problem(case, n)
    return Obligation(
        FAMILY,
        f"{case.name}, scores free",
        f"{case.sizes(n)} b=1..{n + 1}",
        every_block_size(n, lambda b: check_forward(pb, b), lambda b: tiling(pb, b)),
        coverage=(case.coverage("forward", n),),
    )


def split_rows(case: MaskCase, n: int = ROW_BLOCK_N) -> Obligation:
    while case.n_q(n) < 3:  # enough rows for a split to take effect
        n += 1
    pb = score_problem(case, n)
    return Obligation(
        FAMILY,
        f"{case.name}, rows split (row_block 1, 2), scores free",
        f"{case.sizes(n)} b=1..{n + 1}",
        row_runs(n, lambda b, rows: check_forward(pb, b, rows), (1, 2), pb),
        coverage=(case.coverage("forward", n, row_block=True),),
    )


def _whole_and_split(pb: Problem, n: int) -> Callable[[], str]:
    return row_runs(n, lambda b, rows: check_forward(pb, b, rows), problem=pb)


BATCHED_CLAIMS = {
    "grouped": ", causal bottom-right, whole and split rows",
    "enable_gqa": ", causal bottom-right, whole and split",
    "broadcast": ", causal bottom-right",
}


def dropout(n: int = 3) -> Obligation:
    case = BY_NAME["causal ∧ key padding"]
    pb = score_problem(case, n, dropout_p=0.25, seed=7)
    return Obligation(
        FAMILY,
        "dropout: the library's Dropout at p = 1/4 vs Σ e^s (r/(1−p)) V / Σ e^s",
        f"{case.sizes(n)} seed=7 b=1..{n + 1}",
        _whole_and_split(pb, n),
        coverage=case.whole_and_split("forward", n, dropout=True),
    )


def symbolic_dropout(n: int) -> Obligation:
    pb = symbolic_dropout_problem(n)
    return Obligation(
        FAMILY,
        "dropout, symbolic replayed ρ_ij: Y = Σ e^s ρ V / Σ e^s",
        f"n={n} d=v=2 b=1..{n + 1}",
        every_block_size(n, lambda b: check_forward(pb, b), lambda b: tiling(pb, b)),
        coverage=(Coverage("forward", n=n, dropout=True),),
    )


def empty_rows(n: int = 3) -> Obligation:
    case = EMPTY_ROWS
    pb = score_problem(case, n, empty_rows="zero")
    return Obligation(
        FAMILY,
        "empty rows (empty_rows='zero'): Y = 0, lse = −∞",
        f"{case.sizes(n)} b=1..{n + 1}",
        _whole_and_split(pb, n),
        coverage=case.whole_and_split("forward", n, empty_rows=True),
    )


def obligations(max_n: int = 4) -> list[Obligation]:
    out = []
    for n in range(1, max_n + 1):
        out += [self_attention(n), cross_attention(n)]
    out += [every_mask(n) for n in range(1, 4)]
    for n in range(1, max(6, max_n) + 1):
        out += [structured(case, n) for case in CASES if n >= case.min_n]
    out += [split_rows(case) for case in CASES]
    out += [symbolic_dropout(n) for n in (1, 2, 3)]
    out += batched.obligations(FAMILY, check_forward, BATCHED_CLAIMS)
    out += [dropout(), empty_rows()]
    return out
