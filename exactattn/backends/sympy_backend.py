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

import numpy as np
import sympy

from .base import ObjectContext
from .mpmath_backend import _elementwise


class SympyContext(ObjectContext):
    """Exact symbolic arithmetic (no rounding, ``exact = True``)."""

    name = "sympy"
    exact = True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SympyContext)

    def __hash__(self) -> int:
        return hash(self.name)

    def _convert(self, x: Any) -> sympy.Expr:
        if isinstance(x, (np.floating, np.integer)):
            x = x.item()
        expr = sympy.sympify(x)
        if expr.is_extended_real is False:  # ±oo (⊥ in stats) and free symbols are allowed
            raise TypeError(f"entries must be real; got {expr}")
        return expr

    def scalar(self, x: Any) -> sympy.Expr:
        return self._convert(x)

    def default_scale(self, d: int) -> sympy.Expr:
        return 1 / sympy.sqrt(d)

    @property
    def neg_inf(self) -> sympy.Expr:
        return sympy.S.NegativeInfinity

    def exp(self, x: np.ndarray) -> np.ndarray:
        return _elementwise(sympy.exp, x)

    def log(self, x: np.ndarray) -> np.ndarray:
        return _elementwise(sympy.log, x)

    @property
    def _max(self) -> np.ufunc:
        return np.frompyfunc(sympy.Max, 2, 1)

    def nonfinite(self, x: np.ndarray) -> np.ndarray:
        bad = (sympy.nan, sympy.oo, -sympy.oo, sympy.zoo)
        return _elementwise(lambda e: any(e.has(b) for b in bad), x).astype(bool)
