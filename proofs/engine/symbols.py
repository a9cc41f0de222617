"""Symbolic inputs for the obligations, and the loops over block sizes and masks.

Two kinds of input:

* *full*: symbolic ``Q``, ``K``, ``V`` and a symbolic scale ``c`` (scores ``c·(q_i·k_j)``);
* *score-level*: ``Q = I`` (so ``d = n_q``), ``c = 1`` and ``K[j, i] = s_ij`` symbols, which
  makes every score an independent real symbol; an identity proved for these holds for
  all real score matrices, and the *full* runs cover the product ``c·q·k`` itself (and
  ``dQ``, which is not a derivative at score level).

The specification these are checked against is :mod:`exactattn.proofs.engine.symbolic_spec`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy

C = sympy.Symbol("c", positive=True)


def tensor(name: str, *shape: int) -> np.ndarray:
    """An object array of distinct real symbols ``name{index}``, e.g. ``q0_1`` or ``q1_0_2``."""
    out = np.empty(shape, dtype=object)
    for index in np.ndindex(*shape):
        out[index] = sympy.Symbol(name + "_".join(map(str, index)), real=True)
    return out


def matrix(name: str, rows: int, cols: int) -> np.ndarray:
    """A (rows, cols) object array of real symbols ``name{i}_{j}``."""
    return tensor(name, rows, cols)


def identity(n: int) -> np.ndarray:
    out = np.empty((n, n), dtype=object)
    for i, j in np.ndindex(n, n):
        out[i, j] = sympy.Integer(int(i == j))
    return out


def score_inputs(n_q: int, n_k: int, v: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``Q = I``, ``K = Sᵀ`` with free score symbols ``s{i}_{j}``, symbolic ``V`` (c = 1)."""
    return identity(n_q), matrix("s", n_q, n_k).T.copy(), matrix("v", n_k, v)


def upstream(shape: tuple[int, ...], row: tuple[int, ...]) -> np.ndarray:
    """``G`` of ``shape`` (*batch, n_q, v), zero except the query row ``row`` (symbols g_a).

    Both sides of a reverse obligation are linear in ``G``, so checking every such ``G``
    is checking every ``G``.
    """
    g = np.full(shape, sympy.S.Zero, dtype=object)
    g[row] = [sympy.Symbol(f"g{a}", real=True) for a in range(shape[-1])]
    return g


def nonempty_row_masks(n_q: int, n_k: int) -> Iterator[np.ndarray]:
    """Every (n_q, n_k) boolean mask whose rows are all nonempty: (2^n_k − 1)^n_q masks."""
    rows = [r for r in itertools.product((False, True), repeat=n_k) if any(r)]
    for choice in itertools.product(rows, repeat=n_q):
        yield np.array(choice, dtype=bool)


@dataclass(frozen=True)
class SymbolicDropout:
    """Dropout whose keep-factor ``ρ_ij`` is a free symbol per (batch, i, j), replayed per tile.

    Implements the ``factors(ctx, batch_index, i, j)`` protocol of
    :func:`exactattn.core.algorithm.forward`: the tile is ``rho[..., i, j]`` for the tile's query
    positions ``i`` (r, 1) and key positions ``j`` (1, b) — the same symbols in both passes,
    whatever the tiling.
    """

    rho: np.ndarray

    @classmethod
    def of_shape(cls, *shape: int) -> SymbolicDropout:
        rho = np.empty(shape, dtype=object)
        for index in np.ndindex(*shape):
            rho[index] = sympy.Symbol("rho" + "_".join(map(str, index)), nonnegative=True)
        return cls(rho)

    def factors(self, ctx: Any, batch_index: Any, i: Any, j: Any) -> np.ndarray:
        return self.rho[..., np.asarray(i), np.asarray(j)]


def distinct(bs: Iterable[Any], tiling: Callable[[Any], Any] | None) -> list[Any]:
    """The block sizes ``bs`` whose tiling (:func:`proofs.checks.tiling`) none before them
    has: the others run the same arithmetic (the all-n obligation that ``b`` is read only
    through ``tiles()``), so checking these checks all ``bs``."""
    if tiling is None:
        return list(bs)
    seen, out = set(), []
    for b in bs:
        key = tiling(b)
        if key not in seen:
            seen.add(key)
            out.append(b)
    return out


def every_block_size(
    n_k: int, run: Callable[[int], None], tiling: Callable[[int], Any] | None = None
) -> Callable[[], str]:
    """A check that runs ``run(b)`` for every block size ``b = 1..n_k+1`` (with a
    ``tiling``: for one ``b`` of each distinct tiling)."""

    def check() -> str:
        ran = distinct(range(1, n_k + 2), tiling)
        for b in ran:
            run(b)
        return f"{n_k + 1} block sizes, {len(ran)} distinct tiling{'s' * (len(ran) != 1)}"

    return check


def every_mask_check(
    n: int,
    run: Callable[[np.ndarray, int], None],
    tiling: Callable[[np.ndarray, int], Any] | None = None,
) -> Callable[[], str]:
    """A check that runs ``run(allowed, b)`` for every nonempty-row n×n mask and every b
    (one b per distinct tiling, given ``tiling``)."""

    def check() -> str:
        count = 0
        for allowed in nonempty_row_masks(n, n):
            key = None if tiling is None else (lambda b, a=allowed: tiling(a, b))
            for b in distinct(range(1, n + 2), key):
                run(allowed, b)
                count += 1
        return f"{count} runs"

    return check
