"""The second opinion on the rules of calculus: forward-mode dual numbers over ``fmpq``.

The reverse is compared with the specification's gradient, which
:class:`.symbolic_spec.Derivatives` builds by the sum, product and chain rules
(:func:`.symbolic_spec.row_gradient`). :func:`check_gradient` decides again that those
gradients are the derivatives of the specification: it evaluates the specification's value
``L = Σ_a g_a Y_a`` itself (never its derivative trees) as a dual number ``(L, D_u L)`` at a
random point, ``D_u`` the directional derivative along a random direction ``u``, and
compares ``D_u L`` with ``Σ_x u_x ∂L/∂x`` from the rules, evaluated at the same point.

The point and the normal form are :mod:`.point_test`'s (exponentials as independent
positive indeterminates ``E_μ = e^{g_μ μ}``, logs as ``L_w``). ``D_u`` is the derivation of
``ℚ(x, E, L)`` with ``D_u x = u_x`` (0 for a symbol that is not differentiated),
``D_u E_μ = E_μ · g_μ D_u μ`` and ``D_u L_w = D_u w / w``: a derivation is fixed by its values
on independent generators, and these are the real directional derivative's, so
``D_u`` of the normal form is the normal form of the real derivative. The identity
``Σ_x u_x ∂L/∂x = D_u L`` in ``ℚ(x, E, L, u)`` is then decided at one point as
:mod:`.point_test` decides identities: the degrees of every value (and of every divisor)
are tracked through the evaluation, the coordinates are drawn from ``{1..2^89}``, and a
degree bound ``d + q`` above ``2^24`` is not evaluated, so a wrong rule passes with
probability at most ``2^24/2^89 / (1 − 2^−65) < 2^−64``.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

import sympy

from . import deciders
from .point_test import (
    MAX_DEGREE,
    REDRAWS,
    SECURITY_BITS,
    Normaliser,
    Pole,
    Unsupported,
    flint,
    number,
)

BITS = SECURITY_BITS + 1 + MAX_DEGREE.bit_length()  # s = 2^89 ≥ 2^65·2^24


class _Q:
    """An exact value at the point with the degrees ``(n, d)`` of its unreduced fraction."""

    __slots__ = ("d", "n", "v")

    def __init__(self, v: Any, n: int, d: int) -> None:
        self.v, self.n, self.d = v, n, d

    def __add__(self, o: _Q) -> _Q:
        return _Q(self.v + o.v, max(self.n + o.d, o.n + self.d), self.d + o.d)

    def __sub__(self, o: _Q) -> _Q:
        return _Q(self.v - o.v, max(self.n + o.d, o.n + self.d), self.d + o.d)

    def __mul__(self, o: _Q) -> _Q:
        return _Q(self.v * o.v, self.n + o.n, self.d + o.d)

    def scaled(self, c: Any) -> _Q:
        return _Q(self.v * c, self.n, self.d)


class _Evaluation:
    """Dual numbers ``(value, D_u value)`` of the nodes, at one point and one direction."""

    def __init__(self, form: Normaliser, rng: random.Random, direction: Iterable[Any]) -> None:
        self.form, self.rng = form, rng
        self.poles = 0
        self._drawn: dict[Any, _Q] = {}
        self.direction = {x: self._coordinate() for x in direction}
        self._memo: dict[sympy.Basic, tuple[_Q, _Q]] = {}
        self._values: dict[sympy.Basic, _Q] = {}

    ZERO = _Q(0, 0, 0)

    def _coordinate(self) -> _Q:
        return _Q(flint.fmpq(self.rng.getrandbits(BITS) + 1), 1, 0)

    def draw(self, key: Any) -> _Q:
        hit = self._drawn.get(key)
        if hit is None:
            hit = self._drawn[key] = self._coordinate()
        return hit

    def inverse(self, x: _Q) -> _Q:
        if x.v == 0:
            raise Pole
        self.poles += x.n
        return _Q(1 / x.v, x.d, x.n)

    def power(self, x: _Q, k: int) -> _Q:
        if k < 0:
            x, k = self.inverse(x), -k
        return _Q(x.v**k, k * x.n, k * x.d)

    def constant(self, c: Any) -> _Q:
        value = number(c) if isinstance(c, sympy.Basic) else c
        return _Q(flint.fmpq(value.numerator, value.denominator), 0, 0)

    # -- values alone (the rules' derivative trees) --------------------------------------------
    def value(self, e: sympy.Basic) -> _Q:
        return self(e)[0]

    # -- dual numbers -----------------------------------------------------------------------
    def __call__(self, e: sympy.Basic) -> tuple[_Q, _Q]:
        hit = self._memo.get(e)
        if hit is None:
            hit = self._memo[e] = self._dual(e)
        return hit

    def _dual(self, e: sympy.Basic) -> tuple[_Q, _Q]:
        if e.is_Symbol:
            return self.draw(("symbol", e)), self.direction.get(e, self.ZERO)
        if e.is_Number:
            return self.constant(e), self.ZERO
        if isinstance(e, sympy.log):
            w, dw = self(e.args[0])
            return self.draw(("log", e.args[0])), dw * self.inverse(w)
        if e is sympy.E or isinstance(e, sympy.exp):
            return self._exp(self.form.exponent_of(e))
        if isinstance(e, sympy.tanh):  # one indeterminate T_w = tanh w, D T_w = (1 − T_w²) D w
            t = self.draw(("opaque", e))
            _, dw = self(e.args[0])
            return t, (self.constant(1) - t * t) * dw
        if e.is_Add:
            v, dv = self(e.args[0])
            for arg in e.args[1:]:
                w, dw = self(arg)
                v, dv = v + w, dv + dw
            return v, dv
        if e.is_Mul:
            v, dv = self(e.args[0])
            for arg in e.args[1:]:
                w, dw = self(arg)
                v, dv = v * w, dv * w + v * dw
            return v, dv
        k = int(e.exp)  # an integer power (the scan checked)
        b, db = self(e.base)
        return self.power(b, k), (self.power(b, k - 1) * db).scaled(k)

    def _atom(self, index: int) -> tuple[_Q, _Q]:
        key = self.form.keys[index]
        if key[0] == "symbol" or (key[0] == "opaque" and not key[1].has(sympy.Max)):
            return self(key[1])  # (a log atom is never in a monomial: it became u^n)
        if any(x in self.direction for x in _symbols(key[1])):
            raise Unsupported(f"the opaque term {key[1]} depends on a differentiated symbol")
        return self.draw(key), self.ZERO

    def _exp(self, key: tuple[sympy.Basic, int]) -> tuple[_Q, _Q]:
        plain, logs = self.form.exponents[key]
        v, rate = self.constant(1), self.ZERO  # e^t and D_u t
        for monomial, c in plain.items():
            g = self.form.gcds[monomial]
            v = v * self.power(self.draw(("E", monomial)), int(c / g))
            rate = rate + self._monomial_rate(monomial).scaled(
                flint.fmpq(c.numerator, c.denominator)
            )
        for w, k in logs:
            value, dw = self(w)
            v = v * self.power(value, k)
            rate = rate + (dw * self.inverse(value)).scaled(k)
        return v, v * rate

    def _monomial_rate(self, monomial: tuple[tuple[int, int], ...]) -> _Q:
        """``D_u μ`` for ``μ = Π atom^p`` (the product rule over its atoms)."""
        out = self.ZERO
        atoms = [(self._atom(i), p) for i, p in monomial]
        for k, ((a, da), p) in enumerate(atoms):
            if da.v == 0 and da.n == 0:
                continue
            term = (self.power(a, p - 1) * da).scaled(p)
            for j, ((b, _), q) in enumerate(atoms):
                if j != k:
                    term = term * self.power(b, q)
            out = out + term
        return out


def _symbols(key: Any) -> set:
    if isinstance(key, sympy.Basic):
        return key.free_symbols
    if isinstance(key, frozenset | tuple):
        return set().union(*(_symbols(k) for k in key)) if key else set()
    return set()


def check_gradient(
    what: str,
    weights: Sequence[Any],
    values: Sequence[Any],
    wrt: Sequence[sympy.Symbol],
    gradient: Sequence[Any],
    seed: int | None = None,
) -> None:
    """Decide ``∂(Σ_a w_a v_a)/∂x = gradient_x`` for every symbol ``x`` of ``wrt`` (distinct)
    by dual numbers (module docstring); record it, or raise
    :class:`~.deciders.Disagreement`. Without python-flint, or for a value outside the
    fragment, the rules' gradient stands alone (recorded with the reason)."""
    count = len(wrt)
    if flint is None:
        from exactattn.infra.optional import install_hint

        hint = install_hint("flint")
        deciders.one(deciders.DERIVATIVE, f"dual numbers need python-flint: {hint}", count)
        return
    seed = secrets.randbits(64) if seed is None else seed
    try:
        form = Normaliser()
        seen: set = set()
        for e in (*weights, *values, *gradient):
            form.scan(sympy.sympify(e), seen, deep=True)
        rng = random.Random(seed)
        for _ in range(REDRAWS):
            at = _Evaluation(form, rng, wrt)
            try:
                total, rate = at.constant(0), at.constant(0)
                for w, y in zip(weights, values):
                    wv, _ = at(sympy.sympify(w))  # the weights are constants of the direction
                    yv, dy = at(sympy.sympify(y))
                    total, rate = total + wv * yv, rate + wv * dy
                rules = at.constant(0)
                for x, g in zip(wrt, gradient):
                    rules = rules + at.value(sympy.sympify(g)) * at.direction[x]
                break
            except Pole:
                continue
        else:
            raise Unsupported(f"{REDRAWS} points in a row were poles (seed {seed})")
        bound = max(rate.n + rules.d, rules.n + rate.d) + at.poles
        if bound > MAX_DEGREE:
            raise Unsupported(f"the degree bound {bound} is above {MAX_DEGREE}")
    except Unsupported as err:
        deciders.one(deciders.DERIVATIVE, f"not evaluated: {err}", count)
        return
    if rate.v != rules.v:
        raise deciders.Disagreement(
            f"{what}: the rules of calculus give Σ_x u_x ∂L/∂x = {rules.v}, dual numbers "
            f"D_u L = {rate.v} at a random point and direction (seed {seed})"
        )
    deciders.both(deciders.DERIVATIVE, count)


def derivatives(what: str, expr: Any, wrt: Sequence[sympy.Symbol]) -> list[sympy.Expr]:
    """``sympy.diff(expr, x)`` for each ``x`` of ``wrt`` (distinct symbols), decided again by
    dual numbers (:func:`check_gradient`): the lemmas' derivatives, decided twice."""
    out = [sympy.diff(expr, x) for x in wrt]
    check_gradient(what, [1], [expr], list(wrt), out)
    return out
