"""The specification side of every obligation, written from the definitions alone.

Nothing here calls the code under test: no mask method, no ``Dropout`` method, no step of
the algorithm. What the library computes is compared against

* **attention**, as a formula with no shift and no tiling (``ρ_ij = 1`` without dropout):

      Y_i = Σ_{j∈A_i} e^{s_ij} ρ_ij V_j / Σ_{j∈A_i} e^{s_ij},   s_ij = c·q_i·k_j,
      e^{lse_i} = Σ_{j∈A_i} e^{s_ij};

  with score modification ``s_ij = cap·tanh(c·q_i·k_j / cap) + B_ij`` (soft-capping first,
  then the additive bias; a ``B_ij = −∞`` entry excludes the pair, ``e^{−∞} = 0``);

  a row with ``A_i = ∅`` has ``Y_i = 0`` and ``lse_i = −∞`` (the ``empty_rows='zero'``
  convention); the reverse is the derivative of ``L = Σ_ia G_ia Y_ia`` by the rules of calculus
  (:class:`Derivatives`, checked against dual numbers over fmpq: :mod:`.dual`);
* **allowed sets** ``A_i`` as inequalities on ``i, j``, the alignment offset ``o`` and the
  lengths (:class:`Allowed`): causal ``j ≤ i + o``, window ``i + o − L ≤ j ≤ i + o + R``,
  padding ``j < len[b]``, with ``o = 0`` (top-left) or ``o = n_k − n_q`` (bottom-right),
  and their conjunctions / disjunctions;
* **dropout** as ``ρ_ij = r_ij / (1 − p)`` with ``r_ij ∈ {0, 1}`` the keep-bit, which is
  itself specified (:func:`keep_bit`) from its published definition — Wellons'
  ``lowbias32`` hash in plain Python integers, chained over (seed, batch·head, i, j) —
  not by the library's vectorised int64 version.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy

from .zero_test import node

# --- allowed sets from inequalities ------------------------------------------------------


@dataclass(frozen=True)
class Allowed:
    """``A_i`` as a predicate ``ok(b, i, j, n_q, n_k)`` on NumPy integer arrays.

    ``b`` indexes the first leading (batch) axis. ``text`` is the definition as written.
    """

    text: str
    ok: Callable[[Any, Any, Any, int, int], Any]

    def grid(self, batch: tuple[int, ...], n_q: int, n_k: int) -> np.ndarray:
        """The boolean ``(*batch, n_q, n_k)`` array of allowed pairs."""
        lead = batch[0] if batch else 1
        b = np.arange(lead).reshape((lead,) + (1,) * (len(batch) - 1 + 2)) if batch else 0
        i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
        return np.broadcast_to(self.ok(b, i, j, n_q, n_k), (*batch, n_q, n_k)).copy()

    def __and__(self, other: Allowed) -> Allowed:
        return Allowed(
            f"({self.text}) ∧ ({other.text})",
            lambda b, i, j, nq, nk: self.ok(b, i, j, nq, nk) & other.ok(b, i, j, nq, nk),
        )

    def __or__(self, other: Allowed) -> Allowed:
        return Allowed(
            f"({self.text}) ∨ ({other.text})",
            lambda b, i, j, nq, nk: self.ok(b, i, j, nq, nk) | other.ok(b, i, j, nq, nk),
        )


def _offset(alignment: str, n_q: int, n_k: int) -> int:
    return {"top-left": 0, "bottom-right": n_k - n_q}[alignment]


def everything() -> Allowed:
    return Allowed("every j", lambda b, i, j, nq, nk: (i >= 0) & (j >= 0))


def causal(alignment: str = "top-left") -> Allowed:
    o = "0" if alignment == "top-left" else "n_k − n_q"
    return Allowed(f"j ≤ i + {o}", lambda b, i, j, nq, nk: j <= i + _offset(alignment, nq, nk))


def window(left: int | None, right: int | None, alignment: str = "top-left") -> Allowed:
    o = "" if alignment == "top-left" else " + n_k − n_q"
    parts = []
    if left is not None:
        parts.append(f"i{o} − {left} ≤ j")
    if right is not None:
        parts.append(f"j ≤ i{o} + {right}")

    def ok(b: Any, i: Any, j: Any, nq: int, nk: int) -> Any:
        centre = i + _offset(alignment, nq, nk)
        lo = (j >= centre - left) if left is not None else (j >= 0)
        return lo & ((j <= centre + right) if right is not None else (i >= 0))

    return Allowed(" ∧ ".join(parts) or "every j", ok)


def padding(lengths: tuple[int, ...]) -> Allowed:
    table = np.array(lengths)
    return Allowed(f"j < len[b], len = {lengths}", lambda b, i, j, nq, nk: j < table[b])


def dense(allowed: np.ndarray) -> Allowed:
    """A caller's own table *is* its definition: ``(i, j) ∈ A`` iff ``allowed[i, j]``."""
    table = np.asarray(allowed, dtype=bool)
    return Allowed("the given table", lambda b, i, j, nq, nk: table[i, j])


# --- dropout keep-bits ---------------------------------------------------------------------
KEEP_BITS = 24
_M32 = 0xFFFFFFFF


def lowbias32(x: int) -> int:
    """Wellons' lowbias32 finaliser (2018), on Python integers mod 2^32."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def keep_bit(p: float, seed: int, flat_batch: int, i: int, j: int) -> int:
    """``r_ij``: 1 iff the top 24 bits of the chained hash reach ``round(p·2^24)``.

    The chain: ``key = h(h(seed mod 2^32) ⊕ ⌊seed/2^32⌋)``, then ``key = h(key ⊕ b)`` with
    ``b`` the flat batch·head index, ``key = h(key ⊕ i)``, and ``h(key ⊕ h(j))``.
    """
    key = lowbias32(lowbias32(seed & _M32) ^ (seed >> 32))
    key = lowbias32(key ^ (flat_batch & _M32))
    key = lowbias32(key ^ i)
    top = lowbias32(key ^ lowbias32(j)) >> (32 - KEEP_BITS)
    return int(top >= round(p * (1 << KEEP_BITS)))


def keep_grid(p: float, seed: int, batch: tuple[int, ...], n_q: int, n_k: int) -> np.ndarray:
    """``r`` on the whole ``(*batch, n_q, n_k)`` grid (b = the row-major flat index)."""
    out = np.empty((math.prod(batch), n_q, n_k), dtype=np.int64)
    for b, i, j in np.ndindex(out.shape):
        out[b, i, j] = keep_bit(p, seed, b, i, j)
    return out.reshape((*batch, n_q, n_k))


def dropout_factors(p: float, seed: int, batch: tuple[int, ...], n_q: int, n_k: int) -> Any:
    """``ρ_ij = r_ij / (1 − p)`` with ``p`` the exact rational of the float given."""
    keep = sympy.Rational(1) / (1 - sympy.Rational(p))
    r = keep_grid(p, seed, batch, n_q, n_k)
    return np.where(r == 1, keep, sympy.S.Zero).astype(object)


# --- attention -----------------------------------------------------------------------------
def _exp(x: Any) -> np.ndarray:
    return np.vectorize(sympy.exp, otypes=[object])(np.asarray(x, dtype=object))


def scores(q: Any, k: Any, c: Any, bias: Any = None, cap: Any = None) -> Any:
    """``s_ij = c·q_i·k_j``, soft-capped to ``cap·tanh(s/cap)``, plus ``B_ij`` (2-D inputs)."""
    s = (q @ k.T) * c
    if cap is not None:
        s = cap * np.vectorize(sympy.tanh, otypes=[object])(s / cap)
    return s if bias is None else s + bias


def naive_output(
    q: Any,
    k: Any,
    v: Any,
    c: Any,
    allowed: Any = None,
    rho: Any = None,
    bias: Any = None,
    cap: Any = None,
) -> Any:
    """``Y`` for 2-D inputs: ``Σ_j e^{s_ij} ρ_ij V_j / Σ_j e^{s_ij}`` over ``A_i``; 0 if empty."""
    e = _exp(scores(q, k, c, bias, cap))
    if allowed is not None:
        e = np.where(allowed, e, sympy.S.Zero)
    weights = e if rho is None else e * rho
    total = e.sum(axis=1)
    out = np.empty((q.shape[0], v.shape[1]), dtype=object)
    for i in range(q.shape[0]):
        row = weights[i] @ v
        out[i] = row / total[i] if total[i] != 0 else row * 0
    return out


def naive_exp_lse(q: Any, k: Any, c: Any, allowed: Any = None, bias: Any = None, cap: Any = None):
    """``e^{lse_i} = Σ_{j∈A_i} e^{s_ij}`` (0 for an empty row: ``lse = −∞``)."""
    e = _exp(scores(q, k, c, bias, cap))
    if allowed is not None:
        e = np.where(allowed, e, sympy.S.Zero)
    return e.sum(axis=1)


def batched(fn: Callable[..., Any], batch: tuple[int, ...], *arrays: Any) -> np.ndarray:
    """``fn`` applied at every leading index of ``batch`` (arrays broadcast, None passes)."""
    out = None
    for index in np.ndindex(*batch):
        args = [None if a is None else at_batch(a, index, len(batch)) for a in arrays]
        value = np.asarray(fn(*args), dtype=object)
        if out is None:
            out = np.empty((*batch, *value.shape), dtype=object)
        out[index] = value
    return out


def at_batch(a: Any, index: tuple[int, ...], ndim_batch: int) -> Any:
    """``a`` at the leading ``index``, broadcasting size-1 and missing leading axes."""
    a = np.asarray(a, dtype=object) if not isinstance(a, np.ndarray) else a
    if not isinstance(a, np.ndarray) or a.ndim < 2:
        return a
    lead = a.ndim - 2
    pad = ndim_batch - lead
    picked = tuple(0 if a.shape[d] == 1 else index[pad + d] for d in range(lead))
    return a[picked]


def row_gradient(g: np.ndarray, y: np.ndarray, wrt: np.ndarray) -> np.ndarray:
    """``∂(Σ_a g_a Y_a)/∂x`` for every symbol of ``wrt`` by the quotient rule: each ``Y_a``
    is a fraction ``N_a/D_a`` (``sympy.fraction``, an identity) and
    ``∂(N/D)/∂x = (∂N/∂x · D − N · ∂D/∂x)/D²``, with :class:`Derivatives` on the numerator and
    the denominator (the Y_a of a row share their denominator: one ``∂D/∂x`` for all a)."""
    parts = [sympy.fraction(sympy.sympify(e)) for e in y]
    cache = Derivatives()
    out = np.empty(wrt.shape, dtype=object)
    for index in np.ndindex(wrt.shape):
        x = wrt[index]
        if not isinstance(x, sympy.Symbol):
            out[index] = sympy.S.Zero
            continue
        terms = []
        for g_a, (n, d) in zip(g, parts):
            dn, dd = cache(n, x), cache(d, x)
            if dn != 0 or dd != 0:
                dy = _add(_mul(dn, d), _mul(sympy.S.NegativeOne, n, dd))
                terms.append(_mul(g_a, dy, node(sympy.Pow, d, sympy.Integer(-2))))
        out[index] = _add(*terms)
    return out


def _add(*args: sympy.Expr) -> sympy.Expr:
    args = tuple(a for a in args if a != 0)
    if len(args) < 2:
        return args[0] if args else sympy.S.Zero
    return node(sympy.Add, *args)


def _mul(*args: sympy.Expr) -> sympy.Expr:
    if any(a == 0 for a in args):
        return sympy.S.Zero
    args = tuple(a for a in args if a != 1)
    if len(args) < 2:
        return args[0] if args else sympy.S.One
    return node(sympy.Mul, *args)


class Derivatives:
    """``∂e/∂x`` by the sum, product and chain rules, built unevaluated (the zero test reads
    any shape; sympy's ``diff`` spends most of a reverse proof on the rewriting of its
    results): ``(Σ u)' = Σ u'``, ``(Π u)' = Σ_k u_k' Π_{i≠k} u_i``, ``(u^n)' = n u^{n−1} u'``
    (integer n), ``(e^u)' = e^u u'``, ``(log u)' = u'/u``, ``(tanh u)' = (1 − tanh² u) u'``;
    anything else is handed to ``sympy.diff``. Results and each node's free symbols are
    remembered (∂e/∂x = 0 at once when x is not in e)."""

    def __init__(self) -> None:
        self._free: dict[sympy.Expr, frozenset] = {}
        self._done: dict[tuple[sympy.Expr, sympy.Symbol], sympy.Expr] = {}

    def free(self, e: sympy.Expr) -> frozenset:
        hit = self._free.get(e)
        if hit is None:
            if e.is_Symbol:
                hit = frozenset((e,))
            elif not e.args:
                hit = frozenset()
            else:
                hit = frozenset().union(*(self.free(a) for a in e.args))
            self._free[e] = hit
        return hit

    def __call__(self, e: sympy.Expr, x: sympy.Symbol) -> sympy.Expr:
        if x not in self.free(e):
            return sympy.S.Zero
        if e == x:
            return sympy.S.One
        hit = self._done.get((e, x))
        if hit is None:
            hit = self._done[e, x] = self._rule(e, x)
        return hit

    def _rule(self, e: sympy.Expr, x: sympy.Symbol) -> sympy.Expr:
        if e.is_Add:
            return _add(*(self(a, x) for a in e.args))
        if e.is_Mul:
            args = e.args
            return _add(*(
                _mul(*args[:k], self(a, x), *args[k + 1 :]) for k, a in enumerate(args)
            ))  # fmt: skip
        if e.is_Pow and e.exp.is_Integer:
            n, u = e.exp, e.base
            power = u if n == 2 else node(sympy.Pow, u, n - 1)
            return _mul(n, power, self(u, x))
        if isinstance(e, sympy.exp):
            return _mul(e, self(e.args[0], x))
        if isinstance(e, sympy.log):
            return _mul(self(e.args[0], x), node(sympy.Pow, e.args[0], sympy.S.NegativeOne))
        if isinstance(e, sympy.tanh):
            sech2 = _add(sympy.S.One, _mul(sympy.S.NegativeOne, e, e))
            return _mul(sech2, self(e.args[0], x))
        return sympy.diff(e, x)


def gradient(loss: sympy.Expr, wrt: np.ndarray) -> np.ndarray:
    """``∂loss/∂x`` for every symbol of ``wrt``, same shape (0 at a constant entry, such as
    a bias's −∞: it is no variable of the loss)."""
    out = np.empty(wrt.shape, dtype=object)
    for index in np.ndindex(wrt.shape):
        x = wrt[index]
        out[index] = sympy.diff(loss, x) if isinstance(x, sympy.Symbol) else sympy.S.Zero
    return out
