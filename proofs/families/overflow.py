"""Family 5 — overflow safety: every exponent the code evaluates is ≤ 0, and ℓ ≥ 1.

Exactness (families 2–4) does not depend on the shift at all, so a separate theorem is
needed for the property the max shift exists for. Theorem: for one query row with n
scores and every block size b in 1..n, every argument the library's forward
(``block_summary``, ``merge``) and reverse (``tile_probabilities``) pass to ``exp`` is
``≤ 0`` (or −∞), and the final ``ℓ ≥ 1`` — for *all* real scores.

Proof by cases over the ordering of the scores: every real score vector is, for some
permutation π, ``s_π(1) = t``, ``s_π(r+1) = s_π(r) − g_r`` with gaps ``g_r ≥ 0`` (ties
allowed). The library runs on these symbolic scores (Q = [1], c = 1, K = the scores) with
a context that records every ``exp`` argument; sympy resolves each ``Max`` from the gap
signs, and each recorded argument is ``−(sum of gaps)`` or −∞, hence ≤ 0, and
``ℓ − 1`` is a sum of exponentials, hence ≥ 0. All n! orderings, n = 1..5.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import sympy

import exactattn
from exactattn.core import algorithm

from ..engine.ledger import Obligation, check_nonpositive
from ..engine.symbols import matrix

FAMILY = "overflow"


class RecordingContext(exactattn.SympyContext):
    """The sympy context, recording every argument passed to ``exp``."""

    def __init__(self) -> None:
        self.exp_args: list[Any] = []

    def exp(self, x: np.ndarray) -> np.ndarray:
        self.exp_args.extend(np.asarray(x, dtype=object).flat)
        return super().exp(x)


def ordered_scores(order: tuple[int, ...]) -> list[sympy.Expr]:
    """Scores with ``s_order[0] ≥ s_order[1] ≥ …``: ``t − (g_1 + … + g_r)``, gaps ≥ 0."""
    t = sympy.Symbol("t", real=True)
    gaps = [sympy.Symbol(f"g{r}", nonnegative=True) for r in range(1, len(order))]
    scores: list[Any] = [None] * len(order)
    for rank, position in enumerate(order):
        scores[position] = t - sum(gaps[:rank], sympy.S.Zero)
    return scores


def check_case(ctx_type: type, order: tuple[int, ...], b: int) -> None:
    n = len(order)
    ctx = ctx_type()
    q = np.array([[sympy.S.One]], dtype=object)
    k = np.array([[s] for s in ordered_scores(order)], dtype=object)
    v, g = matrix("v", n, 1), matrix("g", 1, 1)
    y, state = algorithm.forward(ctx, q, k, v, scale=sympy.S.One, block_size=b)
    algorithm.backward(ctx, q, k, v, y, state.m, state.l, g, scale=sympy.S.One, block_size=b)
    where = f"order {order} b={b}"
    for arg in ctx.exp_args:
        check_nonpositive(f"{where}: exp argument {arg}", arg)
    check_nonpositive(f"{where}: 1 − ℓ", 1 - state.l[0])


def every_ordering(n: int, ctx_type: type = RecordingContext, label: str = "") -> Obligation:
    def check() -> str:
        count = 0
        for order in itertools.permutations(range(n)):
            for b in range(1, n + 1):
                check_case(ctx_type, order, b)
                count += 1
        return f"{count} cases"

    name = label or "every exp argument ≤ 0 (fwd + rev), final ℓ ≥ 1"
    return Obligation(
        FAMILY,
        name,
        f"n={n}: {len(list(itertools.permutations(range(n))))} orders, b=1..{n}",
        check,
    )


def obligations(max_n: int = 4) -> list[Obligation]:
    return [every_ordering(n) for n in range(1, 6)]
