"""Family 8 — the dropout keep-bits and factors are the specified ones.

Theorem. (1) The library's keep-bits ``Dropout.keep(b, i, j)`` equal the specification's
``r_ij`` (:func:`proofs.spec.keep_bit`: Wellons' lowbias32 chained over seed, batch·head
index, i, j, in plain Python integers) at every position of the grids below, for seeds
below and above 2^32 and several p — evaluated tile by tile, so also as a pure function of
the indices. (2) The library's factors are ``ρ_ij = r_ij/(1 − p)`` exactly (over the exact
sympy backend at p = 1/4, 1/2, 3/4). (3) On a 512 × 512 grid of two heads the realised
keep fraction is within 5 standard deviations of ``1 − p`` and the mean factor within 5
standard deviations of 1 (dropout is unbiased in expectation), for p = 0.1, 0.25, 0.5.

(1) and (2) are exact comparisons. (3) is a computed fact about the deterministic
generator at a fixed seed, with the bound ``5·sqrt(p(1 − p)/N)`` (N = 524 288 draws) for
the rate and that bound divided by ``1 − p`` for the mean factor: an i.i.d. Bernoulli
source passes each with probability 1 − 6·10⁻⁷; a factor 1/(1 + p) misses the mean by 79
bounds at p = 0.1 (by more at larger p).
"""

from __future__ import annotations

import math

import numpy as np
import sympy

from exactattn.backends import NumpyContext
from exactattn.core.dropout import Dropout

from ..engine import symbolic_spec
from ..engine.context import ProofContext
from ..engine.counterexamples import Counterexample
from ..engine.ledger import Obligation, Refuted

FAMILY = "dropout"
SEEDS = (0, 7, 2**32 + 5, 2**64 - 1)
PS = (0.1, 0.25, 0.5, 0.9)


def _refuted(what: str, point: dict, lhs: str, rhs: str, relation: str = "≠") -> Refuted:
    return Refuted(Counterexample(what, {k: str(v) for k, v in point.items()}, lhs, rhs, relation))


def keep_bits() -> str:
    batch, n_q, n_k = (2, 3), 9, 11
    flat = np.arange(math.prod(batch)).reshape((*batch, 1, 1))
    checked = 0
    for seed in SEEDS:
        for p in PS:
            want = symbolic_spec.keep_grid(p, seed, batch, n_q, n_k).astype(bool)
            dropout = Dropout(p, seed)
            for r0, c0 in ((0, 0), (4, 3), (8, 10)):  # tiles anywhere on the grid
                i = np.arange(r0, n_q)[:, None]
                j = np.arange(c0, n_k)[None, :]
                got = np.broadcast_to(dropout.keep(flat, i, j), want[..., r0:, c0:].shape)
                bad = np.argwhere(got != want[..., r0:, c0:])
                if len(bad):
                    b1, b2, i_, j_ = (int(x) for x in bad[0])
                    point = {"seed": seed, "p": p, "b": (b1, b2), "i": i_ + r0, "j": j_ + c0}
                    raise _refuted("keep bit", point, str(got[tuple(bad[0])]), "the specified r_ij")
                checked += got.size
    return f"{checked} bits"


def factors() -> None:
    ctx = ProofContext()
    flat = np.arange(2).reshape((2, 1, 1))
    i, j = np.arange(4)[:, None], np.arange(5)[None, :]
    for p in (0.25, 0.5, 0.75):
        got = Dropout(p, 3).factors(ctx, flat, i, j)
        want = symbolic_spec.dropout_factors(p, 3, (2,), 4, 5)
        for index in np.ndindex(want.shape):
            if sympy.sympify(got[index]) != want[index]:
                point = {"p": p, "index": index}
                raise _refuted(
                    "dropout factor", point, str(got[index]), f"r/(1 − p) = {want[index]}"
                )


def rates() -> str:
    ctx = NumpyContext()
    n, heads = 512, 2
    flat = np.arange(heads).reshape((heads, 1, 1))
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    draws = heads * n * n
    for p in (0.1, 0.25, 0.5):
        dropout = Dropout(p, seed=2024)
        rate = float(np.mean(dropout.keep(flat, i, j)))
        bound = 5 * math.sqrt(p * (1 - p) / draws)
        if abs(rate - (1 - p)) > bound:
            raise _refuted("keep rate", {"p": p}, f"{rate:.6f}", f"1 − p ± {bound:.2e}", "outside")
        mean = float(np.mean(dropout.factors(ctx, flat, i, j)))
        if abs(mean - 1) > bound / (1 - p):
            point = {"p": p}
            raise _refuted("mean factor", point, f"{mean:.6f}", f"1 ± {bound / (1 - p):.2e}", "∉")
    return f"{draws} draws per p"


def obligations(max_n: int = 4) -> list[Obligation]:
    return [
        Obligation(
            FAMILY,
            "keep-bits = the specified lowbias32 chain, per tile",
            "4 seeds × 4 p, 2×3 heads",
            keep_bits,
        ),
        Obligation(FAMILY, "factors ρ = r/(1 − p) exactly", "p = 1/4, 1/2, 3/4", factors),
        Obligation(
            FAMILY, "keep rate 1 − p and mean factor 1 (5σ)", "512×512, 2 heads, 3 p", rates
        ),
    ]
