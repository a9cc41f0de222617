"""The zero test: decide ``lhs = rhs`` for the expressions the sympy backend produces.

Every quantity the tiled code computes over the sympy backend is built from polynomials in
the input symbols, ``+ − × ÷``, ``exp``, ``log``, ``tanh`` (soft-capping) and the running
max (``Max``, or the free max symbols of :class:`proofs.context.ProofContext`), the max
occurring only inside ``exp`` (as a shift) or beside a ``log`` (``lse = m + log ℓ``). The
test turns such an expression into an element of the rational function field ``ℚ(x, E, L)``:

0. every ``tanh u`` is read as ``(e^{2u} − 1)/(e^{2u} + 1)`` — an identity of real
   functions whose denominator is never 0, so the image has the same value at every
   point (a ``tanh`` inside an exponent is an opaque term of it, below);
1. every exponent ``t`` is written as ``Σ_k c_k μ_k + Σ n_u log u`` — monomials ``μ_k`` of
   the input symbols (and of the free max symbols; an opaque term such as ``Max(a, b)``
   counts as one symbol) with rational ``c_k``, plus logs with integer ``n_u``; then
   ``e^t = Π_k E_k^{c_k L_k} · Π u^{n_u}`` with one fresh positive indeterminate
   ``E_k = e^{μ_k / L_k}`` per monomial (``L_k`` the lcm of the denominators of ``μ_k``'s
   coefficients), so ``e^{a+b} = e^a e^b`` holds by construction;
2. a ``log u`` outside an exponent is one more fresh indeterminate (per distinct ``u``);
3. the two sides become fractions ``num/den`` of polynomials over ℚ, kept reduced by gcds
   (python-flint's ``fmpq_mpoly`` when installed, sympy's sparse ring otherwise), and the
   identity holds iff ``num_l·den_r − num_r·den_l`` is the zero polynomial.

Soundness: the map of step 1 is a homomorphism from the expressions into ``ℚ(x, E, L)``
for *every* value of the indeterminates it introduces, in particular for ``E_k`` the true
exponentials and the free max symbols the true maxima; if the images agree as rational
functions, the expressions agree at every real point where the denominators are non-zero
(every denominator the algorithm divides by is a sum of positive exponentials). Treating
the ``E`` and ``L`` as independent can only make the test *stricter*: an identity that
needs a relation between them (``e^{log 2} = 2`` is fine, ``e^{x²} = (e^x)^x`` is not) is
reported not proved (UNDECIDED), never PROVED. There is no numeric step: constants are
compared exactly (``e^{−1000}`` is an indeterminate, never 0) and the fresh indeterminates
are generator slots keyed by sympy objects, so they cannot collide with input symbols.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import numpy as np
import sympy

try:
    import flint
except ImportError:  # the sympy ring is the (slower) fallback
    flint = None


class Unsupported(Exception):
    """The expression has a construct outside the fragment the zero test decides."""


_NONFINITE = (sympy.nan, sympy.zoo, sympy.oo, -sympy.oo)


# --- polynomial rings: python-flint, or sympy's sparse ring ------------------------------
class _FlintRing:
    """``ℚ[v_0..v_{n−1}]`` as python-flint ``fmpq_mpoly`` (gcds in FLINT)."""

    def __init__(self, nvars: int) -> None:
        names = tuple(f"v{i}" for i in range(max(nvars, 1)))
        self.ctx = flint.fmpq_mpoly_ctx.get(names, "lex")
        self.gens = self.ctx.gens()[:nvars]
        self.one, self.zero = self.ctx.constant(1), self.ctx.constant(0)

    def const(self, value: Fraction) -> Any:
        return self.ctx.constant(flint.fmpq(value.numerator, value.denominator))

    @staticmethod
    def gcd(a: Any, b: Any) -> Any:
        return a.gcd(b)

    @staticmethod
    def exquo(a: Any, b: Any) -> Any:
        return a / b

    @staticmethod
    def terms(p: Any) -> Iterable[tuple[tuple[int, ...], Fraction]]:
        for monom, coeff in p.to_dict().items():
            yield tuple(map(int, monom)), Fraction(int(coeff.p), int(coeff.q))


class _SympyRing:
    """``ℚ[v_0..v_{n−1}]`` as sympy's sparse ``PolyElement`` (the fallback)."""

    def __init__(self, nvars: int) -> None:
        from sympy.polys.domains import QQ
        from sympy.polys.rings import ring

        self.QQ = QQ
        names = [sympy.Dummy(f"v{i}") for i in range(max(nvars, 1))]
        self.ring, *gens = ring(names, QQ)
        self.gens = tuple(gens[:nvars])
        self.one, self.zero = self.ring.one, self.ring.zero

    def const(self, value: Fraction) -> Any:
        return self.ring.ground_new(self.QQ(value.numerator, value.denominator))

    @staticmethod
    def gcd(a: Any, b: Any) -> Any:
        return a.gcd(b)

    @staticmethod
    def exquo(a: Any, b: Any) -> Any:
        return a.exquo(b)

    @staticmethod
    def terms(p: Any) -> Iterable[tuple[tuple[int, ...], Fraction]]:
        for monom, coeff in dict(p).items():
            yield tuple(monom), Fraction(int(coeff.numerator), int(coeff.denominator))


def _ring(nvars: int) -> _FlintRing | _SympyRing:
    return _FlintRing(nvars) if flint is not None else _SympyRing(nvars)


def backend_name() -> str:
    """Which polynomial arithmetic the zero test runs on."""
    return f"python-flint {flint.__version__} fmpq_mpoly" if flint else "sympy sparse ring"


# --- reduced fractions --------------------------------------------------------------------
class _Fractions:
    """Arithmetic on reduced ``(num, den)`` pairs of one ring."""

    def __init__(self, ring: _FlintRing | _SympyRing) -> None:
        self.ring = ring

    def reduce(self, num: Any, den: Any) -> tuple[Any, Any]:
        if num == 0:
            return self.ring.zero, self.ring.one
        if den == self.ring.one:
            return num, den
        g = self.ring.gcd(num, den)
        if g != self.ring.one:
            num, den = self.ring.exquo(num, g), self.ring.exquo(den, g)
        return num, den

    def add(self, a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
        (n1, d1), (n2, d2) = a, b
        if d1 == d2:
            return self.reduce(n1 + n2, d1)
        g = self.ring.gcd(d1, d2)
        c1, c2 = self.ring.exquo(d2, g), self.ring.exquo(d1, g)  # lcm = d1·c1 = d2·c2
        return self.reduce(n1 * c1 + n2 * c2, d1 * c1)

    def mul(self, a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
        (n1, d1), (n2, d2) = a, b
        # cross-cancel first: both inputs are reduced, so only n1/d2 and n2/d1 can share factors
        n1, d2 = self.reduce(n1, d2)
        n2, d1 = self.reduce(n2, d1)
        return n1 * n2, d1 * d2

    def power(self, a: tuple[Any, Any], k: int) -> tuple[Any, Any]:
        num, den = a
        if k < 0:
            if num == 0:
                raise Unsupported("division by zero")
            num, den, k = den, num, -k
        return num**k, den**k


# --- scanning: which indeterminates an expression needs ----------------------------------
def _is_log_term(term: sympy.Expr) -> tuple[int, sympy.Expr] | None:
    """``(n, u)`` when ``term = n·log u`` with an integer n; None if no log factor."""
    coeff, rest = term.as_coeff_Mul()
    if not isinstance(rest, sympy.log):
        return None
    if not coeff.is_Integer:
        raise Unsupported(f"exp of a non-integer multiple of a log: {term}")
    return int(coeff), rest.args[0]


def _flat_max_args(expr: sympy.Expr) -> frozenset:
    out: set = set()
    for arg in expr.args:
        out |= _flat_max_args(arg) if isinstance(arg, sympy.Max) else {arg}
    return frozenset(out)


class _Scan:
    """Walk both sides once: symbols, exponents, logs and opaque exponent terms."""

    def __init__(self) -> None:
        self.symbols: dict[sympy.Symbol, None] = {}
        self.exponents: dict[sympy.Expr, None] = {}
        self.logs: dict[sympy.Expr, None] = {}
        self.opaque: dict[Any, sympy.Dummy] = {}  # Max(...) etc. inside exponents
        self._seen: set = set()
        self._seen_exp: set = set()

    def value(self, e: sympy.Expr) -> None:
        if e in self._seen:
            return
        self._seen.add(e)
        if e.is_Symbol:
            self.symbols[e] = None
        elif e is sympy.E:
            self.exponents[sympy.S.One] = None
        elif e.is_Number:
            if e in _NONFINITE:
                raise Unsupported(f"non-finite value {e} (NaN or ∞ left over)")
            if not e.is_Rational:
                raise Unsupported(f"the inexact constant {e} (the zero test is exact)")
        elif isinstance(e, sympy.exp):
            self.exponents[e.args[0]] = None
            for term in sympy.Add.make_args(e.args[0]):
                log_term = _is_log_term(term)
                if log_term is not None:
                    self.value(log_term[1])
                else:
                    self.exponent(term)
        elif isinstance(e, sympy.log):
            self.logs[e.args[0]] = None
            self.value(e.args[0])
        elif isinstance(e, sympy.tanh):
            self.value(sympy.exp(_double(e.args[0])))
        elif e.is_Add or e.is_Mul:
            for arg in e.args:
                self.value(arg)
        elif e.is_Pow and e.exp.is_Integer:
            self.value(e.base)
        else:
            raise Unsupported(f"{type(e).__name__} in the zero test: {sympy.srepr(e)[:200]}")

    def exponent(self, e: sympy.Expr) -> None:
        """A polynomial part of an exponent; anything else in it becomes one opaque symbol."""
        if e in self._seen_exp:
            return
        self._seen_exp.add(e)
        if e.is_Symbol:
            self.symbols[e] = None
        elif e.is_Number:
            if e in _NONFINITE:
                raise Unsupported(f"non-finite value {e} in an exponent")
            if not e.is_Rational:
                raise Unsupported(f"the inexact constant {e} in an exponent")
        elif e.is_Add or e.is_Mul:
            for arg in e.args:
                self.exponent(arg)
        elif e.is_Pow and e.exp.is_Integer and e.exp >= 0:
            self.exponent(e.base)
        else:
            key = _flat_max_args(e) if isinstance(e, sympy.Max) else e
            if key not in self.opaque:
                self.opaque[key] = sympy.Dummy("opaque", real=True)


# --- conversion ---------------------------------------------------------------------------
class _Field:
    """Expressions → reduced fractions in ``ℚ(symbols, E, L)`` (see the module docstring)."""

    def __init__(self, scan: _Scan) -> None:
        self.scan = scan
        # the exponents' polynomial parts, in a ring of the symbols and the opaque terms
        exp_vars = [*scan.symbols, *scan.opaque.values()]
        exp_ring = _ring(len(exp_vars))
        self._exp_index = {s: k for k, s in enumerate(exp_vars)}
        self._exp_ring = exp_ring
        self._exp_memo: dict[sympy.Expr, Any] = {}
        self._exponent_terms = {
            e: list(exp_ring.terms(self._exponent_poly(e))) for e in scan.exponents
        }  # polynomial part of each exponent, as (monomial, coefficient) pairs
        # one E per monomial, with the lcm of its coefficient denominators
        lcms: dict[tuple[int, ...], int] = {}
        for terms in self._exponent_terms.values():
            for monom, coeff in terms:
                lcms[monom] = math.lcm(lcms.get(monom, 1), coeff.denominator)
        self._monomials = lcms
        gens = [*scan.symbols, *(("log", u) for u in scan.logs), *(("exp", m) for m in lcms)]
        self.ring = _ring(len(gens))
        self._gen = dict(zip(gens, self.ring.gens))
        self.fractions = _Fractions(self.ring)
        self._memo: dict[sympy.Expr, tuple[Any, Any]] = {}

    def _exponent_poly(self, arg: sympy.Expr) -> Any:
        out = self._exp_ring.zero
        for term in sympy.Add.make_args(arg):
            if _is_log_term(term) is None:
                out = out + self._exp_part(term)
        return out

    def _exp_part(self, e: sympy.Expr) -> Any:
        hit = self._exp_memo.get(e)
        if hit is not None:
            return hit
        ring = self._exp_ring
        if e.is_Symbol:
            out = ring.gens[self._exp_index[e]]
        elif e.is_Number:
            out = ring.const(Fraction(int(e.p), int(e.q)))
        elif e.is_Add:
            out = ring.zero
            for arg in e.args:
                out = out + self._exp_part(arg)
        elif e.is_Mul:
            out = ring.one
            for arg in e.args:
                out = out * self._exp_part(arg)
        elif e.is_Pow and e.exp.is_Integer and e.exp >= 0:
            out = self._exp_part(e.base) ** int(e.exp)
        else:
            key = _flat_max_args(e) if isinstance(e, sympy.Max) else e
            out = ring.gens[self._exp_index[self.scan.opaque[key]]]
        self._exp_memo[e] = out
        return out

    def exp(self, arg: sympy.Expr) -> tuple[Any, Any]:
        f = self.fractions
        out = (self.ring.one, self.ring.one)
        for term in sympy.Add.make_args(arg):
            log_term = _is_log_term(term)
            if log_term is not None:
                out = f.mul(out, f.power(self(log_term[1]), log_term[0]))
        num, den = self.ring.one, self.ring.one
        for monom, coeff in self._exponent_terms[arg]:
            k = coeff * self._monomials[monom]  # an integer by the choice of the lcm
            power = self._gen[("exp", monom)] ** abs(int(k))
            num, den = (num * power, den) if k > 0 else (num, den * power)
        return f.mul(out, (num, den))

    def __call__(self, e: sympy.Expr) -> tuple[Any, Any]:
        hit = self._memo.get(e)
        if hit is None:
            hit = self._memo[e] = self._convert(e)
        return hit

    def _convert(self, e: sympy.Expr) -> tuple[Any, Any]:
        f, one = self.fractions, self.ring.one
        if e.is_Symbol:
            return self._gen[e], one
        if e is sympy.E:
            return self.exp(sympy.S.One)
        if e.is_Rational:
            return self.ring.const(Fraction(int(e.p), int(e.q))), one
        if isinstance(e, sympy.exp):
            return self.exp(e.args[0])
        if isinstance(e, sympy.log):
            return self._gen[("log", e.args[0])], one
        if isinstance(e, sympy.tanh):
            exp2 = self(sympy.exp(_double(e.args[0])))
            minus, plus = (f.add(exp2, (self.ring.const(Fraction(k)), one)) for k in (-1, 1))
            return f.mul(minus, f.power(plus, -1))
        if e.is_Add:
            out = self(e.args[0])
            for arg in e.args[1:]:
                out = f.add(out, self(arg))
            return out
        if e.is_Mul:
            out = self(e.args[0])
            for arg in e.args[1:]:
                out = f.mul(out, self(arg))
            return out
        if e.is_Pow and e.exp.is_Integer:
            return f.power(self(e.base), int(e.exp))
        raise Unsupported(f"{type(e).__name__} in the zero test: {sympy.srepr(e)[:200]}")


def node(cls: type, *args: sympy.Expr) -> sympy.Expr:
    """The sympy node ``cls(*args)`` as it stands: no evaluation, no argument checks (for
    ``Pow`` and ``exp``, ``evaluate=False`` still costs ~16 µs a node against 0.4 µs). For
    the trees built to be read by this test (:mod:`.terms`,
    :class:`exactattn.proofs.engine.symbolic_spec.Derivatives`)."""
    obj = sympy.Basic.__new__(cls, *args)
    if issubclass(cls, _COMMUTATIVE_SLOT):  # they hold it in a slot their __new__ sets
        obj.is_commutative = True  # real scalars, all of them
    return obj


_COMMUTATIVE_SLOT = (sympy.core.operations.AssocOp, sympy.Pow)


def _as_expr(x: Any) -> sympy.Expr:
    return sympy.sympify(x)


def _double(u: sympy.Expr) -> sympy.Expr:
    """``2u``, the exponent of ``tanh u = (e^{2u} − 1)/(e^{2u} + 1)`` (step 0)."""
    return 2 * u


def first_difference(lhs: Any, rhs: Any) -> tuple[int, ...] | None:
    """The first index where ``lhs = rhs`` is *not* proved (None: all proved).

    Both are same-shape arrays (or scalars) of expressions; one field serves every entry,
    so a subexpression shared between entries (a row's ℓ) is converted once. Raises
    :class:`Unsupported` if an entry leaves the decidable fragment (NaN, ∞ left over,
    inexact constants, ``Max`` outside an exponential, ...).
    """
    lhs_a, rhs_a = np.asarray(lhs, dtype=object), np.asarray(rhs, dtype=object)
    if lhs_a.shape != rhs_a.shape:
        raise ValueError(f"shapes differ: {lhs_a.shape} vs {rhs_a.shape}")
    pairs = []
    for index in np.ndindex(lhs_a.shape):
        a, b = _as_expr(lhs_a[index]), _as_expr(rhs_a[index])
        if a != b:
            pairs.append((index, a, b))
    if not pairs:
        return None
    scan = _Scan()
    for _, a, b in pairs:
        for side in (a, b):
            scan.value(side)  # each distinct subexpression once; NaN and ∞ raise there
    field = _Field(scan)
    for index, a, b in pairs:
        (na, da), (nb, db) = field(a), field(b)
        if not (na == nb if da == db else na * db == nb * da):
            return index
    return None


def equal(lhs: Any, rhs: Any) -> bool:
    """True iff ``lhs = rhs`` is proved as an identity of rational functions (see module).

    False means *not proved*; the caller looks for a numeric counterexample.
    """
    return first_difference(_as_expr(lhs), _as_expr(rhs)) is None


def all_equal(lhs: Any, rhs: Any) -> tuple[bool, tuple[int, ...] | None]:
    """Entrywise :func:`equal` over two same-shape arrays; the first failing index."""
    index = first_difference(lhs, rhs)
    return index is None, index
