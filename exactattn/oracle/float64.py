"""A certified reference in float64: naive attention a block of query rows at a time, with
an enclosure radius from a closed-form rounding-error budget.

For real inputs ``Q (n_q×d)``, ``K (n_k×d)``, ``V (n_k×v)``, ``G (n_q×v)``, taken as the
exact binary values their floats hold, :func:`fast_attention` returns for every output
(``y``, ``lse``, and with ``g`` the VJP ``dq``, ``dk``, ``dv``, ``dbias``) a float64
midpoint and a radius that together *enclose* the exact value of the definition in
:mod:`exactattn.oracle.certified`:

    s_ij = c·q_i·k_j,  then  cap·tanh(s_ij/cap) (softcap),  then  + B_ij (bias),
    A_i = {j : allowed_ij and B_ij ≠ −∞},   m_i = max_{j∈A_i} s_ij,
    P_ij = e^{s_ij − m_i}/ℓ_i,   ℓ_i = Σ_{j∈A_i} e^{s_ij − m_i},   Y = (P∘ρ)V,
    lse_i = m_i + log ℓ_i,   δ_i = Σ_j P_ij ρ_ij dP_ij = G_i·Y_i,   dS = P∘(ρ∘dP − δ),
    dP = G Vᵀ,  dB = dS,  dS̃ = dS∘(1 − tanh²(c·q_i·k_j/cap)),  dQ = c·dS̃ K,
    dK = c·dS̃ᵀ Q,  dV = (P∘ρ)ᵀ G,

with dropout factors ``ρ = keep/(1 − p)``; a row with no allowed key has ``Y = 0``,
``lse = −∞`` and zero gradients. The result is :class:`exactattn.oracle.certified.Enclosure`, so a
caller can swap the two references.

**The computation** is naive attention, written independently of the tiled algorithm: each
block of ``r`` query rows meets *all* its keys at once — one GEMM for the scores, the exact
row maximum ``m_i`` as the shift (no running maximum, no rescaling), ``e^{s − m}``, one
GEMM ``e·[V, |V|]`` for ``z`` and its magnitudes, then the reverse of the same rows with its
own GEMMs. Memory is ``O(r·n_k + n·d)``, never ``(n_q, n_k)``: the allowed set, the bias
and the keep-bits may be *lazy*, callables ``allowed(start, stop)``, ``bias(start, stop)``,
``keep(start, stop)`` that return rows ``start:stop`` (broadcastable to
``(*batch, stop − start, n_k)``), so a case at n = 131072 never builds an n × n table.

**The radius** is a rounding-error budget derived in ``docs/fast_reference.md``, in closed
form from quantities the run already has: row norms ``‖q_i‖``, ``max_j ‖k_j‖``,
``max_j ‖v_j‖``, ``max_j |v_ja|``, ``n_k``, ``d``, ``|m_i|``, ``Σ_j P_ij ρ_ij |v_ja|`` (the
second half of the ``z`` GEMM), and in the reverse two magnitude GEMMs per product. Every
rounding of the standard model with gradual underflow is charged (products, any summation
order of every GEMM and sum, the scale ``1/sqrt(d)``, the dropout factor, the final
products and divisions), and NumPy's float64 ``exp``, ``log``, ``tanh`` are charged
:data:`FUNC_ULPS` units ``u`` relative (+ :data:`FUNC_ABS` absolute for subnormal results),
a margin over what ``tests/reference_fast/test_functions.py`` measures against mpmath. The
spread of the scores enters through the entropy bound ``Σ_j P_ij (m_i − s_ij) ≤ log n_k``
(no per-pair error array is formed). A row whose budget exceeds :data:`VACUOUS` (scores
near float64's range, or ``u·|s|`` that large) gets an infinite radius: the caller then
needs the arb reference (:func:`exactattn.oracle.certified.certified_attention`), as it does for a
``score_mod`` (:class:`NeedsArb`).
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..infra.optional import needs

with needs("exactattn.fast_reference"):
    from .certified import Ball, Enclosure
from .problem import batch_source, check_problem, meets_target

U = 2.0**-53  # unit roundoff of float64
UB = U / (1 - U)  # ū ≥ |log(1 + ε)| for |ε| ≤ u
MU = 2.0**-1074  # the smallest subnormal: bounds the underflow error of one product
FUNC_ULPS = 4.0  # exp, log, tanh within 4u relative (measured: ≤ 1.5u; see the module doc)
FUNC_ABS = 4 * MU  # ... and 4 subnormal spacings absolute where the result is subnormal
GAP = 1500.0  # pairs with m_i − s_ij > GAP weigh < e^{-750}: charged absolutely, as TAU
TAU = 2.0**-1070  # absolute error of one weight e^{s−m} or P_ij (≥ FUNC_ABS + e^{-750})
VACUOUS = 2.0**-10  # a row's relative budget above this: radius ∞ (needs arb)
SLACK = 1 + 2.0**-40  # covers the (1 + u) factors the budget drops and its own rounding
ROW_ELEMENTS = 1 << 22  # r·n_k floats per score tile (32 MB), with at least MIN_ROWS rows
MIN_ROWS = 128  # below ~128 rows the GEMMs lose a third of their speed


class NeedsArb(NotImplementedError):
    """The input is outside what the float64 budget covers; use the arb reference."""


def _gamma(n: float) -> float:
    """``γ_n = n·u/(1 − n·u)``: a sum of ``n`` rounded terms, in any order (Higham §3.1)."""
    return n * U / (1 - n * U) if n * U < 0.5 else math.inf


def _norms(x: np.ndarray) -> np.ndarray:
    """Upper bounds on the row 2-norms ``‖x_i‖`` (the float64 evaluation's error and the
    squares' underflow, ``≤ d·MU`` under the root, charged)."""
    d = x.shape[-1]
    with np.errstate(over="ignore"):
        sq = np.einsum("...i,...i->...", x, x)
    return np.sqrt(sq) * (1 + (d + 4) * U) + math.sqrt(d) * 2.0**-537


def _col(a: np.ndarray) -> np.ndarray:
    """A per-row budget as a column, against an (r, ·) array."""
    return a[:, None]


# --- the problem ------------------------------------------------------------------------
Rows = Callable[[int, int], np.ndarray]


@dataclass(frozen=True)
class _Lazy:
    """``allowed``, ``bias`` and ``keep`` as rows on demand (dense arrays are sliced)."""

    name: str
    source: np.ndarray | Rows | None
    kind: str  # "b" booleans, "f" floats

    @property
    def dense(self) -> bool:
        return isinstance(self.source, np.ndarray)

    def rows(self, r0: int, r1: int, grid: tuple[int, ...]) -> np.ndarray | None:
        """Rows ``r0:r1`` broadcast to ``(*batch, r1 − r0, n_k)`` (a view), or None."""
        if self.source is None:
            return None
        want = (*grid[:-2], r1 - r0, grid[-1])
        if self.dense:
            x = self.source
            x = x if x.shape[-2] == 1 else x[..., r0:r1, :]
            return np.broadcast_to(x, want)
        x = np.asarray(self.source(r0, r1))
        if (self.kind == "b") != (x.dtype == bool) or (self.kind == "f" and x.dtype.kind != "f"):
            what = "booleans" if self.kind == "b" else "floats"
            raise TypeError(f"{self.name}({r0}, {r1}) must return {what}; got dtype {x.dtype}")
        if self.kind == "f" and not (x < np.inf).all():
            raise ValueError(
                f"{self.name}({r0}, {r1}) contains NaN or +inf (−inf is allowed: it excludes "
                "the pair)"
            )
        try:
            return np.broadcast_to(x, want)
        except ValueError:
            raise ValueError(
                f"{self.name}({r0}, {r1}) returned shape {x.shape}, which does not broadcast "
                f"to the rows' grid {want}"
            ) from None


@dataclass(frozen=True)
class _Fast:
    """The validated problem (:func:`exactattn.oracle.problem.check_problem`), its lazy parts."""

    p: Any  # problem.Problem with the dense inputs
    allowed: _Lazy
    bias: _Lazy
    keep: _Lazy
    c_hat: float  # the float64 scale used
    theta_c: float  # |ĉ − c| ≤ theta_c·|ĉ|
    kappa_hat: float  # fl(1/fl(1 − p))


def _dense(x: Any) -> np.ndarray | None:
    """``x`` as an array for certified's checks; None for a row callable (or None)."""
    return None if x is None or callable(x) else np.asarray(x)


def _problem(q, k, v, g, scale, allowed, keep, dropout_p, bias, softcap, gqa) -> _Fast:
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g)):
        if isinstance(x, np.ndarray) and x.dtype == np.longdouble and x.dtype.itemsize > 8:
            raise NeedsArb(f"{name} is {x.dtype}: its values are not float64 numbers")
    dense = {"allowed": _dense(allowed), "bias": _dense(bias), "keep": _dense(keep)}
    lazy_keep = dense["keep"] is None and keep is not None
    # a lazy keep passes certified's dropout check with a stand-in (its rows are checked
    # as they are read)
    keep_checked = np.ones((1, 1), dtype=bool) if lazy_keep else dense["keep"]
    p = check_problem(
        q, k, v, g, scale, dense["allowed"], keep_checked, dropout_p, dense["bias"], softcap, gqa
    )
    if p.scale is None:  # 1/sqrt(d): two correct roundings, none where d is a power of 4
        d = q.shape[-1]
        root = math.isqrt(d)
        exact = root * root == d and root & (root - 1) == 0
        c_hat, theta_c = 1 / math.sqrt(d), 0.0 if exact else 3 * U
    else:
        c_hat = float(p.scale)
        theta_c = 0.0 if c_hat == p.scale else 2 * U
    kappa_hat = 1 / (1 - p.dropout_p) if p.keep is not None else 1.0
    return _Fast(
        p=p,
        allowed=_Lazy("allowed", p.allowed if dense["allowed"] is not None else allowed, "b"),
        bias=_Lazy("bias", p.bias if dense["bias"] is not None else bias, "f"),
        keep=_Lazy("keep", keep if lazy_keep else p.keep, "b"),
        c_hat=c_hat,
        theta_c=theta_c,
        kappa_hat=kappa_hat,
    )


# --- keys and values of one batch element -----------------------------------------------
@dataclass(frozen=True)
class _Keys:
    k: np.ndarray  # (n_k, d) float64
    k_abs: np.ndarray
    k_sum: np.ndarray  # (d,) Σ_j |k_jr|
    k_norm: float  # ≥ max_j ‖k_j‖
    v: np.ndarray  # (n_k, dv)
    vv: np.ndarray  # (n_k, 2dv): [V, |V|]
    v_norm: float  # ≥ max_j ‖v_j‖
    v_max: np.ndarray  # (dv,) max_j |v_ja|

    @classmethod
    def of(cls, k: np.ndarray, v: np.ndarray) -> _Keys:
        k, v = k.astype(np.float64), v.astype(np.float64)
        k_abs = np.abs(k)
        v_abs = np.abs(v)
        return cls(
            k=k,
            k_abs=k_abs,
            k_sum=k_abs.sum(axis=0) * (1 + _gamma(k.shape[0])),
            k_norm=float(_norms(k).max(initial=0.0)),
            v=v,
            vv=np.concatenate([v, v_abs], axis=1),
            v_norm=float(_norms(v).max(initial=0.0)),
            v_max=v_abs.max(axis=0, initial=0.0),
        )


# --- accumulators -----------------------------------------------------------------------
class _Sum:
    """A gradient summed to its input's shape: value, radius (before the final scaling) and
    summand magnitudes, added to by batch source index and row range."""

    def __init__(self, shape: tuple[int, ...]):
        self.value, self.rad, self.terms = (np.zeros(shape) for _ in range(3))

    def add(self, where: tuple, value: np.ndarray, rad: Any, terms: np.ndarray) -> None:
        self.value[where] += value
        self.rad[where] += rad
        self.terms[where] += terms


# --- one block of query rows ------------------------------------------------------------
@dataclass
class _Forward:
    """Rows ``r0:r1`` of one batch element after the forward, and their budgets."""

    y: np.ndarray
    lse: np.ndarray
    lse_lo: np.ndarray
    rad_y: np.ndarray
    rad_lse: np.ndarray
    terms_y: np.ndarray
    terms_lse: np.ndarray
    empty: np.ndarray
    vacuous: np.ndarray
    e: np.ndarray  # e^{x̂}, then P̂ in the reverse (a tile buffer)
    x: np.ndarray  # x̂ = fl(ŝ − m) (a tile buffer)
    t: np.ndarray | None  # tanh(ŝ/cap) with softcap
    dt: np.ndarray | None  # |t̂ − t| per row
    l: np.ndarray
    C: np.ndarray  # budget of the common part of log(ê/e) per row
    beta: float  # ... and of its part proportional to m − s
    ehat: np.ndarray  # |log(ℓ̃/ℓ)|
    lam: float  # |log(ℓ̂/ℓ̃)|
    keep: np.ndarray | None


def _forward(
    f: _Fast, keys: _Keys, q: np.ndarray, at: tuple, rows: tuple[int, int], tiles: dict
) -> _Forward:
    """Scores, the exact row max, weights, Y and lse of one block, with their radii."""
    p = f.p
    n_k, d = keys.k.shape
    dv = keys.v.shape[1]
    r = q.shape[0]
    qs = q if f.c_hat == 1.0 else q * f.c_hat
    theta_q = 0.0 if (f.c_hat == 1.0 and f.theta_c == 0) else UB + f.theta_c * (1 + UB)
    nq = _norms(qs)
    with np.errstate(over="ignore", invalid="ignore"):
        s = np.matmul(qs, keys.k.T, out=tiles["s"][:r])
    # |fl(q'·k) − c·q·k| ≤ (γ_d + θ_q)·‖q'‖‖k‖ + underflow (Cauchy–Schwarz for Σ|q'||k|)
    with np.errstate(over="ignore", invalid="ignore"):
        E = (_gamma(d) + theta_q) * nq * keys.k_norm + d * MU + 2 * MU * math.sqrt(d) * keys.k_norm
        t = dt = None
        if p.softcap is not None:
            cap = p.softcap
            bound = nq * keys.k_norm * (1 + _gamma(d)) + d * MU  # ≥ |ŝ|
            np.divide(s, cap, out=s)
            np.tanh(s, out=s)
            t = s.copy()
            # tanh is 1-Lipschitz: the argument's error passes through, plus tanh's own
            dt = E / cap + UB * bound / cap + MU + FUNC_ULPS * U + FUNC_ABS
            np.multiply(s, cap, out=s)
            E = cap * dt + UB * cap * (1 + FUNC_ULPS * U) + MU
        bias = f.bias.rows(*rows, p.grid)
        ok = f.allowed.rows(*rows, p.grid)
        ok = None if ok is None else ok[at]
        if bias is not None:
            b = bias[at]
            np.add(s, b, out=s)
            finite = b != -np.inf
            ok = finite if ok is None else ok & finite
        if ok is not None:
            np.copyto(s, -np.inf, where=~ok)
        m = s.max(axis=1, initial=-np.inf)
    empty = np.full(r, n_k == 0) if ok is None else ~ok.any(axis=1)
    if np.isnan(m).any() or (m == np.inf).any() or (np.isinf(m) & ~empty).any():
        raise ValueError("a score overflows float64 (|c·q·k| > 1.8e308); rescale the inputs")
    m0 = np.where(empty, 0.0, m)
    x = np.subtract(s, m0[:, None], out=s)
    e = np.exp(x, out=tiles["e"][:r])
    l = np.where(empty, 1.0, e.sum(axis=1))
    keep = f.keep.rows(*rows, p.grid)
    keep = None if keep is None else keep[at]
    ek = e if keep is None else np.where(keep, e, 0.0)
    z = ek @ keys.vv
    del ek
    y = z[:, :dv] * (f.kappa_hat / l)[:, None]
    zt = z[:, dv:] / l[:, None]  # Σ_j P̂_ij r_ij |v_ja|
    log_l = np.log(l)
    lse = m0 + log_l  # and its rounding exactly (TwoSum): hi + lo = m + fl(log ℓ̂)
    back = lse - m0
    lse_lo = np.where(empty, 0.0, (m0 - (lse - back)) + (log_l - back))
    lse = np.where(empty, -np.inf, lse)

    # the budget (docs/fast_reference.md §2–3)
    if bias is not None:  # fl(s' + b) rounds by u·|ŝ| ≤ u(|m| + (m − ŝ))
        E = E + UB * np.abs(m0)
    beta = (2 if bias is not None else 1) * UB * (1 + 2 * U)  # log(ê/e) ∝ m − ŝ: u per rounding
    C = E + FUNC_ULPS * UB  # log(ê/e) ≤ C + beta·|x̂| for |x̂| ≤ GAP
    H = C + beta * GAP
    vacuous = ~(H <= VACUOUS) & ~empty
    C = np.where(vacuous, 0.0, C)
    H = np.where(vacuous, 0.0, H)
    eps1 = np.expm1(C)
    eps2 = beta * math.log(max(n_k, 2)) * np.exp(3 * H)  # the entropy bound Σ P|x̂| ≤ log n
    ebar = eps1 + eps2 + 2 * n_k * TAU  # |ℓ̃/ℓ − 1|
    ehat = ebar / (1 - ebar)  # |log(ℓ̃/ℓ)|
    gn = _gamma(n_k)
    lam = -math.log1p(-gn)
    rho = 2 * UB + (2 * UB if keep is not None else 0.0) + lam
    g2 = (1 + gn) / (1 - gn)
    kbar = f.kappa_hat * (1 + 4 * U)
    vmax = keys.v_max[None, :]
    weights = _col(np.exp(ehat)) * (
        _col(eps1 + ebar) * (_col(np.exp(H + ehat)) * g2 * zt + 3 * TAU * n_k * vmax)
        + _col(eps2) * vmax
    )
    rounding = (math.expm1(rho) + math.exp(rho) * gn) * g2 * zt
    rad_y = SLACK * kbar * (rounding + weights + 3 * TAU * n_k * vmax + 2 * (n_k + 4) * MU) + MU
    rad_lse = SLACK * (lam + ehat + FUNC_ULPS * U * np.abs(log_l) + FUNC_ABS) + MU
    rad_y = np.where(_col(empty), 0.0, np.where(_col(vacuous), np.inf, rad_y))
    rad_lse = np.where(empty, 0.0, np.where(vacuous, np.inf, rad_lse))
    return _Forward(
        y=y,
        lse=lse,
        lse_lo=lse_lo,
        rad_y=rad_y,
        rad_lse=rad_lse,
        terms_y=f.kappa_hat * zt,
        terms_lse=np.where(empty, 0.0, np.abs(m0) + np.abs(log_l)),
        empty=empty,
        vacuous=vacuous,
        e=e,
        x=x,
        t=t,
        dt=dt,
        l=l,
        C=C,
        beta=beta,
        ehat=ehat,
        lam=lam,
        keep=keep,
    )


@dataclass(frozen=True)
class _Counts:
    """How many rounded terms one entry of each gradient sums (rows × broadcast copies)."""

    gamma: float  # γ of the longest of those sums (+1 for the products)
    dq: int
    dk: int
    dv: int


def _reverse(
    f: _Fast,
    keys: _Keys,
    fw: _Forward,
    q: np.ndarray,
    g: np.ndarray,
    counts: _Counts,
    tiles: dict,
) -> dict[str, tuple]:
    """dP, δ = G·Y, dS and its budget W, then this block's parts of dQ, dK, dV (and dB)."""
    r = q.shape[0]
    n_k = keys.k.shape[0]
    dv = keys.v.shape[1]
    live = ~fw.empty & ~fw.vacuous
    D = np.matmul(g, keys.v.T, out=tiles["d"][:r])
    gn = _norms(g)
    dD = _gamma(dv) * gn * keys.v_norm + dv * MU  # |D̂ − G·V| per row (Cauchy–Schwarz)
    Dmax = gn * keys.v_norm * (1 + _gamma(dv)) + dv * MU
    kbar = f.kappa_hat * (1 + 4 * U)
    if fw.keep is not None:
        np.multiply(D, f.kappa_hat, out=D)
        np.copyto(D, 0.0, where=~fw.keep)
        dD = kbar * (dD + 3 * UB * Dmax) + MU
        Dmax = kbar * Dmax * (1 + U)
    delta = np.einsum("ia,ia->i", g, fw.y)
    rad_y = np.where(_col(live), fw.rad_y, 0.0)
    ga = np.abs(g)
    d_delta = (ga * rad_y).sum(axis=1) + _gamma(dv) * (ga * np.abs(fw.y)).sum(axis=1) + dv * MU
    d_delta = d_delta * (1 + _gamma(dv + 1))
    X = np.subtract(D, _col(delta), out=D)  # ρ∘dP − δ
    Xmax = Dmax + np.abs(delta) * (1 + U)
    dX = dD + d_delta + UB * Xmax
    P = np.multiply(fw.e, _col(1 / fw.l), out=fw.e)  # P̂ = ê·fl(1/ℓ̂)
    # log(P̂/P) ≤ π0 + β|x̂| (docs/fast_reference.md §4); zero for empty and vacuous rows
    pi0 = np.where(live, fw.C + fw.ehat + fw.lam + 2 * UB, 0.0)
    pimax = pi0 + fw.beta * GAP
    grow = np.exp(2 * pimax)
    alpha = pi0 * grow + UB + counts.gamma
    gamma_x = np.where(live, np.exp(pimax) * dX, 0.0)
    omega = np.where(live, 9 * TAU * Xmax + 4 * TAU * dX + 2 * MU, 0.0)
    # G'_ij = β·e^{2π}·|x̂_ij|, with |x̂| clamped to GAP (beyond it a pair is charged τ)
    gap = np.negative(np.maximum(fw.x, -GAP, out=fw.x), out=fw.x)
    gap = np.multiply(gap, _col(fw.beta * grow), out=gap)
    mags = tiles["w"][:, :r]
    W = np.abs(X, out=mags[0])  # W = P̂∘(α|X̂| + G'·Xmax + γ) ≥ |dŜ − dS| − ω
    W *= _col(alpha)
    W += np.multiply(gap, _col(np.where(live, Xmax, 0.0)), out=mags[1])
    W += _col(gamma_x)
    W *= P
    dS = np.multiply(X, P, out=X)
    out: dict[str, tuple] = {}
    if f.bias.dense and f.p.g is not None:
        out["dbias"] = (dS.copy(), W + _col(omega), np.abs(dS))
    dsig = None
    if fw.t is not None:  # dS̃ = dS∘(1 − t²), |t̂ − t| ≤ dt
        sig = np.multiply(fw.t, fw.t, out=fw.t)
        np.subtract(1.0, sig, out=sig)
        dsig = (2 + fw.dt) * fw.dt + 2 * UB
        W *= _col(1 + dsig)
        W += np.abs(dS) * _col((dsig + UB) * (1 + 2 * U))
        omega = omega * (1 + dsig)
        np.multiply(dS, sig, out=dS)
    np.abs(dS, out=mags[1])
    mq = dS @ keys.k
    rq, tq = mags @ keys.k_abs
    rq = rq + _col(omega) * keys.k_sum + n_k * MU
    qa = np.abs(q)
    mk = dS.T @ q
    rk, tk = np.swapaxes(mags, 1, 2) @ qa
    rk = rk + (omega @ qa)[None, :] + r * MU
    # dV: |P̂ − P| ≤ P̂(π0 + β|x̂|)e^{2π} + 5τ, and the sum's rounding (keep dropped: ≥)
    Pk = P if fw.keep is None else np.where(fw.keep, P, 0.0)
    mv = Pk.T @ g
    Wv = np.add(gap, _col(pi0 * grow + counts.gamma), out=mags[0])
    Wv *= P
    np.copyto(mags[1], Pk)
    rv, tv = np.swapaxes(mags, 1, 2) @ ga
    rv = rv + 5 * TAU * ga.sum(axis=0)[None, :] + r * MU
    vac_q = _col(fw.vacuous)
    out["dq"] = (mq, np.where(vac_q, np.inf, rq), tq)
    any_vac = bool(fw.vacuous.any())
    out["dk"] = (mk, np.inf if any_vac else rk, tk)
    out["dv"] = (mv, np.inf if any_vac else rv, tv)
    if "dbias" in out:
        value, rad, terms = out["dbias"]
        out["dbias"] = (value, np.where(vac_q, np.inf, rad), terms)
    return out


# --- the public function ----------------------------------------------------------------
def fast_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray | None = None,
    *,
    scale: float | None = None,
    allowed: np.ndarray | Rows | None = None,
    keep: np.ndarray | Rows | None = None,
    dropout_p: float = 0.0,
    bias: np.ndarray | Rows | None = None,
    softcap: float | None = None,
    score_mod: Callable[..., Any] | None = None,
    row_block: int | None = None,
    enable_gqa: bool = False,
) -> Enclosure:
    """Enclosures of naive attention and, with ``g``, of its VJP, in float64 (see the
    module docstring); the arguments are :func:`exactattn.oracle.certified.certified_attention`'s.

    ``allowed``, ``keep``: booleans broadcastable to ``(*batch, n_q, n_k)``, or callables
    ``(start, stop) -> booleans`` broadcastable to ``(*batch, stop − start, n_k)``; ``bias``
    likewise with floats (``−∞`` excludes a pair; a lazy bias has no ``dbias``: it would be
    ``n_q × n_k``). ``row_block``: query rows per block (``None``: ``ROW_ELEMENTS / n_k``, at
    least ``MIN_ROWS``). ``score_mod`` raises :class:`NeedsArb`: an arbitrary float64
    function has no error bound here (the caller falls back to the arb reference).
    """
    if score_mod is not None:
        raise NeedsArb(
            "a score_mod needs the arb reference: call exactattn.certified.certified_attention "
            "(an arbitrary float64 function of the score has no error budget here)"
        )
    start = time.perf_counter()
    f = _problem(q, k, v, g, scale, allowed, keep, dropout_p, bias, softcap, enable_gqa)
    p = f.p
    n_q, n_k = p.q.shape[-2], p.k.shape[-2]
    if row_block is not None and (
        isinstance(row_block, bool) or not isinstance(row_block, numbers.Integral) or row_block < 1
    ):
        raise ValueError(f"row_block must be an integer >= 1 or None; got {row_block!r}")
    rows = int(row_block or max(MIN_ROWS, ROW_ELEMENTS // max(n_k, 1)))
    rows = max(1, min(rows, n_q))
    nb = len(p.batch)
    dv = p.v.shape[-1]
    y = np.zeros((*p.batch, n_q, dv))
    lse = np.zeros((*p.batch, n_q))
    lse_lo = np.zeros_like(lse)
    rad = {"y": np.zeros_like(y), "lse": np.zeros_like(lse)}
    terms = {"y": np.zeros_like(y), "lse": np.zeros_like(lse)}
    empty = np.zeros((*p.batch, n_q), dtype=bool)
    sums: dict[str, _Sum] = {}
    if p.g is not None:
        sums = {"dq": _Sum(p.q.shape), "dk": _Sum(p.k.shape), "dv": _Sum(p.v.shape)}
        if f.bias.dense:
            sums["dbias"] = _Sum(p.bias.shape)
    counts = _counts(p)
    tiles = {name: np.empty((rows, n_k)) for name in ("s", "e", "d")}
    tiles["w"] = np.empty((2, rows, n_k)) if p.g is not None else None
    keys: dict[tuple, _Keys] = {}
    with np.errstate(under="ignore"):
        for r0 in range(0, n_q, rows):
            r1 = min(r0 + rows, n_q)
            for index in np.ndindex(*p.batch):
                src_k = batch_source(index, p.k.shape, nb, p.group)
                src_v = batch_source(index, p.v.shape, nb, p.group)
                if (src_k, src_v) not in keys:
                    keys[src_k, src_v] = _Keys.of(p.k[src_k], p.v[src_v])
                kv = keys[src_k, src_v]
                src_q = batch_source(index, p.q.shape, nb)
                qb = p.q[src_q][r0:r1].astype(np.float64)
                at = (*index, slice(None), slice(None))[: nb + 2]
                fw = _forward(f, kv, qb, at, (r0, r1), tiles)
                here = (*index, slice(r0, r1))
                y[here], lse[here], empty[here] = fw.y, fw.lse, fw.empty
                lse_lo[here] = fw.lse_lo
                rad["y"][here], rad["lse"][here] = fw.rad_y, fw.rad_lse
                terms["y"][here], terms["lse"][here] = fw.terms_y, fw.terms_lse
                if p.g is None:
                    continue
                gb = p.g[index][r0:r1].astype(np.float64)
                parts = _reverse(f, kv, fw, qb, gb, counts, tiles)
                sums["dq"].add((*src_q, slice(r0, r1)), *parts["dq"])
                sums["dk"].add(src_k, *parts["dk"])
                sums["dv"].add(src_v, *parts["dv"])
                if "dbias" in sums:
                    _add_bias(sums["dbias"], index, nb, (r0, r1), parts["dbias"])
    balls = {
        "y": Ball(y, np.zeros_like(y), rad["y"], terms["y"]),
        "lse": Ball(lse, lse_lo, rad["lse"], terms["lse"]),
    }
    if p.g is not None:
        balls.update(_finish(f, sums, counts))
    met = all(meets_target(ball) for ball in balls.values())
    return Enclosure(balls, 53, time.perf_counter() - start, empty, met)


def _counts(p: Any) -> _Counts:
    """Rounded terms per gradient entry: keys × copies for dQ, rows × copies for dK, dV."""
    n_q, n_k = p.q.shape[-2], p.k.shape[-2]
    batch = math.prod(p.batch)

    def copies(shape: tuple[int, ...]) -> int:
        return batch // max(math.prod(shape[:-2]), 1)

    dq, dk, dv = n_k * copies(p.q.shape), n_q * copies(p.k.shape), n_q * copies(p.v.shape)
    return _Counts(_gamma(max(dq, dk, dv) + 1), dq, dk, dv)


def _add_bias(acc: _Sum, index: tuple, nb: int, rows: tuple[int, int], part: tuple) -> None:
    """Add a block's ``dS`` (and radius, magnitudes) into the bias's shape: rows and/or
    columns of size 1 are sums (their rounding is charged in :func:`_finish`)."""
    shape = acc.value.shape
    src = batch_source(index, shape, nb)
    values = []
    for x in part:
        x = x.sum(axis=0, keepdims=True) if shape[-2] == 1 else x
        x = x.sum(axis=1, keepdims=True) if shape[-1] == 1 else x
        values.append(x)
    where = (*src, slice(None) if shape[-2] == 1 else slice(*rows))
    acc.add(where, *values)


def _finish(f: _Fast, sums: dict[str, _Sum], counts: _Counts) -> dict[str, Ball]:
    """Scale the sums (ĉ for dQ, dK; κ̂ for dV) and close their radii (docs §5)."""
    p = f.p
    c, theta = abs(f.c_hat), f.theta_c
    kbar = f.kappa_hat * (1 + 4 * U)
    out = {}
    for name in ("dq", "dk", "dv"):
        s = sums[name]
        n = getattr(counts, name)
        grow = 1 + _gamma(n)  # the float sum of positive radii, rounded down at most this
        if name == "dv":
            value = s.value * f.kappa_hat if f.kappa_hat != 1.0 else s.value
            extra = 3 * UB * kbar * np.abs(s.value) if f.kappa_hat != 1.0 else 0.0
            rad = kbar * (s.rad * grow + n * MU) + extra
            terms = f.kappa_hat * s.terms
        else:
            value = s.value * f.c_hat if f.c_hat != 1.0 else s.value
            rad = c * (1 + theta) * (s.rad * grow + n * MU) + theta * c * np.abs(s.value)
            terms = c * s.terms
        rad = SLACK * (rad + UB * np.abs(value)) + MU
        out[name] = Ball(value, np.zeros_like(value), rad, terms)
    if "dbias" in sums:
        s = sums["dbias"]
        n = math.prod(p.grid) // max(math.prod(p.bias.shape), 1)
        rad = SLACK * (s.rad * (1 + _gamma(n)) + _gamma(n) * s.terms) + MU
        out["dbias"] = Ball(s.value, np.zeros_like(s.value), rad, s.terms)
    return out
