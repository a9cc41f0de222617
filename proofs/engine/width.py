"""A tile of any width: one query row against ``w`` keys, ``w`` a symbol.

The forward's induction step and the reverse's per-visit terms (``general``) run the
library's step functions on a tile whose key axis holds one *generic* entry, key ``j`` of
``0..w−1``: its score, key and value are ``s(j)``, ``K(j, r)``, ``V(j, a)``, its dropout
factor ``ρ(j)`` and whether it is allowed ``α(j) ∈ {0, 1}`` (``allowed(j) ⇔ α(j) = 1``).
:class:`WidthContext` is :class:`~proofs.context.ProofContext` with the library's trusted
primitives stated for that row (``ctx`` on exact numbers):

* ``rowsum(x) = Σ_{j=0}^{w−1} x(j)`` and ``matmul(p, V) = Σ_j p(j) V(j, ·)`` when the
  contracted axis is the key axis (both factors depend on ``j``); any other contraction,
  over a fixed axis (``d``, ``v``, one row), is the ordinary one;
* ``rowmax`` of the row is ``M``: a free real symbol (the case "some key allowed": any
  value, in particular the true max) or ``−∞`` (the case "no key allowed", where every
  ``α(j) = 0``);
* ``where(allowed, x, y)`` is ``x`` where ``α(j) = 1`` and ``y`` where ``α(j) = 0``.

Every other operation is elementwise, on the generic entry. :func:`check_equal` decides
``lhs = rhs`` for the linear combinations of such sums the steps produce: both sides are
split into a part free of sums and one summand under ``Σ_j`` (sums over the same range
add, a factor free of ``j`` moves inside — linearity of finite sums); the free parts and,
for ``α(j) = 1`` and ``α(j) = 0`` each, the summands must pass the zero test
(:mod:`exactattn.proofs.engine.zero_test`), the summand with ``j``'s entries as plain symbols. Equal
summands for every ``j`` give equal sums for every ``w``: the identity holds for all widths.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sympy

from . import ledger
from .context import ProofContext

J = sympy.Symbol("j", integer=True, nonnegative=True)
W = sympy.Symbol("w", integer=True, positive=True)
LIMITS = (J, 0, W - 1)
ALPHA = sympy.Function("alpha")  # α(j) ∈ {0, 1}: key j is allowed
KEYED = ("s", "K", "V", "rho", "alpha")  # the generic entry's functions of j


def entry(name: str, *index: int) -> sympy.Expr:
    """Key ``j``'s entry ``name(j, *index)`` (a real number)."""
    return sympy.Function(name, real=True)(J, *index)


def allowed() -> sympy.Expr:
    return sympy.Eq(ALPHA(J), 1)


def _keyed(x: Any) -> bool:
    return any(J in sympy.sympify(e).free_symbols for e in np.asarray(x, dtype=object).flat)


def _sum(x: sympy.Expr) -> sympy.Expr:
    return sympy.Sum(x, LIMITS)


def sum_over_keys(summand: sympy.Expr) -> sympy.Expr:
    """``Σ_{j=0}^{w−1} summand`` (the specification's side)."""
    return _sum(summand)


class WidthContext(ProofContext):
    """The proof context for a one-row tile of symbolic width (module docstring)."""

    name = "sympy+free-max, symbolic width"

    def __init__(self, row_max: sympy.Expr) -> None:
        super().__init__()
        self.row_max = row_max

    def rowsum(self, x: np.ndarray) -> np.ndarray:
        if x.shape[-1] == 1 and _keyed(x):
            return np.frompyfunc(_sum, 1, 1)(x[..., 0]).astype(object)
        return super().rowsum(x)

    def rowmax(self, x: np.ndarray) -> np.ndarray:
        if x.shape[-1] == 1 and _keyed(x):
            return self.full(x.shape[:-1], self.row_max)
        return super().rowmax(x)

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if a.shape[-1] == 1 and b.shape[-2] == 1 and _keyed(a) and _keyed(b):
            product = a[..., :, :1] * b[..., :1, :]  # (…, r, 1) · (…, 1, c): the summand
            return np.frompyfunc(_sum, 1, 1)(product).astype(object)
        return super().matmul(a, b)

    def where(self, cond: Any, a: Any, b: Any) -> np.ndarray:
        cond = np.asarray(cond, dtype=object)
        if not any(isinstance(c, sympy.Basic) for c in cond.flat):
            return super().where(cond.astype(bool), a, b)
        a, b = np.broadcast_arrays(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
        cond = np.broadcast_to(cond, a.shape)
        out = np.empty(a.shape, dtype=object)
        for index in np.ndindex(a.shape):
            out[index] = sympy.Piecewise((a[index], cond[index]), (b[index], True))
        return out


# --- the zero test for linear combinations of Σ_j -------------------------------------------
def split(expr: Any) -> tuple[sympy.Expr, sympy.Expr]:
    """``expr = free + Σ_j summand``: ``(free, summand)``; Unsupported beyond linear."""
    expr = sympy.sympify(expr)
    if not expr.has(sympy.Sum):
        return expr, sympy.S.Zero
    if isinstance(expr, sympy.Sum):
        if expr.limits != (LIMITS,) or expr.function.has(sympy.Sum):
            raise ledger.Undecided(f"a sum other than Σ_(j<w) of a sum-free summand: {expr}")
        return sympy.S.Zero, expr.function
    if isinstance(expr, sympy.Add):
        parts = [split(a) for a in expr.args]
        return sympy.Add(*(p[0] for p in parts)), sympy.Add(*(p[1] for p in parts))
    if isinstance(expr, sympy.Mul):
        free, summand, seen = sympy.S.One, sympy.S.Zero, False
        for factor in expr.args:
            f, s = split(factor)
            if s != 0:
                if seen:
                    raise ledger.Undecided(f"a product of two sums over j: {expr}")
                seen, summand = True, s * free
                free = f * free
            else:
                summand, free = summand * f, free * f
        return free, summand
    raise ledger.Undecided(f"a sum over j inside {type(expr).__name__}: {expr}")


def _plain(expr: sympy.Expr, alpha: int) -> sympy.Expr:
    """The summand for ``α(j) = alpha`` with key j's entries as plain symbols."""
    expr = expr.subs(ALPHA(J), alpha)
    expr = sympy.piecewise_fold(expr)
    table = {
        call: sympy.Symbol(
            "_".join([type(call).__name__, "j", *map(str, call.args[1:])]), real=True
        )
        for call in expr.atoms(sympy.Function)
        if type(call).__name__ in KEYED and call.args and call.args[0] == J
    }
    return expr.xreplace(table)


def check_equal(what: str, lhs: Any, rhs: Any, cases: tuple[int, ...] = (0, 1)) -> None:
    """Prove ``lhs = rhs`` for every width ``w`` and every pattern of allowed keys."""
    lhs_a, rhs_a = np.asarray(lhs, dtype=object), np.asarray(rhs, dtype=object)
    if lhs_a.shape != rhs_a.shape:
        raise ledger.Undecided(f"{what}: shapes differ, {lhs_a.shape} vs {rhs_a.shape}")
    for index in np.ndindex(lhs_a.shape):
        free_l, sum_l = split(lhs_a[index])
        free_r, sum_r = split(rhs_a[index])
        label = f"{what}{list(index) if index else ''}"
        if J in (free_l - free_r).free_symbols:  # key j's own term (dK_j, dV_j)
            for alpha in cases:
                ledger.check_equal(
                    f"{label}, key j {'allowed' if alpha else 'masked'}",
                    _plain(free_l, alpha), _plain(free_r, alpha),
                )  # fmt: skip
        else:
            ledger.check_equal(f"{label}, outside Σ_j", free_l, free_r)
        for alpha in cases:
            ledger.check_equal(
                f"{label}, the summand of Σ_j, key j {'allowed' if alpha else 'masked'}",
                _plain(sum_l, alpha), _plain(sum_r, alpha),
            )  # fmt: skip
