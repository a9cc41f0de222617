"""Family 3 — the block-recomputed reverse is exact.

Theorem. For every size in the grid below and every block size ``b`` in ``1..n_k+1``, the
library's reverse (``exactattn.attention_backward``, i.e. ``algorithm.backward``: recompute
one tile's scores, ``p = e^{s−m}/ℓ`` from the *frozen* forward statistics ``m, ℓ``,
``δ_i = G_i·Y_i``, ``γ_ij = p_ij (G_i·V_j − δ_i)``, ``dQ += c γ K``, ``dK += c γᵀ Q``,
``dV += pᵀ G``) returns exactly

    (∂L/∂Q, ∂L/∂K, ∂L/∂V),   L = Σ_{i,a} G_ia Y_ia,   Y the textbook softmax attention,

with the derivative taken by sympy of the formula (no max, nothing frozen: the frozen
``m`` cancels). Both sides are linear in ``G``, so the claim is checked one query row at
a time (``G`` zero except row i, symbolic there), which is equivalent.

Grid (default ``--max-n 4``): cross-attention (n_q = n_k = n, d = 2, v = 3, symbolic c)
and self-attention ``dX = dQ + dK + dV = ∂L/∂X`` (Q = K = V = X, d = 2) for n = 1..max-n;
every nonempty-row mask at n ≤ 2 and causal / sliding-window masks up to max-n on
score-level inputs; dropout with symbolic keep-factors ``ρ_ij``, replayed per tile in
both passes, against ``∂/∂(Q,K,V)`` of ``Σ G_ia Σ_j p_ij ρ_ij V_ja`` for n = 1..3.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sympy

import exactattn
from exactattn import algorithm, masks

from .engine import Obligation, check_equal
from .inputs import (
    C,
    SymbolicDropout,
    dense_of,
    every_block_size,
    every_mask_check,
    gradient,
    matrix,
    naive_output,
    row_upstream,
    score_inputs,
)

FAMILY = "reverse"


def _spec_grads(q, k, v, c, row, g, allowed=None, rho=None, wrt=None) -> list[np.ndarray]:
    loss = sympy.Add(*(g[row] * naive_output(q, k, v, c, allowed, rho)[row]))
    return [gradient(loss, x) for x in (wrt or (q, k, v))]


def check_reverse(q: Any, k: Any, v: Any, c: Any, b: int, mask: Any = None, allowed: Any = None):
    """Every row of G: the library's (dQ, dK, dV) against sympy's derivative of the spec."""
    y, stats = exactattn.attention(
        q, k, v, scale=c, block_size=b, mask=mask, backend="sympy", return_stats=True
    )
    for row in range(q.shape[0]):
        g = row_upstream(q.shape[0], v.shape[1], row)
        tiled = exactattn.attention_backward(
            q, k, v, y, stats, g, scale=c, block_size=b, mask=mask, backend="sympy"
        )
        symbolic = [x for x in (q, k, v) if _all_symbols(x)]
        spec = dict(zip(map(id, symbolic), _spec_grads(q, k, v, c, row, g, allowed, wrt=symbolic)))
        for name, x, lhs in zip(("dQ", "dK", "dV"), (q, k, v), tiled):
            if id(x) in spec:  # Q = I at score level: dQ is covered by the full runs
                check_equal(f"b={b} row {row}: tiled {name} vs ∂L/∂{name[1]}", lhs, spec[id(x)])


def _all_symbols(x: np.ndarray) -> bool:
    return all(isinstance(e, sympy.Symbol) for e in x.flat)


def cross_attention(n: int) -> Obligation:
    q, k, v = matrix("q", n, 2), matrix("k", n, 2), matrix("v", n, 3)
    return Obligation(
        FAMILY,
        "dQ, dK, dV = ∂(Σ G∘Y)/∂(Q, K, V), symbolic c",
        f"n={n} d=2 v=3 b=1..{n + 1}",
        every_block_size(n, lambda b: check_reverse(q, k, v, C, b)),
    )


def check_self(x: Any, c: Any, b: int) -> None:
    y, stats = exactattn.self_attention(
        x, scale=c, block_size=b, backend="sympy", return_stats=True
    )
    for row in range(x.shape[0]):
        g = row_upstream(x.shape[0], x.shape[1], row)
        dx = exactattn.self_attention_backward(
            x, y, stats, g, scale=c, block_size=b, backend="sympy"
        )
        (spec,) = _spec_grads(x, x, x, c, row, g, wrt=(x,))
        check_equal(f"b={b} row {row}: dQ + dK + dV vs ∂L/∂X", dx, spec)


def self_attention(n: int) -> Obligation:
    x = matrix("x", n, 2)
    return Obligation(
        FAMILY,
        "self-attention dX = dQ + dK + dV = ∂(Σ G∘Y)/∂X",
        f"n={n} d=2 b=1..{n + 1}",
        every_block_size(n, lambda b: check_self(x, C, b)),
    )


def every_mask(n: int) -> Obligation:
    q, k, v = score_inputs(n, n, 2)

    def run(allowed: np.ndarray, b: int) -> None:
        check_reverse(q, k, v, 1, b, mask=allowed, allowed=allowed)

    return Obligation(
        FAMILY,
        f"every nonempty-row mask ({(2**n - 1) ** n} masks), scores free",
        f"n={n} b=1..{n + 1}",
        every_mask_check(n, run),
    )


def structured(name: str, mask: masks.Mask, n: int) -> Obligation:
    q, k, v = score_inputs(n, n, 2)
    allowed = dense_of(mask, n, n)
    return Obligation(
        FAMILY,
        f"{name} mask, scores free",
        f"n={n} b=1..{n + 1}",
        every_block_size(n, lambda b: check_reverse(q, k, v, 1, b, mask=mask, allowed=allowed)),
    )


def check_dropout(q: Any, k: Any, v: Any, c: Any, b: int, dropout: SymbolicDropout) -> None:
    ctx = exactattn.SympyContext()
    y, state = algorithm.forward(ctx, q, k, v, scale=c, block_size=b, dropout=dropout)
    check_equal(f"b={b}: dropped-out Y", y, naive_output(q, k, v, c, rho=dropout.rho))
    for row in range(q.shape[0]):
        g = row_upstream(q.shape[0], v.shape[1], row)
        tiled = algorithm.backward(
            ctx, q, k, v, y, state.m, state.l, g, scale=c, block_size=b, dropout=dropout
        )
        spec = _spec_grads(q, k, v, c, row, g, rho=dropout.rho)
        for name, lhs, rhs in zip(("dQ", "dK", "dV"), tiled, spec):
            check_equal(f"b={b} row {row}: tiled {name} vs ∂L/∂{name[1]}", lhs, rhs)


def dropout(n: int) -> Obligation:
    q, k, v = matrix("q", n, 2), matrix("k", n, 2), matrix("v", n, 2)
    drop = SymbolicDropout.of_size(n, n)
    return Obligation(
        FAMILY,
        "dropout, symbolic replayed ρ_ij: Y and its exact gradient",
        f"n={n} d=v=2 b=1..{n + 1}",
        every_block_size(n, lambda b: check_dropout(q, k, v, C, b, drop)),
    )


def obligations(max_n: int = 4) -> list[Obligation]:
    out = []
    for n in range(1, max_n + 1):
        out += [cross_attention(n), self_attention(n)]
    out += [every_mask(n) for n in (1, 2)]
    for n in range(2, max_n + 1):
        out.append(structured("causal", masks.causal(), n))
        if n >= 3:
            out.append(structured("sliding-window(left=1)", masks.sliding_window(1), n))
    out += [dropout(n) for n in (1, 2, 3)]
    return out
