"""Error bounds derived from the arithmetic: how far a backend may be from the exact answer.

A configuration rounds with unit roundoff ``u`` in its compute type (scores, ``m``, ``ℓ``,
``z``, δ, γ, the gradient accumulators), ``u_s`` when it stores the result, ``u_p`` when it
casts ``p`` (or γ) before a product (0 without a cast); ``λ`` is the compute type's smallest
normal number (0 for mpmath: no underflow). ``γ_n = n·u / (1 − n·u)`` bounds a recursive sum
of ``n`` terms (Higham, *Accuracy and Stability*, §3.1); any summation order is covered.
The inputs are taken as the backend holds them (already rounded to storage), so the bound
is the error of the arithmetic alone. With ``T = ⌈n_k / b⌉`` key blocks:

* scores: ``|Δs_ij| ≤ E_ij = γ_{d+3}·|c|·Σ_r |Q_ir||K_jr| + d·λ`` (dot product, the product
  with ``c``, ``c`` itself rounded); the row max moves by at most ``E_i = max_{j∈A_i} E_ij``.
* weights ``w_ij = e^{s_ij − m_i}``: relative error ``ω_ij = expm1(η_ij)`` with
  ``η_ij = E_ij + E_i + 2u·|s_ij − m_i| + 2u·(T + 2) + u_p`` — the argument's rounding, the
  exp (2u), and the rescales ``α = e^{m_old − m_new}`` a weight goes through (their arguments
  telescope to at most ``|s_ij − m_i|``, one exp each per block merge), the ``p`` cast and ρ.
* forward ``Y_i = Σ_j w_ij ρ_ij V_j / ℓ_i``, with ``N = n_k + 3T + 2`` roundings in the
  accumulation of ``z`` and ``ℓ``:
  ``|ΔY_ia| ≤ Σ_j p_ij ρ_ij |V_ja| (ω_ij + ω̄_i + 2γ_N + u) + u_s|Y_ia| + λ(n_k + 2)·max_j|V_ja|``
  ``+ σ_s + σ_p Σ_j ρ_ij|V_ja|``, ``ω̄_i = Σ_j p_ij ω_ij`` (the error of ``ℓ``); ``σ_s``,
  ``σ_p`` are half the smallest subnormals of the storage and p-cast types (a result or a
  weight ``e^{s−m} ≤ 1`` that underflows into them is off by up to that much absolutely).
* reverse, with ``p`` recomputed from the frozen ``m, ℓ`` (relative error
  ``π_ij = ω_ij + ω̄_i + γ_N + 3u``, plus ``λ`` absolute), ``dP_ij = ρ_ij G_i·V_j``
  (error ``ρ_ij γ_{v+1} Σ_a|G_ia||V_ja|``), ``δ_i = G_i·Y_i`` read from the stored ``Y``
  (``p`` and γ cast with absolute underflow ``σ_p`` as well)
  (error ``Σ_a |G_ia|(ΔY_ia + γ_v|Y_ia|)``):
  ``|Δγ_ij| ≤ (p_ij π_ij + λ)|dP_ij − δ_i| + p_ij (ΔdP_ij + Δδ_i + (3u + u_p)|dP_ij − δ_i|)``,
  ``|ΔdQ_ir| ≤ |c| Σ_j (|Δγ_ij| + γ_{n_k+T+3}|γ_ij|)|K_jr| + u_s|dQ_ir|``, likewise
  ``dK`` (``γ_{n_q+3}``, over ``i`` with ``Q``) and
  ``|ΔdV_ja| ≤ Σ_i ((p_ij π_ij + λ)ρ_ij + γ_{n_q+2} p_ij ρ_ij)|G_ia| + u_s|dV_ja|``.

Each of these is first order in the relative perturbations; a product of factors
``Π(1 + ε_k)`` with ``Σ|ε_k| = B ≤ 1`` differs from 1 by at most ``e^B − 1 ≤ 2B``, so the
test accepts ``|error| ≤ 2·bound`` (and a bound above ``1`` says the configuration cannot
resolve the case; the check then still requires a finite result). The exponential's
nonlinearity is kept exactly through ``expm1``. Magnitudes (``p``, ``s``, ``γ``) come from
the float64 evaluation of the exact formulas on the same inputs; their own rounding is
``≤ 2^-50`` relative and is absorbed by the same factor.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cases import Case
from .reference import Values

FLOAT64_TINY = 2.0**-1022  # the bound is evaluated in float64


@dataclass(frozen=True)
class Arith:
    """A configuration's rounding: unit roundoffs, underflow threshold and overflow limits."""

    u: float  # compute
    u_s: float  # storage (inputs are exact in it; outputs are rounded to it)
    u_p: float = 0.0  # cast of p / γ before a product
    sub_p: float = 0.0  # half the smallest subnormal of that cast (p may underflow in it)
    tiny: float = 0.0  # λ: smallest normal of the compute type (0: unbounded exponent)
    sub_s: float = 0.0  # half the smallest subnormal of the storage type
    fmax: float = math.inf  # largest finite number of the compute type
    fmax_s: float = math.inf  # ... of the storage type


FP8 = {"e4m3": (2.0**-4, 2.0**-6, 2.0**-9, 448.0), "e5m2": (2.0**-3, 2.0**-14, 2.0**-16, 57344.0)}


def _info(name: str) -> tuple[float, float, float, float]:
    """``(u, smallest normal, smallest subnormal, largest finite)`` of a format name:
    NumPy float names, ``bfloat16``, FP8 ``e4m3``/``e5m2``, or ``pN`` (N bits, no
    exponent limits: mpmath)."""
    if name == "bfloat16":
        return 2.0**-8, 2.0**-126, 2.0**-133, 3.3895313892515355e38
    if name in FP8:
        return FP8[name]
    if name.startswith("p") and name[1:].isdigit():
        return 2.0 ** -int(name[1:]), 0.0, 0.0, math.inf
    fi = np.finfo(np.dtype(name))
    return float(fi.eps) / 2, float(fi.smallest_normal), float(fi.smallest_subnormal), float(fi.max)


def ieee(compute: str, storage: str | None = None, p_cast: str | None = None) -> Arith:
    """The :class:`Arith` of formats named as NumPy names them (``bfloat16``, FP8 and
    ``pN`` too)."""
    return formats([compute], storage or compute, p_cast)


def formats(compute: list[str], storage: str, p_cast: str | None = None) -> Arith:
    """The :class:`Arith` of a policy whose scores, statistics and accumulators use the
    ``compute`` formats (the coarsest decides, a sound simplification), inputs and outputs
    ``storage``, and ``p`` cast to ``p_cast`` (ignored when no coarser than compute)."""
    infos = [_info(name) for name in compute]
    u = max(i[0] for i in infos)
    tiny = max(i[1] for i in infos)
    fmax = min(i[3] for i in infos)
    u_s, _, sub, fmax_s = _info(storage)
    u_p = sub_p = 0.0
    if p_cast is not None and _info(p_cast)[0] > u:
        u_p, sub_p = _info(p_cast)[0], _info(p_cast)[2] / 2
    return Arith(u, u_s, u_p, sub_p, tiny, sub / 2, fmax, fmax_s)


def of_claim(claim: Any) -> Arith:
    """The :class:`Arith` of a resolved :class:`exactattn.targets.Claim`."""
    return formats([claim.scores, claim.stats, claim.acc], claim.input, claim.p)


def binary(prec: int) -> Arith:
    """mpmath at ``prec`` bits: round-to-nearest, no underflow, inputs held exactly."""
    return Arith(u=2.0**-prec, u_s=2.0**-prec)


def _gamma(n: float, u: float) -> float:
    nu = n * u
    return nu / (1 - nu) if nu < 1 else math.inf


@dataclass
class Bounds:
    """Per-entry absolute error bounds, shaped like y, dq, dk, dv (and lse: per row)."""

    y: np.ndarray
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    overflow_risk: bool  # an intermediate may exceed the type's range: an error is allowed
    lse: np.ndarray | None = None


def bounds(case: Case, q: np.ndarray, k: np.ndarray, ref: Values, a: Arith) -> Bounds:
    """The bounds above for ``case`` with inputs ``q, k`` as the backend holds them.

    The bound itself is evaluated in float64, so weights below float64's normal range
    (``p_ij < 2^-1022``, e.g. logits 1e4 apart) are not resolved: ``λ`` is taken as at least
    ``2^-1022``, which charges them as underflowed — an absolute error that size.
    """
    a = dataclasses.replace(a, tiny=max(a.tiny, FLOAT64_TINY))
    v, g = ref.v, ref.g
    n_q, n_k, d, dv_ = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    b = case.block_size
    T = math.ceil(n_k / b) if n_k else 0
    u, c = a.u, abs(case.c())
    allowed = ref.allowed
    aq, ak, av, ag = np.abs(q), np.abs(k), np.abs(v), np.abs(g)
    qk = aq @ np.swapaxes(ak, -1, -2)  # Σ_r |Q_ir||K_jr|
    E = _gamma(d + 3, u) * c * qk + d * a.tiny
    E = np.where(allowed, E, 0.0)
    E_row = E.max(axis=-1, keepdims=True) if n_k else E
    s, m, p, rho = ref.s, ref.m[..., None], ref.p, ref.rho
    gap = np.where(allowed, np.abs(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    eta = E + E_row + 2 * u * gap + 2 * u * (T + 2) + a.u_p
    omega = np.where(allowed, np.expm1(np.minimum(eta, 700.0)), 0.0)
    omega_bar = np.sum(p * omega, axis=-1, keepdims=True)
    N = n_k + 3 * T + 2
    gN = _gamma(N, u)
    w = p * rho
    y_abs = ref.y
    vmax = av.max(axis=-2, keepdims=True) if n_k else np.zeros_like(y_abs)
    dy = (w * (omega + omega_bar + 2 * gN + u)) @ av + a.u_s * np.abs(y_abs)
    dy = dy + a.tiny * (n_k + 2) * vmax + a.sub_s + a.sub_p * ((rho * allowed) @ av)
    # reverse
    pi = omega + omega_bar + gN + 3 * u
    p_err = np.where(allowed, p * pi + a.tiny + a.sub_p, 0.0)
    gv = ag @ np.swapaxes(av, -1, -2)  # Σ_a |G_ia||V_ja|
    dP = rho * (g @ np.swapaxes(v, -1, -2))
    d_dP = rho * _gamma(dv_ + 1, u) * gv
    delta = np.sum(g * y_abs, axis=-1, keepdims=True)
    d_delta = np.sum(ag * (dy + _gamma(dv_, u) * np.abs(y_abs)), axis=-1, keepdims=True)
    diff = np.abs(dP - delta)
    gam = p * (dP - delta)
    d_gam = p_err * diff + p * (d_dP + d_delta + (3 * u + a.u_p) * diff) + a.sub_p
    d_gam = np.where(allowed, d_gam, 0.0)
    agam = np.abs(gam)
    ddq = c * ((d_gam + _gamma(n_k + T + 3, u) * agam) @ ak) + a.u_s * np.abs(ref.dq)
    ddk = c * ((np.swapaxes(d_gam + _gamma(n_q + 3, u) * agam, -1, -2)) @ aq)
    ddk = ddk + a.u_s * np.abs(ref.dk)
    ddv = np.swapaxes(p_err * rho + _gamma(n_q + 2, u) * w, -1, -2) @ ag + a.u_s * np.abs(ref.dv)
    floor = a.sub_s + a.tiny * (n_q + n_k + d + dv_ + 8) * (1 + c)
    risk = _overflow_risk(case, qk, gv, agam, aq, ak, av, ag, ref, a)
    dlse = _lse_bound(s, m, allowed, E_row, omega_bar, gN, a)
    return Bounds(2 * dy, 2 * ddq + floor, 2 * ddk + floor, 2 * ddv + floor, risk, 2 * dlse)


def _lse_bound(s, m, allowed, E_row, omega_bar, gN, a: Arith) -> np.ndarray:
    """``lse_i = m_i + log ℓ_i``: the row max moves by at most ``E_i``, ``ℓ`` carries the
    weights' relative error ``ω̄_i`` and ``γ_N`` from its sum, the log and the final add
    round once each (``u|log ℓ_i|``, ``u|lse_i|``) and the result is stored (``u_s|lse_i|``)."""
    finite = np.isfinite(m[..., 0])
    shift = np.where(finite, m[..., 0], 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        ell = np.sum(np.where(allowed, np.exp(s - shift[..., None]), 0.0), axis=-1)
        log_ell = np.log(np.where(finite, ell, 1.0))
    lse = shift + log_ell
    u_out = max(a.u, a.u_s)
    bound = E_row[..., 0] + omega_bar[..., 0] + gN + 2 * a.u * np.abs(log_ell)
    bound = bound + (a.u + u_out) * np.abs(lse) + a.tiny
    return np.where(finite, bound, 0.0)


def _overflow_risk(case, qk, gv, agam, aq, ak, av, ag, ref: Values, a: Arith) -> bool:
    """Whether a partial sum the backend forms may leave the finite range of its types."""
    c = abs(case.c())
    n_k = ak.shape[-2]
    rho_max = 1 / (1 - case.dropout_p)
    worst = [
        c,  # the scale itself is converted to the compute type
        qk.max(initial=0.0) * max(c, 1.0),
        (av.sum(axis=-2).max(initial=0.0) if n_k else 0.0) * rho_max,
        gv.max(initial=0.0) * rho_max,
        c * (agam @ ak).max(initial=0.0),
        c * (np.swapaxes(agam, -1, -2) @ aq).max(initial=0.0),
        np.abs(ref.s[np.isfinite(ref.s)]).max(initial=0.0),
        max(np.abs(aq).max(initial=0), np.abs(ag).max(initial=0)),
    ]
    top = max(worst)
    return top >= a.fmax / 4 or top >= a.fmax_s / 4
