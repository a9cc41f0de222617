"""Family 2 — the tiled forward is exact.

Theorem. For every input size in the grid below, every key-block size ``b`` in
``1..n_k+1`` and every mask listed, the library's tiled forward
(``exactattn.attention(..., backend="sympy")``, i.e. ``algorithm.forward`` folding ``⋆``
over the key blocks ``J_t``) returns

    Y_i = Σ_{j∈A_i} e^{s_ij} V_j / Σ_{j∈A_i} e^{s_ij},   s_ij = c·q_i·k_j,

as an identity in the symbols (all real Q, K, V and every scale c > 0), and its
statistics satisfy ``lse_i = m_i + log ℓ_i = log Σ_{j∈A_i} e^{s_ij}``.

Grid (default ``--max-n 4``; ``--max-n N`` raises the first and last rows to N):

* self-attention (Q = K = V = X, d = v = 2) and cross-attention (n_q = n + 1, n_k = n,
  d = 2, v = 3) with a symbolic scale c, n = 1..max-n, no mask;
* every mask with nonempty rows, exhaustively, at n_q = n_k = n ≤ 3 (343 masks at n = 3),
  on score-level inputs (every score an independent symbol);
* causal (top-left), sliding window (left = 1), causal bottom-right with n_q = n_k − 1, and
  key padding over a batch of two (lengths n and ⌈n/2⌉), n = 1..max(6, max-n), score level.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import exactattn
from exactattn import masks

from .engine import Obligation, check_equal
from .inputs import (
    C,
    dense_of,
    every_block_size,
    every_mask_check,
    matrix,
    naive_exp_lse,
    naive_output,
    score_inputs,
)

FAMILY = "forward"


def check_forward(q: Any, k: Any, v: Any, c: Any, b: int, mask: Any = None, allowed: Any = None):
    """One run of the library's tiled forward against the specification (2-D inputs)."""
    y, stats = exactattn.attention(
        q, k, v, scale=c, block_size=b, mask=mask, backend="sympy", return_stats=True
    )
    where = f"b={b}: "
    check_equal(where + "tiled Y vs naive Y", y, naive_output(q, k, v, c, allowed))
    lse = np.vectorize(lambda x: exactattn.SympyContext().exp(np.array([x]))[0], otypes=[object])
    check_equal(where + "e^lse vs Σ e^s", lse(stats.lse), naive_exp_lse(q, k, c, allowed))


def self_attention(n: int) -> Obligation:
    x = matrix("x", n, 2)
    return Obligation(
        FAMILY,
        "self-attention Y = naive, lse = log Σ e^s (symbolic c)",
        f"n={n} d=v=2 b=1..{n + 1}",
        every_block_size(n, lambda b: check_forward(x, x, x, C, b)),
    )


def cross_attention(n: int) -> Obligation:
    q, k, v = matrix("q", n + 1, 2), matrix("k", n, 2), matrix("v", n, 3)
    return Obligation(
        FAMILY,
        "cross-attention Y = naive, lse = log Σ e^s (symbolic c)",
        f"n_q={n + 1} n_k={n} d=2 v=3 b=1..{n + 1}",
        every_block_size(n, lambda b: check_forward(q, k, v, C, b)),
    )


def every_mask(n: int) -> Obligation:
    q, k, v = score_inputs(n, n, 2)

    def run(allowed: np.ndarray, b: int) -> None:
        check_forward(q, k, v, 1, b, mask=allowed, allowed=allowed)

    count = (2**n - 1) ** n
    return Obligation(
        FAMILY,
        f"every nonempty-row mask ({count} masks), scores free",
        f"n={n} b=1..{n + 1}",
        every_mask_check(n, run),
    )


def structured(name: str, mask: masks.Mask, n: int, n_q: int | None = None) -> Obligation:
    n_q = n if n_q is None else n_q
    q, k, v = score_inputs(n_q, n, 2)
    allowed = dense_of(mask, n_q, n)
    return Obligation(
        FAMILY,
        f"{name} mask, scores free",
        f"n_q={n_q} n_k={n} b=1..{n + 1}",
        every_block_size(n, lambda b: check_forward(q, k, v, 1, b, mask=mask, allowed=allowed)),
    )


def key_padding(n: int) -> Obligation:
    lengths = np.array([n, (n + 1) // 2])
    mask = masks.key_padding(lengths)
    q, k, v = score_inputs(n, n, 2)
    k2 = np.stack([k, matrix("t", n, n).T.copy()])  # a second batch element, its own scores
    v2 = np.stack([v, matrix("u", n, 2)])

    def run(b: int) -> None:
        y = exactattn.attention(q, k2, v2, scale=1, block_size=b, mask=mask, backend="sympy")
        for batch, length in enumerate(lengths):
            allowed = np.arange(n)[None, :] < length
            spec = naive_output(q, k2[batch], v2[batch], 1, np.broadcast_to(allowed, (n, n)))
            check_equal(f"b={b}: batch {batch} tiled Y vs naive Y", y[batch], spec)

    return Obligation(
        FAMILY,
        "key padding over a batch of 2, scores free",
        f"n={n} lengths={tuple(lengths.tolist())} b=1..{n + 1}",
        every_block_size(n, run),
    )


def obligations(max_n: int = 4) -> list[Obligation]:
    out = []
    for n in range(1, max_n + 1):
        out += [self_attention(n), cross_attention(n)]
    out += [every_mask(n) for n in range(1, 4)]
    for n in range(1, max(6, max_n) + 1):
        out.append(structured("causal", masks.causal(), n))
        if n >= 3:
            out.append(structured("sliding-window(left=1)", masks.sliding_window(1), n))
        if n >= 2:
            out.append(
                structured("causal bottom-right", masks.causal("bottom-right"), n, n_q=n - 1)
            )
            out.append(key_padding(n))
    return out
