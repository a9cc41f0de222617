"""Exact arithmetic: sympy expressions in NumPy object arrays.

Nothing is rounded: scores are polynomials in the input symbols, ``m`` is a ``Max`` of
them, ``exp``/``log`` stay symbolic. The proofs in ``proofs/`` run the library's tiled
code over this context and check each obligation by symbolic rewriting.

``np.maximum`` cannot order symbols (``cannot determine truth value of Relational``), so
the maximum is ``sympy.Max`` through ``np.frompyfunc``; sympy flattens and sorts nested
``Max``, which makes the max part of ⋆ associative by construction.
"""

from __future__ import annotations

from typing import Any

import mpmath
import numpy as np
import sympy

from .protocol import ObjectContext

_NON_FINITE = (sympy.nan, sympy.oo, -sympy.oo, sympy.zoo)
COMPARED_DIGITS = 50  # an exact output is read to this many digits: finer than any format


def _rational(x: Any) -> sympy.Expr:
    """The exact rational value of a binary float (±∞ as ±oo)."""
    x = float(x)
    return sympy.Rational(x) if np.isfinite(x) else sympy.sympify(x)


def _numeric(e: sympy.Expr) -> mpmath.mpf:
    """An exact expression evaluated to :data:`COMPARED_DIGITS` digits (±oo as ±inf)."""
    if e in (sympy.oo, -sympy.oo):
        return mpmath.mpf("inf") if e == sympy.oo else mpmath.mpf("-inf")
    return mpmath.mpf(str(sympy.N(e, COMPARED_DIGITS)))


_RATIONALS = np.frompyfunc(_rational, 1, 1)
_NUMERIC = np.frompyfunc(_numeric, 1, 1)


class SympyContext(ObjectContext):
    """Exact symbolic arithmetic: nothing is rounded."""

    name = "sympy"
    _exp = staticmethod(sympy.exp)
    _log = staticmethod(sympy.log)
    _tanh = staticmethod(sympy.tanh)
    _max2 = staticmethod(sympy.Max)

    def _convert(self, x: Any) -> sympy.Expr:
        if isinstance(x, (np.floating, np.integer)):
            x = x.item()
        expr = sympy.sympify(x)
        if expr.is_extended_real is False:  # ±oo (⊥ in stats) and free symbols are allowed
            raise TypeError(f"entries must be real; got {expr}")
        return expr

    def scalar(self, x: Any) -> sympy.Expr:
        return self._convert(x)

    def scalar_arg(self, name: str, x: Any) -> sympy.Expr:
        """Any real expression (a symbol ``c`` too), finite."""
        if isinstance(x, bool):
            raise TypeError(f"{name} must be a real number; got {x!r}")
        try:
            expr = self._convert(x)
        except (TypeError, sympy.SympifyError) as error:
            raise TypeError(f"{name} must be a real number or expression; got {x!r}") from error
        if not self._finite(expr):
            raise ValueError(f"{name} must be finite; got {expr}")
        return expr

    def default_scale(self, d: int) -> sympy.Expr:
        return 1 / sympy.sqrt(d)

    def exact_floats(self, x: Any) -> Any:
        """The rationals the floats are (``sympify`` would make 15-digit ``Float``s)."""
        return _RATIONALS(x)

    def comparable(self, x: np.ndarray) -> np.ndarray:
        """``mpf`` numbers of :data:`COMPARED_DIGITS` digits (read at 200 bits)."""
        with mpmath.workprec(200):
            return np.asarray(_NUMERIC(np.asarray(x, dtype=object)), dtype=object)

    @property
    def neg_inf(self) -> sympy.Expr:
        return sympy.S.NegativeInfinity

    @staticmethod
    def _finite(e: sympy.Expr) -> bool:
        return not any(e.has(b) for b in _NON_FINITE)

    def nonpositive(self, x: np.ndarray) -> np.ndarray:
        """Entries sympy can prove ``≤ 0`` (sums of exponentials are positive)."""
        return np.frompyfunc(lambda e: e.is_nonpositive is True, 1, 1)(x).astype(bool)
