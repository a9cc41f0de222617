"""Symbolic inputs and the textbook formulas the tiled code is compared against.

The *specification* is softmax attention as a formula, with no shift and no tiling:

    Y_i = Σ_{j∈A_i} e^{s_ij} ρ_ij V_j / Σ_{j∈A_i} e^{s_ij},   s_ij = c·q_i·k_j,

(``ρ_ij = 1`` without dropout) and the loss for the reverse is ``Σ_ia G_ia Y_ia``, whose
derivative sympy takes symbolically. Nothing here is the tiled algorithm.

Two kinds of input:

* *full*: symbolic ``Q``, ``K``, ``V`` and a symbolic scale ``c`` (scores ``c·(q_i·k_j)``);
* *score-level*: ``Q = I`` (so ``d = n_q``), ``c = 1`` and ``K[j, i] = s_ij`` symbols, which
  makes every score an independent real symbol; an identity proved for these holds for
  all real score matrices, and the *full* runs cover the product ``c·q·k`` itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy

from exactattn import masks

C = sympy.Symbol("c", positive=True)


def matrix(name: str, rows: int, cols: int) -> np.ndarray:
    """A (rows, cols) object array of real symbols ``name{i}_{j}``."""
    out = np.empty((rows, cols), dtype=object)
    for i, j in np.ndindex(rows, cols):
        out[i, j] = sympy.Symbol(f"{name}{i}_{j}", real=True)
    return out


def identity(n: int) -> np.ndarray:
    out = np.empty((n, n), dtype=object)
    for i, j in np.ndindex(n, n):
        out[i, j] = sympy.Integer(int(i == j))
    return out


def score_inputs(n_q: int, n_k: int, v: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``Q = I``, ``K = Sᵀ`` with free score symbols ``s{i}_{j}``, symbolic ``V`` (c = 1)."""
    return identity(n_q), matrix("s", n_q, n_k).T.copy(), matrix("v", n_k, v)


def naive_output(q: Any, k: Any, v: Any, c: Any, allowed: Any = None, rho: Any = None) -> Any:
    """The specification ``Y`` for 2-D inputs (no shift, no tiling)."""
    e = np.vectorize(sympy.exp, otypes=[object])((q @ k.T) * c)
    if allowed is not None:
        e = np.where(allowed, e, sympy.S.Zero)
    weights = e if rho is None else e * rho
    return (weights @ v) / e.sum(axis=1)[:, None]


def naive_exp_lse(q: Any, k: Any, c: Any, allowed: Any = None) -> Any:
    """``e^{lse_i} = Σ_{j∈A_i} e^{s_ij}``."""
    e = np.vectorize(sympy.exp, otypes=[object])((q @ k.T) * c)
    if allowed is not None:
        e = np.where(allowed, e, sympy.S.Zero)
    return e.sum(axis=1)


def exp_array(x: Any) -> np.ndarray:
    return np.vectorize(sympy.exp, otypes=[object])(np.asarray(x, dtype=object))


def gradient(loss: sympy.Expr, wrt: np.ndarray) -> np.ndarray:
    """``∂loss/∂x`` for every symbol of ``wrt``, same shape."""
    out = np.empty(wrt.shape, dtype=object)
    for index in np.ndindex(wrt.shape):
        out[index] = sympy.diff(loss, wrt[index])
    return out


def row_upstream(n_q: int, v: int, row: int) -> np.ndarray:
    """``G`` zero except row ``row`` (symbols ``g{row}_{a}``): both sides are linear in G."""
    g = np.full((n_q, v), sympy.S.Zero, dtype=object)
    g[row] = matrix("g", n_q, v)[row]
    return g


def nonempty_row_masks(n_q: int, n_k: int) -> Iterator[np.ndarray]:
    """Every (n_q, n_k) boolean mask whose rows are all nonempty: (2^n_k − 1)^n_q masks."""
    rows = [r for r in itertools.product((False, True), repeat=n_k) if any(r)]
    for choice in itertools.product(rows, repeat=n_q):
        yield np.array(choice, dtype=bool)


@dataclass(frozen=True)
class SymbolicDropout:
    """Dropout whose keep-factor ``ρ_ij`` is the symbol ``rho{i}_{j}``, replayed per tile.

    Implements the ``factors(ctx, batch_index, i, j)`` protocol of
    :func:`exactattn.algorithm.forward`: the tile is ``rho[i, j]`` for the tile's query
    positions ``i`` (r, 1) and key positions ``j`` (1, b).
    """

    rho: np.ndarray

    @classmethod
    def of_size(cls, n_q: int, n_k: int) -> SymbolicDropout:
        rho = np.empty((n_q, n_k), dtype=object)
        for i, j in np.ndindex(n_q, n_k):
            rho[i, j] = sympy.Symbol(f"rho{i}_{j}", nonnegative=True)
        return cls(rho)

    def factors(self, ctx: Any, batch_index: Any, i: Any, j: Any) -> np.ndarray:
        return self.rho[np.asarray(i), np.asarray(j)]


def every_block_size(n_k: int, run: Callable[[int], None]) -> Callable[[], str]:
    """A check that runs ``run(b)`` for every block size ``b = 1..n_k+1``."""

    def check() -> str:
        for b in range(1, n_k + 2):
            run(b)
        return f"{n_k + 1} block sizes"

    return check


def every_mask_check(n: int, run: Callable[[np.ndarray, int], None]) -> Callable[[], str]:
    """A check that runs ``run(allowed, b)`` for every nonempty-row n×n mask and every b."""

    def check() -> str:
        count = 0
        for allowed in nonempty_row_masks(n, n):
            for b in range(1, n + 2):
                run(allowed, b)
                count += 1
        return f"{count} runs"

    return check


def dense_of(mask: masks.Mask, n_q: int, n_k: int, batch: tuple[int, ...] = ()) -> np.ndarray:
    """The mask on the whole (n_q, n_k) grid (the proofs' naive side needs it)."""
    return masks.create_mask(mask, masks.Geometry(n_q=n_q, n_k=n_k, batch=batch))
