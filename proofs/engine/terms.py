"""Light exact terms: the number type the library runs on inside the enumerated proofs.

:class:`TermContext` is :class:`~proofs.context.ProofContext` (free max, exact floats) whose
entries are :class:`Term` s instead of sympy expressions. sympy spends most of a proof run
*building* the library's expressions — ``Mul.flatten`` and the assumption queries it asks
of every new product — although the zero test (:mod:`proofs.symbolic`) reads each
expression into ``ℚ(x, E, L)`` afterwards and needs none of that rewriting. A term is built
with only the rewriting that keeps values *equal*:

* numbers fold exactly (``Fraction``; −∞, ∞, NaN and ``zoo`` as sympy's);
* a sum is a linear combination ``k + Σ c_t·t`` (rational ``k``, ``c_t``), flattened, like
  terms collected and zero coefficients dropped; a number times a sum is distributed, so an
  exponent ``s − (m + log ℓ)`` reads ``s − m − log ℓ``, the form whose ``log`` the zero test
  turns into ``ℓ⁻¹``;
* a product is ``Π t^{n_t}`` (integer ``n_t``), flattened, like factors collected; a
  product is never distributed over a sum;
* ``0·t = 0`` and ``t ± ∞ = ±∞`` for a finite ``t`` (no NaN, ∞ or ``zoo`` in it), as sympy
  does; ``e^{−∞} = 0``, ``e^0 = 1``, ``e^{log u} = u``, ``log 1 = 0``;
* anything else (a non-finite number meeting a term, a power that is not an integer)
  is computed by sympy on the terms' sympy forms, and the result is one opaque term.

Every rule is an identity of real values, so a term denotes exactly the value sympy would
have built. ``sympy.sympify(t)`` gives its sympy form: unevaluated sums, products, ``exp``
and ``log`` of the same shape (so the zero test, the counterexample search and every
sympy-reading check take it as it is), except under ``tanh``, whose argument is evaluated
so that an opaque ``tanh`` in an exponent has sympy's canonical form on both sides of an
identity. The zero test decides every identity on those sympy forms; that they are the
library's values rests on the rules above being identities of real values, as it rested on
sympy's arithmetic before (the certificate's trusted base names them).
"""

from __future__ import annotations

import functools
import numbers
from fractions import Fraction
from typing import Any

import numpy as np
import sympy

from .context import ProofContext
from .zero_test import node

NUM, SYM, ADD, MUL, EXP, LOG, TANH, OPAQUE = range(8)
_NON_FINITE = (sympy.S.NegativeInfinity, sympy.S.Infinity, sympy.S.NaN, sympy.S.ComplexInfinity)


class Term:
    """One exact real value (module docstring); immutable, hashed by structure.

    ``data`` by ``kind``: NUM a ``Fraction`` or a non-finite sympy number; SYM a sympy
    symbol; OPAQUE a sympy expression; ADD ``(k, {t: c_t})``; MUL ``{t: n_t}``; EXP, LOG,
    TANH the argument term.
    """

    __slots__ = ("_hash", "_sympy", "data", "finite", "kind", "positive")

    def __init__(self, kind: int, data: Any, finite: bool, positive: bool, key: Any) -> None:
        self.kind, self.data, self.finite, self.positive = kind, data, finite, positive
        self._hash = hash((kind, key))
        self._sympy: sympy.Expr | None = None

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Term):
            if isinstance(other, (numbers.Number, sympy.Number, np.number)):
                other = as_term(other)
            elif isinstance(other, sympy.Basic):
                return self._sympy_() == other
            else:
                return NotImplemented
        return self._hash == other._hash and self.kind == other.kind and self.data == other.data

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __bool__(self) -> bool:  # as sympy: only a number can be zero by its form
        return not (self.kind == NUM and self.data == 0)

    def __repr__(self) -> str:
        return str(self._sympy_())

    # --- arithmetic ----------------------------------------------------------------------
    def __add__(self, other: Any) -> Any:
        other = _coerce(other)
        return NotImplemented if other is None else add(self, other)

    __radd__ = __add__

    def __neg__(self) -> Term:
        return scale(self, -1)

    def __sub__(self, other: Any) -> Any:
        other = _coerce(other)
        return NotImplemented if other is None else add(self, -other)

    def __rsub__(self, other: Any) -> Any:
        other = _coerce(other)
        return NotImplemented if other is None else add(other, -self)

    def __mul__(self, other: Any) -> Any:
        other = _coerce(other)
        return NotImplemented if other is None else mul(self, other)

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> Any:
        other = _coerce(other)
        return NotImplemented if other is None else mul(self, power(other, -1))

    def __rtruediv__(self, other: Any) -> Any:
        other = _coerce(other)
        return NotImplemented if other is None else mul(other, power(self, -1))

    def __pow__(self, exponent: Any) -> Any:
        if isinstance(exponent, (int, np.integer)) and not isinstance(exponent, bool):
            return power(self, int(exponent))
        other = _coerce(exponent)
        return NotImplemented if other is None else _by_sympy(sympy.Pow, self, other)

    def __rpow__(self, base: Any) -> Any:
        other = _coerce(base)
        return NotImplemented if other is None else _by_sympy(sympy.Pow, other, self)

    # --- the sympy form ------------------------------------------------------------------
    @property
    def is_nonpositive(self) -> bool:
        """``t ≤ 0`` proved (what the sympy backend's ``nonpositive`` asks)."""
        return nonpositive(self)

    def _sympy_(self) -> sympy.Expr:
        if self._sympy is None:
            self._sympy = _to_sympy(self)
        return self._sympy


# --- building ------------------------------------------------------------------------------
def _q(x: Fraction | int) -> Fraction | int:
    """A rational as an ``int`` when it is one (integer arithmetic is the common, fast case)."""
    if type(x) is int:
        return x
    return x.numerator if x.denominator == 1 else x


def number(value: Any) -> Term:
    """A NUM term: a finite rational (``int`` or ``Fraction``) or a non-finite sympy number."""
    if isinstance(value, sympy.Basic):
        if not value.is_Rational:
            return Term(NUM, value, False, False, value) if value in _NON_FINITE else opaque(value)
        value = Fraction(int(value.p), int(value.q))
    value = _q(value)
    hit = _NUMBERS.get(value)
    if hit is None:
        hit = Term(NUM, value, True, value > 0, value)
        if len(_NUMBERS) < 4096:
            _NUMBERS[value] = hit
    return hit


_NUMBERS: dict[Fraction | int, Term] = {}


def symbol(s: sympy.Symbol) -> Term:
    return Term(SYM, s, True, s.is_positive is True, s)


def opaque(expr: sympy.Expr) -> Term:
    """Any other sympy expression, one atom to the terms (its own form is sympy's)."""
    finite = not any(expr.has(x) for x in _NON_FINITE)
    return Term(OPAQUE, expr, finite, expr.is_positive is True, expr)


def as_term(x: Any) -> Term:
    """``x`` (a term, a Python, NumPy or sympy number, a sympy expression) as a term."""
    if isinstance(x, Term):
        return x
    if isinstance(x, (bool, np.bool_)):
        x = int(x)
    if isinstance(x, (int, np.integer)):
        return number(int(x))
    if isinstance(x, (float, np.floating)):
        value = float(x)
        return number(Fraction(value)) if np.isfinite(value) else number(sympy.sympify(value))
    if isinstance(x, Fraction):
        return number(x)
    expr = sympy.sympify(x)
    if expr.is_Number:
        return number(expr)
    if expr.is_Symbol:
        return symbol(expr)
    return opaque(expr)


def _coerce(x: Any) -> Term | None:
    """An operand as a term; None for what terms do not combine with (an ndarray: numpy
    then applies the operator entrywise)."""
    if isinstance(x, Term):
        return x
    if isinstance(x, (numbers.Number, np.number, np.bool_, sympy.Basic)):
        return as_term(x)
    return None


ZERO, ONE = number(0), number(1)
NEG_INF = number(sympy.S.NegativeInfinity)


def _linear(t: Term) -> tuple[Fraction | int, dict[Term, Fraction | int]]:
    """``t = k + Σ c_u·u``."""
    if t.kind == NUM:
        return t.data, {}
    if t.kind == ADD:
        return t.data
    return 0, {t: 1}


def _sum(k: Fraction | int, items: dict[Term, Fraction | int]) -> Term:
    k = _q(k)
    if not items:
        return number(k)
    if k == 0 and len(items) == 1:
        ((t, c),) = items.items()
        if c == 1:
            return t
    finite = all(t.finite for t in items)
    positive = k >= 0 and all(c > 0 and t.positive for t, c in items.items())
    return Term(ADD, (k, items), finite, positive, (k, frozenset(items)))


def _by_sympy(op: Any, *terms: Term) -> Term:
    """What no term rule covers (non-finite numbers among terms): sympy decides."""
    return as_term(op(*(t._sympy_() for t in terms)))


_MEMO: dict[tuple, Term] = {}
MEMO_SIZE = 1 << 17  # entries; the table is emptied when full


def _memo(op: Any) -> Any:
    """Remember ``op``'s results by operands: the reverse obligations run the library once
    per query row of ``G`` and rebuild the same scores and ``p`` each time (sympy's own
    cache did this for sympy expressions); a hit also returns the very term built before,
    so equal terms are mostly the same object and compare by identity."""

    @functools.wraps(op)
    def remembered(*args: Any) -> Term:
        key = (op, *args)
        hit = _MEMO.get(key)
        if hit is None:
            if len(_MEMO) >= MEMO_SIZE:
                _MEMO.clear()
            hit = _MEMO[key] = op(*args)
        return hit

    return remembered


@_memo
def add(a: Term, b: Term) -> Term:
    if not (a.finite and b.finite):
        for special, other in ((a, b), (b, a)):
            if special.kind == NUM and not special.finite and other.finite:
                return special  # ±∞ + finite = ±∞, NaN + finite = NaN
        return _by_sympy(sympy.Add, a, b)
    ka, ia = _linear(a)
    kb, ib = _linear(b)
    if len(ia) < len(ib):
        ia, ib = ib, ia
    items = dict(ia)
    for t, c in ib.items():
        c = _q(items.get(t, 0) + c)
        if c:
            items[t] = c
        else:
            del items[t]
    return _sum(ka + kb, items)


@_memo
def scale(t: Term, c: Fraction | int) -> Term:
    """``c·t`` for a rational ``c``: a sum's coefficients are scaled (distributed)."""
    if not t.finite:
        return _by_sympy(sympy.Mul, number(c), t)
    if c == 0:
        return ZERO
    if c == 1:
        return t
    k, items = _linear(t)
    return _sum(k * c, {u: _q(cu * c) for u, cu in items.items()})


def _factors(t: Term) -> dict[Term, int]:
    return t.data if t.kind == MUL else {t: 1}


def _product(factors: dict[Term, int]) -> Term:
    if not factors:
        return ONE
    if len(factors) == 1:
        ((t, n),) = factors.items()
        if n == 1:
            return t
    finite = all(t.finite for t in factors)
    positive = all(t.positive for t in factors)
    return Term(MUL, factors, finite, positive, frozenset(factors.items()))


def _scaled(t: Term) -> tuple[Fraction | int, Term]:
    """``t = c·u`` with ``u`` not a scaled term (a one-item sum with no constant)."""
    if t.kind == ADD:
        k, items = t.data
        if k == 0 and len(items) == 1:
            ((u, c),) = items.items()
            return c, u
    return 1, t


@_memo
def mul(a: Term, b: Term) -> Term:
    if a.kind == NUM and b.kind == NUM:
        if a.finite and b.finite:
            return number(a.data * b.data)
        return _by_sympy(sympy.Mul, a, b)
    if a.kind == NUM or b.kind == NUM:
        c, t = (a, b) if a.kind == NUM else (b, a)
        return scale(t, c.data) if c.finite else _by_sympy(sympy.Mul, a, b)
    if not (a.finite and b.finite):
        return _by_sympy(sympy.Mul, a, b)
    ca, ua = _scaled(a)
    cb, ub = _scaled(b)
    fa, fb = _factors(ua), _factors(ub)
    if len(fa) < len(fb):
        fa, fb = fb, fa
    factors = dict(fa)
    for t, n in fb.items():
        n = factors.get(t, 0) + n
        if n:
            factors[t] = n
        else:
            del factors[t]
    return scale(_product(factors), ca * cb)


@_memo
def power(t: Term, n: int) -> Term:
    """``t^n`` for an integer ``n``."""
    if t.kind == NUM:
        if t.finite and (n >= 0 or t.data != 0):
            return number(Fraction(t.data) ** n)
        return _by_sympy(sympy.Pow, t, number(n))
    if n == 0:
        return ONE
    if not t.finite:
        return _by_sympy(sympy.Pow, t, number(n))
    c, u = _scaled(t)
    return scale(_product({f: k * n for f, k in _factors(u).items()}), c**n)


@_memo
def exp(t: Term) -> Term:
    """``e^t``: exact at numbers, ``e^{log u} = u``, otherwise an EXP term."""
    if t.kind == NUM:
        if t.data == 0:
            return ONE
        if t.data is sympy.S.NegativeInfinity:
            return ZERO
        return as_term(sympy.exp(sympy.sympify(t.data)))
    if t.kind == LOG:
        return t.data
    if not t.finite:
        return _by_sympy(sympy.exp, t)
    return Term(EXP, t, True, True, t)


def log(t: Term) -> Term:
    """``log t``: sympy's at a number (``log 1 = 0``), otherwise a LOG term."""
    if t.kind == NUM or not t.finite:
        return _by_sympy(sympy.log, t)
    return Term(LOG, t, True, False, t)


def tanh(t: Term) -> Term:
    if t.kind == NUM or not t.finite:
        return _by_sympy(sympy.tanh, t)
    return Term(TANH, t, True, False, t)


def nonpositive(t: Term) -> bool:
    """``t ≤ 0`` proved: by its form where that decides, else by sympy's sign rules."""
    if t.positive:
        return False
    if t.kind == NUM:
        return bool(t.data <= 0) if t.finite else t.data is sympy.S.NegativeInfinity
    return t._sympy_().is_nonpositive is True


# --- the sympy form ------------------------------------------------------------------------
def _rational(value: Fraction | int) -> sympy.Rational:
    if type(value) is int:
        return sympy.Integer(value)
    return sympy.Rational(value.numerator, value.denominator)


def _to_sympy(t: Term) -> sympy.Expr:
    kind, data = t.kind, t.data
    if kind == NUM:
        return _rational(data) if t.finite else data
    if kind in (SYM, OPAQUE):
        return data
    if kind == ADD:
        k, items = data
        args = [_rational(k)] if k else []
        for u, c in items.items():
            us = u._sympy_()
            args.append(us if c == 1 else node(sympy.Mul, _rational(c), us))
        return args[0] if len(args) == 1 else node(sympy.Add, *args)
    if kind == MUL:
        args = [
            u._sympy_() if n == 1 else node(sympy.Pow, u._sympy_(), sympy.Integer(n))
            for u, n in data.items()
        ]
        return args[0] if len(args) == 1 else node(sympy.Mul, *args)
    if kind == EXP:
        return node(sympy.exp, data._sympy_())
    if kind == LOG:
        return node(sympy.log, data._sympy_())
    return sympy.tanh(_evaluated(data._sympy_()))


def _evaluated(expr: sympy.Expr) -> sympy.Expr:
    """sympy's canonical form of an unevaluated tree (for an opaque function's argument)."""
    if not expr.args:
        return expr
    return expr.func(*(_evaluated(a) for a in expr.args))


# --- the context ---------------------------------------------------------------------------
class TermContext(ProofContext):
    """:class:`ProofContext` over :class:`Term` entries (module docstring)."""

    name = "terms+free-max"

    def _convert(self, x: Any) -> Term:
        if isinstance(x, Term):
            return x
        return as_term(super()._convert(x))

    def default_scale(self, d: int) -> Term:
        return as_term(super().default_scale(d))

    @property
    def neg_inf(self) -> Term:
        return NEG_INF

    def _fresh_max(self, name: str) -> Term:
        return symbol(super()._fresh_max(name))

    @staticmethod
    def _finite(x: Any) -> bool:
        return as_term(x).finite

    @staticmethod
    def _exp(x: Any) -> Term:
        return exp(as_term(x))

    @staticmethod
    def _log(x: Any) -> Term:
        return log(as_term(x))

    @staticmethod
    def _tanh(x: Any) -> Term:
        return tanh(as_term(x))
