"""The expected error of the forward output Y: rounding errors as independent random variables.

Beside the rigorous worst case of :mod:`exactattn.error.bounds` (every rounding at ``u``, budgets
adding along a chain: ``n·u`` for ``n`` roundings), this is the *probabilistic* view of
Higham & Mary ("A new approach to probabilistic rounding error analysis", SIAM J. Sci.
Comput. 41(5), 2019): each rounding ``fl(x) = x(1 + δ)`` has ``δ`` mean zero and
independent of the others, so a chain of ``n`` roundings moves a value by about
``sqrt(n)·u``, not ``n·u``. Docs: ``docs/error_bound.md`` §7.

The first-order error of ``Y_ia`` is then a sum ``Σ_k c_k δ_k`` over every rounding ``k``
with its sensitivity ``c_k`` (from the same decomposition as the rigorous bound: the weights
``w_ij = e^{s_ij − m_i}/ℓ_i``, the spread ``ρ_ij v_ja − Y_ia``, the key blocks of ``b`` and
their count ``T_i``); with ``δ_k`` of variance at most ``u_k²/3`` (an error uniform on
``[−u_k, u_k]``) its standard deviation is at most ``σ_ia = sqrt(Σ_k c_k² u_k²/3)``, and
the expected bound is ``λ·σ_ia`` (:data:`CONFIDENCE`, ``λ = 3``: a normal sum exceeds it
with probability 0.27%). The terms of ``σ²``:

* *per pair* (independent over ``j``): the score's error (its dot product of ``d`` terms in
  ``acc``, the inputs' rounding ``u_s``, the product by ``ĉ``), the rounding of ``s − m``
  and of its product by ``log₂e``, the exponential (``funcs·u``): a relative error of
  ``e_ij`` common to ``z`` and ``ℓ``, weighted by ``w_ij (ρ_ij v_ja − Y_ia)`` (the shift
  cancels, as in the rigorous bound's step 2), of variance ``e^v (e^v − 1)`` for a normal
  exponent error of variance ``v`` (not first order: FP8 inputs put ``v`` near 1); the
  rounding of ``v`` and the cast of ``p`` (numerator only), weighted by
  ``w_ij ρ_ij v_ja``; underflow of ``p`` or ``e`` (``μ``);
* *shared* by a row: ``ĉ = 1/sqrt(d)`` and ``log₂e`` (four roundings, each one variable
  with the total sensitivity ``Σ_j w_ij s_ij (ρ_ij v_ja − Y_ia)``);
* *accumulations* (the partial sums' roundings): a sum of ``n`` terms ``x_j`` in unit ``u``
  errs by ``Σ_k S_k δ_k`` (``S_k`` the partial sums); over a uniformly random order (every
  order is allowed, as in the rigorous bound) ``E Σ_k S_k² = (n + 1)(Σ x_j²/6 + (Σ x_j)²/3)``
  (terms drawn without replacement; the products' roundings included). Applied to each
  key block's ``p·V`` and row sum in ``acc``, their rounding to compute, and the ``T_i``
  blocks' merges (a product and an addition each, in compute), for ``z`` (a separate ``p·V``
  accumulator, ``pv_acc`` by chunks of ``pv_chunk``: :func:`_chains`) and for ``ℓ``
  (``ΔY = −Y·Δℓ/ℓ``); then the division and the output cast (``(u² + u_o²)·Y²/3``). The
  rescale factors ``α = e^{m_old − m_new}`` multiply ``z`` and ``ℓ`` alike and cancel.

It is an *estimate* with a stated confidence, not a bound: it assumes round to nearest
(independent, mean-zero errors) and no overflow. A claim of directed rounding (``toward
zero``) makes every error one-signed; the expected error is then the rigorous bound itself
(:func:`expected_bounds` returns it), so nothing is flagged against such a claim. Nor in a
row where a score's error may reach a unit and the gap to the row's maximum
(``λ·σ_ij ≥ max(1, m_i − s_ij)``: FP8 or 4-bit inputs under large logits): the keys that
carry the row may change places, which no first-order variance describes, so its expected
error is infinite (no estimate). The gradients are not covered (forward only).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import bounds as rigorous
from .bounds import EXP_ARG_ROUNDINGS, Arith

CONFIDENCE = 3.0  # λ: the expected bound is λ standard deviations
SHARED_SCALE_ROUNDINGS = 4  # ĉ = 1/sqrt(d) (two), log₂e and ĉ·log₂e (kernels using exp2)


def directed(arith: Arith) -> bool:
    """Whether ``arith`` claims a rounding other than to nearest (errors of one sign): a
    truncating format anywhere, the ``p·V`` accumulator too (``fp22-rz``, SageAttention 2's
    FP22 as :mod:`exactattn.error.lowbit` reads it)."""
    formats = (arith.input, arith.compute, arith.acc, arith.output, arith.p, arith.pv_acc)
    return any(
        f is not None and ("toward_zero" in f.name or f.name.endswith("-rz")) for f in formats
    )


def expected_bounds(
    arith: Arith,
    q: Any,
    k: Any,
    v: Any,
    g: Any = None,
    *,
    scale: float | None = None,
    allowed: Any = None,
    rho: Any = None,
    bias: Any = None,
    softcap: float | None = None,
    enable_gqa: bool = False,
    stats: str = "ml",
    delta: str = "gy",
    row_block: int | None = None,
    input_rounding: bool = False,
    confidence: float = CONFIDENCE,
) -> dict[str, np.ndarray]:
    """``{"y": λ·σ}``, the expected error of Y shaped ``(*B, n_q, dv)`` (module docstring).

    Arguments as :func:`exactattn.error.bounds.bounds` (so a caller may pass either); ``g``,
    ``stats`` and ``row_block`` shape only the reverse, which this does not cover;
    ``delta="rowsum"`` is naive attention, whose cast of ``p`` is of the normalised
    weights (an underflow costs ``μ_p`` of ``w``, not of ``e^{s − m}``). ``confidence``
    is ``λ`` (> 0).
    """
    if not isinstance(confidence, (int, float)) or not (0 < confidence < math.inf):
        raise ValueError(f"confidence must be a finite number > 0; got {confidence!r}")
    if not isinstance(arith, Arith):
        raise TypeError(f"arith must be an Arith; got {type(arith).__name__}")
    keywords = dict(
        scale=scale,
        allowed=allowed,
        rho=rho,
        bias=bias,
        softcap=softcap,
        enable_gqa=enable_gqa,
        input_rounding=input_rounding,
    )
    if directed(arith):
        return {"y": rigorous.bounds(arith, q, k, v, **keywords)["y"]}
    un = rigorous.Units.of(arith, input_rounding)
    prob = rigorous.problem_of(q, k, v, None, scale, allowed, rho, bias, softcap, enable_gqa, un)
    prob = rigorous.entry_errors(prob, arith, un)
    batch, n_q, n_k = prob.batch, prob.q.shape[-2], prob.k.shape[-2]
    out = np.zeros((*batch, n_q, prob.v.shape[-1]))
    step = max(1, rigorous.CHUNK // max(1, math.prod(batch) * n_k))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        for start in range(0, n_q, step):
            rows = slice(start, min(start + step, n_q))
            out[..., rows, :] = _variance(prob, un, arith, rows, delta == "rowsum")
    return {"y": confidence * np.sqrt(np.maximum(out, 0.0))}


def _random_order(n: Any, squares: Any, total: Any) -> Any:
    """``E Σ_k S_k²`` for a sum of ``n`` terms in a uniformly random order:
    ``(n + 1)(Σx²/6 + (Σx)²/3)``."""
    return (n + 1) * (squares / 6 + total * total / 3)


def _variance(prob: Any, un: Any, arith: Arith, rows: slice, naive: bool) -> np.ndarray:
    """``σ²`` of Y on a chunk of rows (the terms of the module docstring), in units where
    each rounding's variance is ``u²/3``."""
    q, k, v = prob.q[..., rows, :], prob.k, prob.v
    kt = np.swapaxes(k, -1, -2)
    c, d = prob.c, q.shape[-1]
    raw = c * (q @ kt)
    squares = c * c * ((q * q) @ (kt * kt))  # Σ_r (c q_ir k_jr)²
    # the score's variance (absolute): the dot product in acc, its rounding to compute and
    # the product by ĉ, the inputs' rounding (q and k: twice u_s² per product)
    var_s = un.ua**2 * _random_order(d, squares, raw)
    var_s = var_s + (un.res**2 + un.uc**2) * raw**2
    entry = prob.entry
    if entry is not None:  # each entry's own error bound Δ (Entrywise), as a variance Δ²/3
        dq, dk = entry["q"][..., rows, :], entry["k"]
        var_s = var_s + c * c * ((dq * dq) @ (kt * kt) + (q * q) @ np.swapaxes(dk * dk, -1, -2))
    else:
        var_s = var_s + 2 * un.ux**2 * squares
    if un.mx and entry is None:
        norms = (q * q).sum(-1)[..., None] + (k * k).sum(-1)[..., None, :]
        var_s = var_s + c * c * un.mx**2 * norms
    s = raw
    if prob.softcap is not None:  # cap·tanh(raw/cap): the slope, the division, tanh, the product
        t = np.tanh(raw / prob.softcap)
        s = prob.softcap * t
        var_s = (1 - t * t) ** 2 * (var_s + 2 * un.uc**2 * raw**2) + (un.uf**2 + un.uc**2) * s**2
    ok = np.ones(s.shape, dtype=bool) if prob.allowed is None else prob.allowed[..., rows, :]
    if prob.bias is not None:
        b = prob.bias[..., rows, :]
        ok = ok & (b > -np.inf)
        b = np.where(ok, b, 0.0)
        s = s + b
        var_s = var_s + un.ub**2 * b**2 + un.uc**2 * s**2
    count = ok.sum(axis=-1)
    empty = count == 0
    shift = np.where(empty, 0.0, np.max(np.where(ok, s, -np.inf), axis=-1, initial=-np.inf))
    e = np.where(ok, np.exp(s - shift[..., None]), 0.0)
    ell = np.where(empty, 1.0, e.sum(axis=-1))
    w = e / ell[..., None]
    rho = np.ones_like(w) if prob.rho is None else prob.rho[..., rows, :]
    wr = w * rho
    y = wr @ v
    gap = np.where(ok, shift[..., None] - np.where(ok, s, 0.0), 0.0)
    # per pair, common to z and ℓ (relative to e_ij): score, s − m and ·log₂e, exp; underflow
    var_e = var_s + (EXP_ARG_ROUNDINGS - 1) * un.uc**2 * gap**2 + un.uf**2
    # a pair whose exponent may move by a unit and by its gap to the row's max (λσ ≥
    # max(1, m − s)) can change which keys carry the row: no variance describes that
    reorders = np.any(ok & (CONFIDENCE * np.sqrt(var_e / 3) >= np.maximum(gap, 1.0)), axis=-1)
    # e^{Δ} − 1 for a normal Δ of variance v (here var_e/3) has variance e^v (e^v − 1): not
    # v once score errors reach a unit (FP8 inputs with large logits), where first order fails
    # (capped at a relative standard deviation of 100, far beyond any meaningful size, so
    # that the expanded spread below does not cancel catastrophically)
    var_e = np.minimum(3 * np.expm1(np.minimum(var_e, 30) / 3) * np.exp(var_e / 3), 3e4)
    tiny_c = 0.0 if arith.compute.e_min is None else 2.0**arith.compute.e_min
    common = np.where(ok, w * w * var_e, 0.0) + np.where(ok & (e < tiny_c), un.mc**2, 0.0) / (
        ell[..., None] ** 2
    )
    # Σ_j common_ij (ρ_ij v_ja − Y_ia)², expanded
    var = (common * rho * rho) @ (v * v) - 2 * y * ((common * rho) @ v)
    var = var + y * y * common.sum(-1)[..., None]
    # shared by the row: ĉ and log₂e, sensitivity Σ_j w_ij s_ij (ρ_ij v_ja − Y_ia)
    ws = np.where(ok, w * raw, 0.0)
    shared = (ws * rho) @ v - y * ws.sum(-1)[..., None]
    var = var + SHARED_SCALE_ROUNDINGS * un.uc**2 * shared**2
    # per pair, numerator only: v's rounding, the cast of p (and ρ's product), underflow of p
    u_num = (un.ux**2 if entry is None else 0.0) + un.up**2 + (un.uc**2 if prob.dropout else 0.0)
    tiny_p = 0.0 if arith.p is None or arith.p.e_min is None else 2.0**arith.p.e_min
    if naive:  # naive attention casts the normalised P: μ_p in units of w
        under = np.where(ok & (w < tiny_p), un.mp**2, 0.0)
    else:  # the tiled forward casts e^{s − m} ≤ 1: μ_p in units of e
        under = np.where(ok & (e < tiny_p), un.mp**2, 0.0) / ell[..., None] ** 2
    var = var + (wr * wr * u_num + under * rho * rho) @ (v * v)
    if entry is not None:
        dv = np.abs(v) * math.expm1(entry["v_rel"]) + entry["v_abs"]
        var = var + (wr * wr) @ (dv * dv)
    elif un.mx:
        var = var + un.mx**2 * (wr * wr).sum(-1)[..., None]
    var = var + _chains(w, wr, v, y, ok, un, arith.block)
    var = var + (un.uc**2 + un.uo**2) * y * y + un.mo**2 + un.mc**2
    var = np.where(reorders[..., None], np.inf, var)  # no estimate there: nothing flagged
    return np.where(empty[..., None], 0.0, var) / 3


def _chains(w, wr, v, y, ok, un, block: int | None) -> np.ndarray:
    """The accumulations of ``z`` (``p·V``: in ``acc``, or in its own ``pv_acc`` by chunks of
    ``pv_chunk`` terms, each chunk's sum added into an ``acc`` buffer: the random-order
    formula with the chunk's length in ``pv_acc``'s unit and the chunk additions' count in
    ``acc``'s) and ``ℓ`` per key block of ``b`` in ``acc``,
    rounded to compute, and the merges of the ``T`` blocks (two roundings each), with
    ``E Σ S_k²`` of a random order (:func:`_random_order`); ``ℓ``'s as ``Y²·(Δℓ/ℓ)²``."""
    n_k = w.shape[-1]
    b = 1 if block is None else min(block, n_k)
    blocks = -(-n_k // b)
    pad = blocks * b - n_k
    if b == 1:  # one key per block: each block's sum is one term
        z2 = (wr * wr) @ (v * v)  # Σ_t Z_t²
        zq = z2  # Σ_t (Σ_{j∈t} x_j²)
        l2 = lq = (w * w).sum(-1)
        per_block = np.minimum(ok.sum(-1), 1)
        count = ok.sum(-1)
    else:
        wb = np.pad(wr, [(0, 0)] * (wr.ndim - 1) + [(0, pad)])
        vb = np.pad(v, [(0, 0)] * (v.ndim - 2) + [(0, pad), (0, 0)])
        wb = wb.reshape((*wb.shape[:-1], blocks, b))
        vb = vb.reshape((*vb.shape[:-2], blocks, b, vb.shape[-1]))
        Z = np.einsum("...itb,...tba->...ita", wb, vb)
        z2 = (Z * Z).sum(-2)
        zq = (wr * wr) @ (v * v)
        lw = np.pad(w, [(0, 0)] * (w.ndim - 1) + [(0, pad)]).reshape(wb.shape)
        L = lw.sum(-1)
        l2, lq = (L * L).sum(-1), (w * w).sum(-1)
        okb = np.pad(ok, [(0, 0)] * (ok.ndim - 1) + [(0, pad)]).reshape(wb.shape).sum(-1)
        per_block = okb.max(-1)
        count = (okb > 0).sum(-1)
    n_in, T = per_block, count
    # within a block (≤ b terms; Σ_t of the random-order formula ≤ (b + 1)(Σ x²/6 + Σ_t Z_t²/3))
    spread_z = zq / 6 + z2 / 3
    if un.upv:  # p·V in its own accumulator: chunks of c terms, each added into acc
        c = n_in if un.pv_chunk is None else np.minimum(n_in, un.pv_chunk)
        adds = 0 if un.pv_chunk is None else -(-n_in // un.pv_chunk)
        var_z = un.upv**2 * (c[..., None] + 1) * spread_z
        var_z = var_z + un.ua**2 * (np.asarray(adds)[..., None] + 1) * spread_z
    else:
        var_z = un.ua**2 * (n_in[..., None] + 1) * spread_z
    var_z = var_z + un.res**2 * z2
    var_l = un.ua**2 * (n_in + 1) * (lq / 6 + l2 / 3) + un.res**2 * l2
    # merges of the T blocks' sums (Σ_t Z_t = Y, Σ_t L_t = 1), a product and an addition each
    merges = 2 * un.uc**2 * np.where(T > 1, 1.0, 0.0)
    var_z = var_z + merges[..., None] * _random_order(T[..., None], z2, y)
    var_l = var_l + merges * _random_order(T, l2, 1.0)
    return var_z + y * y * var_l[..., None]
