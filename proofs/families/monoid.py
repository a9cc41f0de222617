"""Family 1 — the merge ⋆ is a commutative monoid, and φ sends it to addition.

Theorem. For the library's ``algorithm.merge`` over sympy, with fully symbolic summaries
``a_k = (m_k, ℓ_k, z_k)`` (``m_k`` real, ``ℓ_k > 0``, ``z_k`` a scalar or a 2-vector):

* associativity ``(a1 ⋆ a2) ⋆ a3 = a1 ⋆ (a2 ⋆ a3)`` and commutativity ``a1 ⋆ a2 = a2 ⋆ a1``
  (the ``m`` parts are the same ``Max``; ℓ and z are equal as identities);
* ``⊥ = (−∞, 0, 0)`` is a two-sided identity, and ``⊥ ⋆ ⊥`` is exactly ⊥ (no NaN from
  ``−∞ − (−∞)``: ``safe_shift`` shifts ⊥ by 0);
* ``φ(m, ℓ, z) = (ℓ e^m, z e^m)`` satisfies ``φ(a1 ⋆ a2) = φ(a1) + φ(a2)``, and this holds for
  *any* shift ``M`` the merge rescales to, not only ``max(m1, m2)`` (checked by running
  ``merge`` with a context whose ``maximum`` returns a free symbol ``M``);
* ``block_summary`` splits over a union: ``Σ(I ∪ I') = Σ(I) ⋆ Σ(I')`` for the library's
  ``block_summary`` on free scores, |I|, |I'| ≤ 2.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sympy

import exactattn
from exactattn.core import algorithm
from exactattn.core.algorithm import Summary

from ..engine.ledger import Obligation, Undecided, check_equal
from ..engine.symbols import matrix

FAMILY = "monoid"
CTX = exactattn.SympyContext()


def summary(k: int, v: int) -> Summary:
    """A one-row summary with symbols ``m_k`` (real), ``l_k`` (> 0), ``z_k_a``."""
    m = sympy.Symbol(f"m{k}", real=True)
    l = sympy.Symbol(f"l{k}", positive=True)
    z = [sympy.Symbol(f"z{k}_{a}", real=True) for a in range(v)]
    return Summary(_arr([m]), _arr([l]), _arr([z]))


def bottom(v: int) -> Summary:
    return Summary(_arr([sympy.S.NegativeInfinity]), _arr([sympy.S.Zero]), _arr([[0] * v]))


def _arr(x: Any) -> np.ndarray:
    return np.array(x, dtype=object) + sympy.S.Zero


def same_summary(what: str, a: Summary, b: Summary) -> None:
    if list(a.m) != list(b.m):
        raise Undecided(f"{what}: m differs structurally, {a.m} vs {b.m}")
    check_equal(f"{what} ℓ", a.l, b.l)
    check_equal(f"{what} z", a.z, b.z)


def phi(s: Summary) -> tuple[Any, Any]:
    e = CTX.exp(s.m)
    return s.l * e, s.z * e[..., None]


def _laws(v: int) -> list[Obligation]:
    def assoc() -> None:
        a, b, c = (summary(k, v) for k in (1, 2, 3))
        lhs = algorithm.merge(CTX, algorithm.merge(CTX, a, b), c)
        rhs = algorithm.merge(CTX, a, algorithm.merge(CTX, b, c))
        same_summary("(a⋆b)⋆c vs a⋆(b⋆c)", lhs, rhs)

    def comm() -> None:
        a, b = summary(1, v), summary(2, v)
        same_summary("a⋆b vs b⋆a", algorithm.merge(CTX, a, b), algorithm.merge(CTX, b, a))

    def identity() -> None:
        a, e = summary(1, v), bottom(v)
        same_summary("⊥⋆a vs a", algorithm.merge(CTX, e, a), a)
        same_summary("a⋆⊥ vs a", algorithm.merge(CTX, a, e), a)
        ee = algorithm.merge(CTX, e, e)
        values = [*ee.m, *ee.l, *ee.z.flat]
        if any(x.has(sympy.nan) for x in values) or list(ee.m) != [sympy.S.NegativeInfinity]:
            raise Undecided(f"⊥⋆⊥ = {values}, not ⊥")
        same_summary("⊥⋆⊥ vs ⊥", ee, e)

    def homomorphism() -> None:
        a, b = summary(1, v), summary(2, v)
        lhs, (la, za), (lb, zb) = phi(algorithm.merge(CTX, a, b)), phi(a), phi(b)
        check_equal("φ(a⋆b) ℓ-part vs φ(a)+φ(b)", lhs[0], la + lb)
        check_equal("φ(a⋆b) z-part vs φ(a)+φ(b)", lhs[1], za + zb)

    def any_shift() -> None:
        a, b = summary(1, v), summary(2, v)
        shifted = algorithm.merge(AnyShift(), a, b)
        lhs, (la, za), (lb, zb) = phi(shifted), phi(a), phi(b)
        check_equal("φ(a ⋆_M b) ℓ-part vs φ(a)+φ(b)", lhs[0], la + lb)
        check_equal("φ(a ⋆_M b) z-part vs φ(a)+φ(b)", lhs[1], za + zb)

    size = "z scalar" if v == 1 else f"z ∈ R^{v}"
    return [
        Obligation(FAMILY, "⋆ is associative", size, assoc),
        Obligation(FAMILY, "⋆ is commutative", size, comm),
        Obligation(FAMILY, "⊥ is a two-sided identity; ⊥ ⋆ ⊥ = ⊥ (no NaN)", size, identity),
        Obligation(FAMILY, "φ(a ⋆ b) = φ(a) + φ(b)", size, homomorphism),
        Obligation(FAMILY, "φ(a ⋆_M b) = φ(a) + φ(b) for a free shift M", size, any_shift),
    ]


class AnyShift(exactattn.SympyContext):
    """The sympy context with ``maximum`` replaced by a free real symbol ``M``."""

    M = sympy.Symbol("M", real=True)

    def maximum(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.full(np.shape(a), self.M, dtype=object)


def union(sizes: tuple[int, int]) -> Obligation:
    n = sum(sizes)

    def check() -> None:
        s, v = matrix("s", 1, n), matrix("v", n, 2)
        whole = algorithm.block_summary(CTX, s, v)
        cut = sizes[0]
        left = algorithm.block_summary(CTX, s[:, :cut], v[:cut])
        right = algorithm.block_summary(CTX, s[:, cut:], v[cut:])
        same_summary("Σ(I∪I') vs Σ(I)⋆Σ(I')", whole, algorithm.merge(CTX, left, right))

    return Obligation(
        FAMILY, "Σ(I ∪ I') = Σ(I) ⋆ Σ(I') (block_summary)", f"|I|={sizes[0]} |I'|={sizes[1]}", check
    )


def obligations(max_n: int = 4) -> list[Obligation]:
    return [*_laws(1), *_laws(2), *(union(s) for s in ((1, 1), (1, 2), (2, 2)))]
