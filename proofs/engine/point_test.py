"""The second decider for identities: a normal form evaluated exactly at a random point.

:mod:`.zero_test` decides ``lhs = rhs`` as an identity of rational functions built by sympy's
polynomial rings. This module decides the same identity another way, sharing none of its
code, none of sympy's simplification and none of :mod:`.terms`: it reads the two sides'
expression trees (only their node types and arguments) and evaluates their *normal form* at
one random rational point with python-flint's exact ``fmpq``.

**The normal form.** Every expression of the fragment (rationals, symbols, ``+``, ``×``,
integer powers, ``exp``, ``log``, ``tanh``) denotes an element of the field
``ℚ(x, E, L)``:

* an exponent ``t`` is expanded into a polynomial ``Σ_μ c_μ μ + Σ_u n_u log u`` over the
  free symbols (a ``log u``, a ``Max`` or any other non-polynomial part is one atom of it;
  a log atom may only occur alone, with an integer coefficient ``n_u``);
* ``e^t = Π_μ E_μ^{c_μ/g_μ} · Π_u u^{n_u}``, with one positive indeterminate
  ``E_μ = e^{g_μ μ}`` per monomial ``μ`` (``g_μ`` the gcd of μ's coefficients in every
  exponent met, so that each ``c_μ/g_μ`` is an integer). So ``e^{a+b} = e^a·e^b``,
  ``e^{log ℓ} = ℓ``, and each ``e^{s_ij}`` is a product of powers of independent
  indeterminates over the free score symbols;
* ``tanh u = (e^{2u} − 1)/(e^{2u} + 1)``; a ``log u`` outside an exponent is one more
  indeterminate ``L_u`` per distinct ``u``.

Each rule is an identity of real functions, so the expression's value is the normal form's
at ``E_μ = e^{g_μ μ}``, ``L_u = log u``: equal normal forms give equal values wherever
defined, and treating the ``E`` and ``L`` as independent only makes the test stricter.

**The decision.** ``lhs − rhs`` in normal form is ``N/D`` with ``N`` a polynomial of total
degree at most ``d`` (a bound computed node by node on the unreduced fractions). If ``N ≠ 0``,
a point drawn uniformly from ``S^n``, ``S = {1, …, s}``, is a root of ``N`` with probability
at most ``d/s`` (Schwartz–Zippel). The evaluation divides by values whose numerators have
total degree ``q`` together (a point where one is 0 is drawn again), so a false identity
passes with probability at most ``(d/s)/(1 − q/s)``; with ``s = 2^65·max(1, d + q)`` that is
below ``2^−64``, at **one point**. Different pairs of one comparison share the point (each
pair's bound holds on its own). Nothing is rounded: the value at the point is exact.
"""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import sympy

try:
    import flint
except ImportError:  # the second decider needs python-flint
    flint = None

SECURITY_BITS = 64
MAX_DEGREE = 1 << 24  # beyond this bound the evaluation is not attempted (Unsupported)
REDRAWS = 8


class Unsupported(Exception):
    """An expression outside the fragment, or a degree bound too large to evaluate."""


class Pole(Exception):
    """The point is a root of a value the evaluation divides by: draw another."""


def available() -> bool:
    """Whether python-flint, which the evaluation needs, is installed."""
    return flint is not None


@dataclass(frozen=True)
class Decision:
    """Which pairs differ at the point, and what bounds the chance of a false pass."""

    different: tuple[int, ...]  # indices into the pairs whose difference is not 0
    degree: int  # d + q: the degree bound of the module docstring
    bits: int  # log2 of s, the size of the range each coordinate is drawn from
    seed: int  # the point's seed (a disagreement can be replayed)
    values: tuple[tuple[Any, Any], ...] = ()  # (lhs, rhs) at the point, for those pairs

    @property
    def bound(self) -> str:
        return f"Pr[false pass] ≤ {self.degree}/2^{self.bits} < 2^-{SECURITY_BITS}"


_Poly = dict[tuple[tuple[int, int], ...], Fraction]  # monomial (atom, power)* → coefficient


def _mul(a: _Poly, b: _Poly) -> _Poly:
    out: _Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            powers = dict(ma)
            for atom, k in mb:
                powers[atom] = powers.get(atom, 0) + k
            monomial = tuple(sorted(powers.items()))
            out[monomial] = out.get(monomial, 0) + ca * cb
    return {m: c for m, c in out.items() if c != 0}


def _add(a: _Poly, b: _Poly) -> _Poly:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0) + c
    return {m: c for m, c in out.items() if c != 0}


def number(e: sympy.Basic) -> Fraction:
    if e in (sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
        raise Unsupported(f"the non-finite value {e}")
    if not e.is_Rational:
        raise Unsupported(f"the inexact constant {e}")
    return Fraction(int(e.p), int(e.q))


def _max_key(e: sympy.Basic) -> Any:
    """A ``Max`` as the set of its flattened arguments (it is associative and commutative)."""
    out: set = set()
    stack = list(e.args)
    while stack:
        arg = stack.pop()
        if isinstance(arg, sympy.Max):
            stack.extend(arg.args)
        else:
            out.add(arg)
    return ("max", frozenset(out))


class Normaliser:
    """The normal form of a set of expressions: their exponents, atoms and degree bounds."""

    def __init__(self) -> None:
        self.atoms: dict[tuple, int] = {}  # ("symbol"|"log"|"max"|"opaque", …) → atom index
        self.keys: list[tuple] = []  # the atoms' keys by index
        self.log_atoms: dict[int, sympy.Basic] = {}  # the index of log u → u
        self.exponents: dict[tuple, tuple[_Poly, tuple[tuple[sympy.Basic, int], ...]]] = {}
        self._expanded: dict[sympy.Basic, _Poly] = {}
        self.gcds: dict[tuple, Fraction] = {}  # g_μ per monomial μ
        self._degrees: dict[sympy.Basic, tuple[int, int]] = {}
        self.poles = 0  # q: the degrees of what the evaluation divides by, summed

    # -- pass 1: the exponents ----------------------------------------------------------------
    def scan(self, e: sympy.Basic, seen: set, deep: bool = False) -> None:
        """Collect every exponent below ``e`` (``tanh u`` reads ``e^{2u}``, ``e`` is ``e^1``);
        ``deep``: in an exponent's opaque terms too (but a ``Max``'s)."""
        stack = [e]
        while stack:
            e = stack.pop()
            if e in seen:
                continue
            seen.add(e)
            if isinstance(e, (sympy.exp, sympy.tanh)) or e is sympy.E:
                key = self.exponent_of(e)
                self._exponent(key)
                stack.extend(u for u, _ in self.exponents[key][1])  # e^{n log u} = u^n
                if deep:
                    stack.extend(k[1] for k in self.keys if k[0] == "opaque")
                    if isinstance(e, sympy.tanh):
                        stack.extend(e.args)
                continue
            if e.is_Number:
                number(e)
            elif e.is_Pow and not e.exp.is_Integer:
                raise Unsupported(f"the power {e} (not an integer exponent)")
            elif not (e.is_Symbol or e.is_Add or e.is_Mul or e.is_Pow
                      or isinstance(e, sympy.log)):  # fmt: skip
                raise Unsupported(f"{type(e).__name__} in an identity: {str(e)[:120]}")
            stack.extend(e.args)

    @staticmethod
    def exponent_of(e: sympy.Basic) -> tuple[sympy.Basic, int]:
        """``(t, k)`` for the exponential ``e^{k·t}`` that ``e`` is or reads."""
        if e is sympy.E:
            return sympy.S.One, 1
        return e.args[0], 2 if isinstance(e, sympy.tanh) else 1

    def _atom(self, key: Any) -> int:
        if key not in self.atoms:
            self.atoms[key] = len(self.atoms)
            self.keys.append(key)
            if key[0] == "log":
                self.log_atoms[self.atoms[key]] = key[1]
        return self.atoms[key]

    def _expand(self, e: sympy.Basic) -> _Poly:
        """An exponent's part as a polynomial over atoms."""
        hit = self._expanded.get(e)
        if hit is not None:
            return hit
        if e.is_Symbol:
            out = {((self._atom(("symbol", e)), 1),): Fraction(1)}
        elif e.is_Number:
            value = number(e)
            out = {(): value} if value else {}
        elif e.is_Add:
            out = {}
            for arg in e.args:
                out = _add(out, self._expand(arg))
        elif e.is_Mul:
            out = {(): Fraction(1)}
            for arg in e.args:
                out = _mul(out, self._expand(arg))
        elif e.is_Pow and e.exp.is_Integer and e.exp >= 0:
            out, base = {(): Fraction(1)}, self._expand(e.base)
            for _ in range(int(e.exp)):
                out = _mul(out, base)
        elif isinstance(e, sympy.log):
            out = {((self._atom(("log", e.args[0])), 1),): Fraction(1)}
        else:  # Max, tanh, an exponential inside an exponent...: one opaque real
            key = _max_key(e) if isinstance(e, sympy.Max) else ("opaque", e)
            out = {((self._atom(key), 1),): Fraction(1)}
        self._expanded[e] = out
        return out

    def _exponent(self, key: tuple[sympy.Basic, int]) -> None:
        if key in self.exponents:
            return
        t, scale = key
        plain: _Poly = {}
        logs: list[tuple[sympy.Basic, int]] = []
        for monomial, c in self._expand(t).items():
            c = c * scale
            in_log = [atom for atom, _ in monomial if atom in self.log_atoms]
            if not in_log:
                plain[monomial] = c
                g = self.gcds.get(monomial)
                self.gcds[monomial] = c if g is None else _gcd(g, c)
            elif len(monomial) == 1 and monomial[0][1] == 1 and c.denominator == 1:
                logs.append((self.log_atoms[monomial[0][0]], int(c)))
            else:
                raise Unsupported(f"the exponent {t} has a log times something else")
        self.exponents[key] = (plain, tuple(logs))

    # -- pass 2: degree bounds -----------------------------------------------------------------
    def degree(self, e: sympy.Basic) -> tuple[int, int]:
        """Total degrees ``(deg N, deg D)`` of ``e``'s unreduced fraction; adds to ``poles``."""
        hit = self._degrees.get(e)
        if hit is None:
            hit = self._degrees[e] = self._degree(e)
        return hit

    def _degree(self, e: sympy.Basic) -> tuple[int, int]:
        if e.is_Symbol:
            return 1, 0
        if e.is_Number:
            return 0, 0
        if isinstance(e, sympy.log):
            return 1, 0
        if e is sympy.E or isinstance(e, sympy.exp):
            return self._exp_degree(self.exponent_of(e))
        if isinstance(e, sympy.tanh):
            n, d = self._exp_degree(self.exponent_of(e))
            self.poles += max(n, d)  # ÷ (e^{2u} + 1)
            return max(n, d), max(n, d)
        if e.is_Add:
            n, d = self.degree(e.args[0])
            for arg in e.args[1:]:
                n2, d2 = self.degree(arg)
                n, d = max(n + d2, n2 + d), d + d2
            return n, d
        if e.is_Mul:
            n = d = 0
            for arg in e.args:
                n2, d2 = self.degree(arg)
                n, d = n + n2, d + d2
            return n, d
        k = int(e.exp)  # an integer power (scan checked)
        n, d = self.degree(e.base)
        if k < 0:
            self.poles += n
            return -k * d, -k * n
        return k * n, k * d

    def _exp_degree(self, key: tuple[sympy.Basic, int]) -> tuple[int, int]:
        plain, logs = self.exponents[key]
        n = d = 0
        for monomial, c in plain.items():
            k = c / self.gcds[monomial]
            n, d = (n + int(k), d) if k > 0 else (n, d - int(k))
        for u, k in logs:
            nu, du = self.degree(u)
            if k < 0:
                self.poles += nu
            n, d = (n + k * nu, d + k * du) if k > 0 else (n - k * du, d - k * nu)
        return n, d


def _gcd(a: Fraction, b: Fraction) -> Fraction:
    return Fraction(math.gcd(a.numerator, b.numerator), math.lcm(a.denominator, b.denominator))


class _Point:
    """Exact values at one point: each symbol, each ``E_μ`` and each ``L_u`` in ``{1..s}``."""

    def __init__(self, form: Normaliser, rng: random.Random, bits: int) -> None:
        self.form, self.rng, self.bits = form, rng, bits
        self._drawn: dict[Any, Any] = {}
        self._values: dict[sympy.Basic, Any] = {}

    def _draw(self, key: Any) -> Any:
        hit = self._drawn.get(key)
        if hit is None:
            hit = self._drawn[key] = flint.fmpq(self.rng.getrandbits(self.bits) + 1)
        return hit

    def __call__(self, e: sympy.Basic) -> Any:
        hit = self._values.get(e)
        if hit is None:
            hit = self._values[e] = self._value(e)
        return hit

    def _value(self, e: sympy.Basic) -> Any:
        if e.is_Symbol:
            return self._draw(e)
        if e.is_Number:
            value = number(e)
            return flint.fmpq(value.numerator, value.denominator)
        if isinstance(e, sympy.log):
            return self._draw(("log", e.args[0]))
        if e is sympy.E or isinstance(e, sympy.exp):
            return self._exp(self.form.exponent_of(e))
        if isinstance(e, sympy.tanh):
            e2 = self._exp(self.form.exponent_of(e))
            return (e2 - 1) * self._inverse(e2 + 1)
        if e.is_Add:
            out = self(e.args[0])
            for arg in e.args[1:]:
                out = out + self(arg)
            return out
        if e.is_Mul:
            out = self(e.args[0])
            for arg in e.args[1:]:
                out = out * self(arg)
            return out
        k = int(e.exp)
        base = self(e.base)
        return base**k if k >= 0 else self._inverse(base) ** -k

    @staticmethod
    def _inverse(x: Any) -> Any:
        if x == 0:
            raise Pole
        return 1 / x

    def _exp(self, key: tuple[sympy.Basic, int]) -> Any:
        plain, logs = self.form.exponents[key]
        out = flint.fmpq(1)
        for monomial, c in plain.items():
            k = int(c / self.form.gcds[monomial])
            out = out * self._draw(("E", monomial)) ** k  # E_μ > 0: never a pole
        for u, k in logs:
            value = self(u)
            out = out * (value**k if k >= 0 else self._inverse(value) ** -k)
        return out


def decide(pairs: list[tuple[Any, Any]], seed: int | None = None) -> Decision:
    """Evaluate each pair's difference at one random point (module docstring).

    Raises :class:`Unsupported` for an expression outside the fragment (or a degree bound
    above :data:`MAX_DEGREE`); needs python-flint (:func:`available`).
    """
    pairs = [(sympy.sympify(a), sympy.sympify(b)) for a, b in pairs]
    form = Normaliser()
    seen: set = set()
    for a, b in pairs:
        form.scan(a, seen)
        form.scan(b, seen)
    degree = 0
    for a, b in pairs:
        (na, da), (nb, db) = form.degree(a), form.degree(b)
        degree = max(degree, na + db, nb + da)
    degree += form.poles
    if degree > MAX_DEGREE:
        raise Unsupported(f"the degree bound {degree} is above {MAX_DEGREE}")
    bits = SECURITY_BITS + 1 + max(1, degree).bit_length()  # s = 2^bits ≥ 2^65·max(1, d+q)
    seed = secrets.randbits(64) if seed is None else seed
    rng = random.Random(seed)
    for _ in range(REDRAWS):
        point = _Point(form, rng, bits)
        try:
            values = [(point(a), point(b)) for a, b in pairs]
        except Pole:
            continue
        different = tuple(k for k, (va, vb) in enumerate(values) if va != vb)
        return Decision(different, max(1, degree), bits, seed,
                        tuple(values[k] for k in different))  # fmt: skip
    raise Unsupported(f"{REDRAWS} points in a row were poles (seed {seed})")


def pairs_of(lhs: Any, rhs: Any) -> tuple[list[tuple[int, ...]], list[tuple[Any, Any]]]:
    """The indices and entries of two same-shape arrays whose trees differ."""
    lhs_a, rhs_a = np.asarray(lhs, dtype=object), np.asarray(rhs, dtype=object)
    indices, pairs = [], []
    for index in np.ndindex(lhs_a.shape):
        a, b = sympy.sympify(lhs_a[index]), sympy.sympify(rhs_a[index])
        if a != b:
            indices.append(index)
            pairs.append((a, b))
    return indices, pairs


def backend_name() -> str:
    return f"python-flint {flint.__version__} fmpq" if flint else "not installed"


def method(decisions: Iterable[Decision] = ()) -> str:
    """The certificate's statement of the bound (and the largest degree met, if any)."""
    worst = max((d.degree for d in decisions), default=None)
    text = (
        f"one point per identity, each coordinate uniform in {{1..s}} with "
        f"s = 2^65·max(1, d + q) (d the degree bound of lhs − rhs, q that of the divisors): "
        f"a false identity passes with probability ≤ (d/s)/(1 − q/s) < 2^-{SECURITY_BITS}"
    )
    return text if worst is None else f"{text}; largest d + q met: {worst}"
