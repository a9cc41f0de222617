"""The zero test: decide ``lhs = rhs`` for the expressions the sympy backend produces.

Every quantity the tiled code computes over :class:`exactattn.SympyContext` is built from
polynomials in the input symbols, ``+ − × ÷``, ``exp`` and ``Max``; ``Max`` occurs only
inside ``exp`` (as a shift). The test turns such an expression into a rational function:

1. split every ``exp`` of a sum at the top level, ``e^{a + b − M} = e^a · e^b · e^{−M}``
   (without expanding ``c·(q·k)`` inside an argument);
2. replace each distinct exponential ``e^t`` by a positive indeterminate ``w_t``
   (``e^{−t}`` by ``1/w_t``; ``e^{log x}`` is ``x``) — one ``w`` per score, per ``Max``;
3. in the sparse polynomial ring over ℚ on all indeterminates, compare
   ``num(lhs)·den(rhs)`` with ``num(rhs)·den(lhs)`` (no gcd is ever computed).

Soundness: if the two rational functions agree as elements of ℚ(x, w), they agree at
every point where the denominators are non-zero, in particular at ``w_t = e^t`` for all
real inputs (every denominator the algorithm divides by is a sum of positive
exponentials). The ``w`` are treated as independent, which can only make the test
*stricter*: a relation between exponentials that the test ignores could make it miss an
identity (reported UNDECIDED, never PROVED), but it can never prove a false one.
"""

from __future__ import annotations

from typing import Any

import sympy
from sympy.polys.domains import QQ
from sympy.polys.rings import PolyElement, ring


class Unsupported(Exception):
    """The expression has a construct outside the fragment the zero test decides."""


class ExpAtoms:
    """The map ``e^t ↦ w_t`` (positive symbols), shared by both sides of an equation."""

    def __init__(self) -> None:
        self.symbols: dict[Any, sympy.Symbol] = {}

    def _factor(self, term: sympy.Expr) -> sympy.Expr:
        if isinstance(term, sympy.log):
            return term.args[0]
        if term.is_Number:
            if not term.is_finite:
                raise Unsupported(f"exp of {term}")
            return sympy.exp(term)
        negative = term.could_extract_minus_sign()
        key: Any = -term if negative else term
        if isinstance(key, sympy.Max):  # Max(Max(a, b), c) and Max(a, b, c) are one shift
            key = frozenset(_flat_max_args(key))
        w = self.symbols.get(key)
        if w is None:
            w = self.symbols[key] = sympy.Symbol(f"w{len(self.symbols)}", positive=True)
        return 1 / w if negative else w

    def rationalize(self, expr: sympy.Expr) -> sympy.Expr:
        """``expr`` with every ``e^{a+b+…}`` replaced by ``w_a·w_b·…``."""
        return expr.replace(
            lambda e: isinstance(e, sympy.exp),
            lambda e: sympy.Mul(*[self._factor(t) for t in sympy.Add.make_args(e.args[0])]),
        )


def _flat_max_args(expr: sympy.Expr) -> list[sympy.Expr]:
    out: list[sympy.Expr] = []
    for arg in expr.args:
        out.extend(_flat_max_args(arg) if isinstance(arg, sympy.Max) else [arg])
    return out


class _Fractions:
    """Expressions → (numerator, denominator) in one sparse polynomial ring over ℚ."""

    def __init__(self, gens: list[sympy.Symbol]) -> None:
        self.ring, *gens_ = ring(gens, QQ)
        self.gens = dict(zip(gens, gens_))
        self.memo: dict[sympy.Expr, tuple[PolyElement, PolyElement]] = {}

    def __call__(self, e: sympy.Expr) -> tuple[PolyElement, PolyElement]:
        hit = self.memo.get(e)
        if hit is None:
            hit = self.memo[e] = self._convert(e)
        return hit

    def _convert(self, e: sympy.Expr) -> tuple[PolyElement, PolyElement]:
        one = self.ring.one
        if e.is_Symbol:
            return self.gens[e], one
        if e.is_Rational:
            return self.ring.ground_new(QQ(int(e.p), int(e.q))), one
        if e.is_Add:
            num, den = self(e.args[0])
            for arg in e.args[1:]:
                n, d = self(arg)
                if d == den:
                    num = num + n
                else:
                    num, den = num * d + n * den, den * d
            return num, den
        if e.is_Mul:
            num, den = one, one
            for arg in e.args:
                n, d = self(arg)
                num, den = num * n, den * d
            return num, den
        if e.is_Pow and e.exp.is_Integer:
            n, d = self(e.base)
            k = int(e.exp)
            if k < 0:
                if n == 0:
                    raise Unsupported(f"division by zero in {e}")
                n, d, k = d, n, -k
            return n**k, d**k
        raise Unsupported(f"{type(e).__name__} in the zero test: {sympy.srepr(e)[:200]}")


def _as_expr(x: Any) -> sympy.Expr:
    return sympy.sympify(x)


def equal(lhs: Any, rhs: Any) -> bool:
    """True iff ``lhs = rhs`` is proved as an identity of rational functions (see module).

    False means *not proved*; the caller looks for a numeric counterexample. Raises
    :class:`Unsupported` if either side leaves the decidable fragment (NaN, ∞ left over,
    ``Max`` outside an exponential, ...).
    """
    lhs, rhs = _as_expr(lhs), _as_expr(rhs)
    if lhs == rhs:
        return True
    for side in (lhs, rhs):
        if side.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
            raise Unsupported(f"non-finite value in {side}")
    atoms = ExpAtoms()
    a, b = atoms.rationalize(lhs), atoms.rationalize(rhs)
    gens = sorted(a.free_symbols | b.free_symbols, key=sympy.default_sort_key)
    if not gens:
        return sympy.nsimplify(a - b) == 0
    fractions = _Fractions(gens)
    (na, da), (nb, db) = fractions(a), fractions(b)
    return na * db == nb * da


def all_equal(lhs: Any, rhs: Any) -> tuple[bool, tuple[int, ...] | None]:
    """Entrywise :func:`equal` over two same-shape object arrays; the first failing index."""
    import numpy as np

    lhs, rhs = np.asarray(lhs, dtype=object), np.asarray(rhs, dtype=object)
    if lhs.shape != rhs.shape:
        raise ValueError(f"shapes differ: {lhs.shape} vs {rhs.shape}")
    for index in np.ndindex(lhs.shape):
        if not equal(lhs[index], rhs[index]):
            return False, index
    return True, None
