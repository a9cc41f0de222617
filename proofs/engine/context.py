"""The proofs' number system: the library's sympy backend with an uninterpreted max.

(The enumerated forward and reverse runs use :class:`proofs.terms.TermContext`, this
context with light exact terms in place of sympy expressions.)

:class:`ProofContext` is :class:`exactattn.SympyContext` (exact sympy expressions in NumPy
object arrays) with two changes, both sound for the exactness families:

* **the max is uninterpreted.** ``max(a, b)`` is ``a`` when ``b = −∞`` (and vice versa),
  and otherwise a free real symbol ``M_S`` named by the set ``S`` of finite arguments it
  is the max of (flattened, so ``max(max(a, b), c) = max(a, max(b, c)) = M_{a,b,c}``).
  The code never branches on a max (only on ``m = −∞``, which stays exact), so what it
  returns is a function of the ``M_S`` — and the zero test proves the identity for *every*
  value of them, in particular the true maxima. (sympy's ``Max`` is ~75% of a forward run
  and gains nothing: the zero test already treats ``e^{Max(…)}`` as a free unknown.)
  That the shift *is* the max — what keeps every exponent ≤ 0 — is the overflow family's
  theorem, which runs the real ``Max``.
* **exp and log are built without sympy's automatic rewriting** (``exp(t, evaluate=False)``)
  except at numbers (``e^{−∞} = 0``, ``e^0 = 1``, ``log 1 = 0``) and ``e^{log u} = u``: the
  same mathematical values, minus the assumption queries that cost most of a run;
* **the finiteness test visits each shared subexpression once** (the public API validates
  every input and output; the code's expressions share subtrees, which a tree traversal
  visits once per occurrence): an expression is finite iff no ``nan``, ``±∞`` or ``zoo``
  occurs in it, as in the sympy backend;
* **the realness check reads the form first**: an input (the reverse is handed the
  forward's ``Y``) built from rationals and real symbols by ``+``, ``×``, integer powers and
  ``exp`` is real without sympy's assumption queries on it; anything else is asked as the
  sympy backend asks;
* **binary floats are exact rationals.** A Python or NumPy float (``dropout_p = 0.25``)
  becomes the rational it denotes (``1/4``), never an inexact sympy ``Float``, so the
  library's real :class:`exactattn.core.dropout.Dropout` runs with its factor ``1/(1 − p)``
  exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sympy

import exactattn


def exp_unevaluated(x: sympy.Expr) -> sympy.Expr:
    """``e^x``: sympy's at a number, ``u`` at ``x = log u``, otherwise unevaluated."""
    if x.is_Number:
        return sympy.exp(x)
    if isinstance(x, sympy.log):
        return x.args[0]
    return sympy.exp(x, evaluate=False)


def _log(x: sympy.Expr) -> sympy.Expr:
    return sympy.log(x) if x.is_Number else sympy.log(x, evaluate=False)


_NON_FINITE = frozenset((sympy.nan, sympy.oo, -sympy.oo, sympy.zoo))


def _finite(x: sympy.Expr) -> bool:
    """No ``nan``, ``±∞``, ``zoo`` anywhere in ``x`` (each distinct node visited once)."""
    stack, seen = [x], {id(x)}
    while stack:
        node = stack.pop()
        if node.is_Number:
            if node in _NON_FINITE:
                return False
            continue
        for arg in node.args:
            if id(arg) not in seen:
                seen.add(id(arg))
                stack.append(arg)
    return True


def _real(x: sympy.Expr) -> bool:
    """``x`` is real by its form: rationals and real symbols, closed under ``+``, ``×``,
    integer powers and ``exp`` (each distinct node visited once). False means *not shown*:
    the caller then asks sympy, as the sympy backend does."""
    stack, seen = [x], {id(x)}
    while stack:
        node = stack.pop()
        if node.is_Symbol:
            if not node.is_extended_real:
                return False
            continue
        if node.is_Rational:
            continue
        if node.is_Pow:
            if not node.exp.is_Integer:
                return False
            args = (node.base,)
        elif node.is_Add or node.is_Mul or isinstance(node, sympy.exp):
            args = node.args
        else:
            return False
        for arg in args:
            if id(arg) not in seen:
                seen.add(id(arg))
                stack.append(arg)
    return True


class ProofContext(exactattn.SympyContext):
    """The sympy backend with an uninterpreted max and exact floats (module docstring)."""

    name = "sympy+free-max"
    _exp = staticmethod(exp_unevaluated)
    _log = staticmethod(_log)
    _finite = staticmethod(_finite)

    def __init__(self) -> None:
        self._by_set: dict[frozenset, sympy.Dummy] = {}
        self._set_of: dict[sympy.Dummy, frozenset] = {}

    def _convert(self, x: Any) -> sympy.Expr:
        if isinstance(x, (float, np.floating)):
            x = sympy.Rational(float(x))  # exact: a binary float is a dyadic rational
        if isinstance(x, sympy.Expr) and _real(x):
            return x  # what the sympy backend's check would accept, without its queries
        return super()._convert(x)

    def _members(self, x: sympy.Expr) -> frozenset:
        return self._set_of.get(x, frozenset([x]))

    def free_max(self, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
        """``max(a, b)``: exact around −∞, otherwise the free symbol ``M`` of the argument set."""
        if a == sympy.S.NegativeInfinity or a == b:
            return b
        if b == sympy.S.NegativeInfinity:
            return a
        members = self._members(a) | self._members(b)
        if len(members) == 1:
            return next(iter(members))
        symbol = self._by_set.get(members)
        if symbol is None:
            symbol = self._fresh_max(f"M{len(self._by_set)}")
            self._by_set[members], self._set_of[symbol] = symbol, members
        return symbol

    def _fresh_max(self, name: str) -> sympy.Dummy:
        """A new free real symbol for one max."""
        return sympy.Dummy(name, real=True)

    def max_set(self, m: sympy.Expr) -> frozenset:
        """The finite values a max symbol stands for (``{m}`` for anything else)."""
        return self._members(m)

    def _max2(self, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
        return self.free_max(a, b)
