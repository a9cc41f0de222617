"""Concrete counterexamples: evaluate both sides at rational points with mpmath.

A REFUTED verdict must be checkable by hand, so it carries the point (small rationals
for every input symbol), the two values at 30 significant digits, and which entry of
which array differs. A point only counts when the two values differ by more than
``1e-20`` relative to their size, far above the 30-digit evaluation error.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import mpmath
import sympy

DIGITS = 30


@dataclass(frozen=True)
class Counterexample:
    """Input values at which ``lhs`` and ``rhs`` evaluate to different numbers."""

    what: str
    point: dict[str, str]
    lhs: str
    rhs: str
    relation: str = "≠"

    def relabelled(self, what: str) -> Counterexample:
        return Counterexample(what, self.point, self.lhs, self.rhs, self.relation)

    def short(self, limit: int = 6) -> str:
        items = list(self.point.items())
        shown = ", ".join(f"{k}={v}" for k, v in items[:limit])
        more = f", … ({len(items)} inputs)" if len(items) > limit else ""
        return f"{self.what}: {self.lhs} {self.relation} {self.rhs} at {shown}{more}"

    def full(self) -> str:
        point = ", ".join(f"{k}={v}" for k, v in self.point.items())
        return f"{self.what}: {self.lhs} {self.relation} {self.rhs} at {point}"


def _value_for(symbol: sympy.Symbol, rng: random.Random) -> sympy.Rational:
    if symbol.is_positive:
        return sympy.Rational(rng.randint(1, 8), 4)
    if symbol.is_nonnegative:
        return sympy.Rational(rng.randint(0, 8), 4)
    return sympy.Rational(rng.randint(-8, 8), 4)


def evaluate(expr: Any, point: dict[sympy.Symbol, sympy.Rational]) -> mpmath.mpf:
    """``expr`` at ``point`` as an mpmath number (``DIGITS`` significant digits)."""
    expr = sympy.sympify(expr)
    symbols = sorted(expr.free_symbols, key=sympy.default_sort_key)
    fn = sympy.lambdify(symbols, expr, modules="mpmath")
    with mpmath.workdps(DIGITS + 10):
        return mpmath.mpf(fn(*[mpmath.mpf(point[s].p) / point[s].q for s in symbols]))


def _differ(a: mpmath.mpf, b: mpmath.mpf) -> bool:
    if mpmath.isnan(a) or mpmath.isnan(b):
        return mpmath.isnan(a) != mpmath.isnan(b)
    return abs(a - b) > mpmath.mpf("1e-20") * (1 + abs(a) + abs(b))


def _fmt(x: mpmath.mpf) -> str:
    return mpmath.nstr(x, 12)


def find_counterexample(
    what: str, lhs: Any, rhs: Any, *, tries: int = 12, seed: int = 0
) -> Counterexample | None:
    """Search rational points for one where ``lhs ≠ rhs`` numerically; None if none found."""
    lhs, rhs = sympy.sympify(lhs), sympy.sympify(rhs)
    symbols = sorted(lhs.free_symbols | rhs.free_symbols, key=sympy.default_sort_key)
    rng = random.Random(seed)
    for _ in range(tries):
        point = {s: _value_for(s, rng) for s in symbols}
        a, b = evaluate(lhs, point), evaluate(rhs, point)
        if _differ(a, b):
            shown = {str(s): str(v) for s, v in point.items()}
            return Counterexample(what, shown, _fmt(a), _fmt(b))
    return None


def find_positive(what: str, expr: Any, *, tries: int = 12, seed: int = 0) -> Counterexample | None:
    """Search rational points for one where ``expr > 0``; None if none found."""
    expr = sympy.sympify(expr)
    symbols = sorted(expr.free_symbols, key=sympy.default_sort_key)
    rng = random.Random(seed)
    for _ in range(tries):
        point = {s: _value_for(s, rng) for s in symbols}
        value = evaluate(expr, point)
        if value > 0:
            shown = {str(s): str(v) for s, v in point.items()}
            return Counterexample(what, shown, _fmt(value), "0", ">")
    return None
