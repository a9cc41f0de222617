"""The expected error of Y and of dQ, dK, dV: rounding errors as independent random variables.

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

The reverse (with ``g``: ``"dq", "dk", "dv"``, shaped like q, k, v; GQA summed over the
group) follows the rigorous reverse's decomposition (``p_ij = e^{s_ij − m_i}/ℓ_i``
recomputed from the frozen statistics, ``dP_ij = ρ_ij G_i·V_j``, ``δ_i = G_i·Y_i``,
``γ_ij = p_ij(dP_ij − δ_i)``, ``dQ = cγK``, ``dK = cγᵀQ``, ``dV = (pρ)ᵀG``), each rounding
again an independent mean-zero variable (:func:`_reverse`):

* ``γ_ij``, independent over pairs: ``p̂``'s relative error ``π_ij`` (the score, ``s − m``
  (``s − lse``: its gap is ``m − s + log ℓ``), the exponential, the division by ``ℓ``;
  lognormal as in the forward), ``dP``'s dot product of ``v`` terms (random order) and its
  rounding, the inputs' rounding, the subtraction ``dP − δ`` and the product ``p·X``, a
  ``grad_cast``; through a soft-cap the slope ``1 − t²`` and its error;
* shared by a row ``i`` (coherent over ``j`` in ``dQ_i``, independent over ``i`` in ``dK``,
  ``dV``): the frozen ``ℓ̂``'s relative error ``φ_i`` (its terms and its accumulation, as
  in the forward), which ``Ŷ = ẑ/ℓ̂`` and ``δ`` carry too, so ``γ_ij`` moves by
  ``−φ_i p_ij(dP_ij − 2δ_i)``; ``lse``'s own log and addition (``stats="lse"``: ``−ψ_i γ_ij``);
  ``δ_i``'s error (``−p_ij Δδ_i``): for ``delta="gy"`` Y's forward error projected on
  ``G_i`` (``Σ_j w_ij ε_ij (dP_ij − δ_i)`` for the per-pair ones, ``G·V``'s for the cast of
  ``p``, ``Σ_a G_ia² Var z_ia`` for the accumulations, the division and output cast) and
  the dot product ``G_i·Ŷ_i``; for ``"rowsum"`` the sum ``Σ_j p̂_ij dP̂_ij``;
* the scale: ``ĉ`` and ``log₂e`` as one variable per kernel, its sensitivity the
  derivative of the reverse along ``s ↦ s(1 + η)`` (``p' = p(s − s̄)``, ``δ' = Σ_j p' dP``,
  ``γ' = p'X − pδ'``), and ``ĉ``'s product with ``dQ``, ``dK`` (three roundings);
* the accumulations, with :func:`_random_order`: ``dQ_i = c Σ_j γ_ij K_j`` over key
  blocks of ``b`` in ``acc``, rounded to compute, the blocks added in compute; ``dK_j = c
  Σ_i γ_ij Q_i`` and ``dV_j = Σ_i p_ij ρ_ij G_i`` over the reverse's row tiles
  (``row_block``; None: one row per tile) the same way; the sums over broadcast copies and a
  GQA group; the output cast.

A pair ``j`` of a row whose forward has no estimate (above) makes ``dQ_i`` and every
``dK_j``, ``dV_j`` it feeds infinite. The correlations between the forward's and the
reverse's roundings of the same score (recomputed in the reverse) are not modelled: they
are counted as independent, except the frozen ``ℓ̂`` shared by ``Y``, ``δ`` and ``p̂``.

It is an *estimate* with a stated confidence, not a bound: it assumes round to nearest
(independent, mean-zero errors) and no overflow. A claim of directed rounding (``toward
zero``) makes every error one-signed; the expected error is then the rigorous bound itself
(:func:`expected_bounds` returns it, gradients too), so nothing is flagged against such a
claim. Nor in a row where a score's error may reach a unit and the gap to the row's maximum
(``λ·σ_ij ≥ max(1, m_i − s_ij)``: FP8 or 4-bit inputs under large logits): the keys that
carry the row may change places, which no first-order variance describes, so its expected
error is infinite (no estimate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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
    """``{"y": λ·σ}``, the expected error of Y shaped ``(*B, n_q, dv)``, and with ``g`` also
    ``"dq", "dk", "dv"`` shaped like ``q, k, v`` as given (module docstring).

    Arguments as :func:`exactattn.error.bounds.bounds` (so a caller may pass either):
    ``stats`` (``"ml"``: ``p`` from the frozen ``m, ℓ``; ``"lse"``: from ``lse``) and
    ``delta`` (``"gy"``: ``δ = G·Ŷ``; ``"rowsum"``: naive attention's ``Σ_j p_ij dP_ij``,
    whose forward casts the normalised weights, so an underflow costs ``μ_p`` of ``w``, not
    of ``e^{s − m}``) and ``row_block`` (query rows per reverse tile; None: one) shape the
    reverse. ``confidence`` is ``λ`` (> 0).
    """
    if not isinstance(confidence, (int, float)) or not (0 < confidence < math.inf):
        raise ValueError(f"confidence must be a finite number > 0; got {confidence!r}")
    if not isinstance(arith, Arith):
        raise TypeError(f"arith must be an Arith; got {type(arith).__name__}")
    rigorous.check_structure(stats, delta, row_block)
    keywords = dict(
        scale=scale,
        allowed=allowed,
        rho=rho,
        bias=bias,
        softcap=softcap,
        enable_gqa=enable_gqa,
        input_rounding=input_rounding,
    )
    names = ("y",) if g is None else ("y", "dq", "dk", "dv")
    if directed(arith):
        found = rigorous.bounds(
            arith, q, k, v, g, stats=stats, delta=delta, row_block=row_block, **keywords
        )
        return {name: found[name] for name in names}
    un = rigorous.Units.of(arith, input_rounding)
    prob = rigorous.problem_of(q, k, v, g, scale, allowed, rho, bias, softcap, enable_gqa, un)
    prob = rigorous.entry_errors(prob, arith, un)
    batch, n_q, n_k = prob.batch, prob.q.shape[-2], prob.k.shape[-2]
    out = np.zeros((*batch, n_q, prob.v.shape[-1]))
    sums = None if prob.g is None else _GradSums.of(prob, row_block)
    step = max(1, rigorous.CHUNK // max(1, math.prod(batch) * n_k))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        for start in range(0, n_q, step):
            rows = slice(start, min(start + step, n_q))
            part = _forward_parts(prob, un, arith, rows, delta == "rowsum")
            out[..., rows, :] = part.var_y
            if sums is not None:
                _reverse(prob, un, arith, part, rows, stats, delta, sums)
        found = {"y": out} if sums is None else {"y": out, **_gradients(prob, un, sums)}
        return {
            name: confidence * np.sqrt(np.where(np.isnan(x), np.inf, np.maximum(x, 0.0)))
            for name, x in found.items()
        }


def _random_order(n: Any, squares: Any, total: Any) -> Any:
    """``E Σ_k S_k²`` for a sum of ``n`` terms in a uniformly random order:
    ``(n + 1)(Σx²/6 + (Σx)²/3)``."""
    return (n + 1) * (squares / 6 + total * total / 3)


def _lognormal(var: np.ndarray) -> np.ndarray:
    """The variance (in units of ``u²/3``) of ``e^Δ − 1`` for a normal ``Δ`` of variance
    ``var/3``: ``e^v(e^v − 1)``, not ``v`` once score errors reach a unit (FP8 inputs with
    large logits), where first order fails; capped at a relative standard deviation of 100,
    far beyond any meaningful size, so that the expanded spreads do not cancel
    catastrophically."""
    return np.minimum(3 * np.expm1(np.minimum(var, 30) / 3) * np.exp(var / 3), 3e4)


@dataclass
class _Parts:
    """One chunk of rows of the forward: exact values and the pieces of Y's variance (in
    units where each rounding's variance is ``u²/3``) that the reverse reuses."""

    raw: np.ndarray  # c·q_i·k_j
    ok: np.ndarray
    count: np.ndarray
    empty: np.ndarray
    shift: np.ndarray  # m_i
    e: np.ndarray  # e^{s − m}
    ell: np.ndarray
    w: np.ndarray  # p_ij
    rho: np.ndarray
    wr: np.ndarray
    y: np.ndarray
    gap: np.ndarray  # m_i − s_ij
    var_raw: np.ndarray  # the raw score's variance (before a soft-cap)
    var_s: np.ndarray  # the final score's
    tanh: np.ndarray | None  # t = tanh(raw/cap) under a soft-cap
    common: np.ndarray  # w² Var(e_ij's relative error), the underflow of e: per pair
    under: np.ndarray  # the cast p's underflow, in units of w
    reorders: np.ndarray  # (*B, r): no estimate
    var_z: np.ndarray  # z's accumulations (*B, r, dv)
    var_l: np.ndarray  # ℓ's relative, of its accumulations (*B, r)
    var_y: np.ndarray  # Y's variance (its own units: /3 done)


def _forward_parts(prob: Any, un: Any, arith: Arith, rows: slice, naive: bool) -> _Parts:
    """``σ²`` of Y on a chunk of rows (the terms of the module docstring), and its pieces."""
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
    s, var_raw, t = raw, var_s, None
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
    var_e = _lognormal(var_e)
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
    var_z, var_l = _chain_parts(w, wr, v, y, ok, un, arith.block)
    var = var + var_z + y * y * var_l[..., None]
    var = var + (un.uc**2 + un.uo**2) * y * y + un.mo**2 + un.mc**2
    var = np.where(reorders[..., None], np.inf, var)  # no estimate there: nothing flagged
    var_y = np.where(empty[..., None], 0.0, var) / 3
    return _Parts(
        raw, ok, count, empty, shift, e, ell, w, rho, wr, y, gap, var_raw, var_s, t,
        common, under, reorders, var_z, var_l, var_y,
    )  # fmt: skip


def _block_sums(x: np.ndarray, values: np.ndarray, ok: np.ndarray, block: int | None) -> tuple:
    """For the sums ``Σ_j x_ij values_ja`` taken over key blocks of ``b`` (None: one key per
    block): ``Σ_j x² values²``, ``Σ_t Z_t²`` (``Z_t`` a block's sum), the most allowed terms
    in one block and the number of blocks holding one, per row."""
    n_k = x.shape[-1]
    b = 1 if block is None else min(block, n_k)
    squares = (x * x) @ (values * values)
    if b == 1:  # one key per block: each block's sum is one term
        count = ok.sum(-1)
        return squares, squares, np.minimum(count, 1), count
    blocks = -(-n_k // b)
    pad = blocks * b - n_k
    xb = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
    xb = xb.reshape((*xb.shape[:-1], blocks, b))
    vb = np.pad(values, [(0, 0)] * (values.ndim - 2) + [(0, pad), (0, 0)])
    vb = vb.reshape((*vb.shape[:-2], blocks, b, vb.shape[-1]))
    Z = np.einsum("...itb,...tba->...ita", xb, vb)
    okb = np.pad(ok, [(0, 0)] * (ok.ndim - 1) + [(0, pad)]).reshape(xb.shape).sum(-1)
    return squares, (Z * Z).sum(-2), okb.max(-1), (okb > 0).sum(-1)


def _chain_parts(w, wr, v, y, ok, un, block: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The accumulations of ``z`` (``p·V``: in ``acc``, or in its own ``pv_acc`` by chunks of
    ``pv_chunk`` terms, each chunk's sum added into an ``acc`` buffer: the random-order
    formula with the chunk's length in ``pv_acc``'s unit and the chunk additions' count in
    ``acc``'s) and ``ℓ`` per key block of ``b`` in ``acc``, rounded to compute, and the
    merges of the ``T`` blocks (two roundings each), with ``E Σ S_k²`` of a random order
    (:func:`_random_order`): ``z``'s variance and ``ℓ``'s relative one (``ΔY = −Y·Δℓ/ℓ``)."""
    zq, z2, n_in, T = _block_sums(wr, v, ok, block)
    lq, l2, _, _ = _block_sums(w, np.ones((v.shape[-2], 1)), ok, block)
    lq, l2 = lq[..., 0], l2[..., 0]
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
    return var_z, var_l


# --- the reverse ---------------------------------------------------------------------------
def _swap(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


class _RowSums:
    """A sum over query rows ``Σ_i x_ij values_ia`` per key ``j``, as the reverse takes
    ``dK``, ``dV``: row tiles of ``per_tile`` rows in ``acc``, each tile's sum rounded to
    compute and the tiles added in compute. Fed chunk by chunk in row order, it keeps
    ``Σ_i x² values²``, ``Σ_t Z_t²`` (a tile's sum ``Z_t``), the sum itself, the rows
    reaching ``j`` and the tiles holding one."""

    def __init__(self, shape: tuple[int, ...], keys: tuple[int, ...], per_tile: int, n_q: int):
        self.per_tile, self.n_q = per_tile, n_q
        self.squares, self.z2, self.total = np.zeros(shape), np.zeros(shape), np.zeros(shape)
        self.current = np.zeros(shape)
        self.count, self.tiles = np.zeros(keys), np.zeros(keys)
        self.reached = np.zeros(keys, dtype=bool)

    def add(self, x: np.ndarray, values: np.ndarray, ok: np.ndarray, start: int) -> None:
        square = _swap(x * x) @ (values * values)
        self.squares += square
        self.total += _swap(x) @ values
        self.count += ok.sum(-2)
        if self.per_tile == 1:
            self.z2 += square
            self.tiles += ok.sum(-2)
            return
        end, at = start + x.shape[-2], start
        while at < end:
            stop = min((at // self.per_tile + 1) * self.per_tile, end)
            part = slice(at - start, stop - start)
            self.current += _swap(x[..., part, :]) @ values[..., part, :]
            self.reached |= ok[..., part, :].any(-2)
            if stop % self.per_tile == 0 or stop == self.n_q:  # the tile is complete
                self.z2 += self.current**2
                self.tiles += self.reached
                self.current[...] = 0.0
                self.reached[...] = False
            at = stop

    def variance(self, un: Any) -> np.ndarray:
        """The accumulations' variance (random order within a tile and over the tiles)."""
        rows = np.minimum(self.count, self.per_tile)[..., None]
        var = un.ua**2 * (rows + 1) * (self.squares / 6 + self.z2 / 3) + un.res**2 * self.z2
        merges = np.where(self.tiles > 1, 1.0, 0.0)[..., None]
        return var + merges * un.uc**2 * _random_order(self.tiles[..., None], self.z2, self.total)


@dataclass
class _GradSums:
    """What the reverse accumulates over chunks of rows (logical batch)."""

    dq: np.ndarray  # (*B, n_q, d): dQ's variance before the copies and the cast
    dq_exact: np.ndarray
    dk: np.ndarray  # Σ_i Var(γ̂_ij) Q_ir² (+ the inputs'), without c²
    dk_sums: _RowSums  # γ_ij Q_ir over the rows
    dk_scale: np.ndarray  # Σ_i γ'_ij Q_ir (the scale's sensitivity, without c)
    dv: np.ndarray  # Σ_i Var(p̂_ij ρ_ij) G_ia² (+ G's rounding)
    dv_sums: _RowSums
    dv_scale: np.ndarray  # Σ_i p'_ij ρ_ij G_ia
    bad: np.ndarray  # (*B, n_k): a key fed by a row with no estimate

    @classmethod
    def of(cls, prob: Any, row_block: int | None) -> _GradSums:
        n_q = prob.q.shape[-2]
        per_tile = 1 if row_block is None else min(row_block, n_q)
        keys = prob.k.shape[:-1]
        return cls(
            np.zeros(prob.q.shape),
            np.zeros(prob.q.shape),
            np.zeros(prob.k.shape),
            _RowSums(prob.k.shape, keys, per_tile, n_q),
            np.zeros(prob.k.shape),
            np.zeros(prob.v.shape),
            _RowSums(prob.v.shape, keys, per_tile, n_q),
            np.zeros(prob.v.shape),
            np.zeros(keys, dtype=bool),
        )


def _reverse(
    prob: Any, un: Any, arith: Arith, f: _Parts, rows: slice, stats: str, delta: str,
    out: _GradSums,
) -> None:  # fmt: skip
    """The reverse's variances on a chunk of rows (module docstring), into ``out``: dQ's
    rows complete, dK's and dV's sums over rows."""
    q, k, v, g = prob.q[..., rows, :], prob.k, prob.v, prob.g[..., rows, :]
    ok, w, rho, wr, y, c, entry = f.ok, f.w, f.rho, f.wr, f.y, prob.c, prob.entry
    n_v = v.shape[-1]
    g2 = g * g
    gv = g @ _swap(v)
    D = rho * gv  # dP_ij
    dlt = (g * y).sum(-1)  # δ_i (exact: G_i·Y_i = Σ_j p_ij dP_ij)
    X = np.where(ok, D - dlt[..., None], 0.0)
    gam = w * X
    # dP: v products in acc, rounded to compute (and to dp), ρ's product; G and V rounded
    gv_sq = g2 @ _swap(v * v)
    var_D = un.ua**2 * _random_order(n_v, gv_sq, gv)
    dvv = None if entry is None else np.abs(v) * math.expm1(entry["v_rel"]) + entry["v_abs"]
    if entry is None:
        var_D = var_D + 2 * un.ux**2 * gv_sq
    else:
        var_D = var_D + un.ux**2 * gv_sq + g2 @ _swap(dvv * dvv)
    u_rho = un.uc**2 + prob.drho**2 if prob.dropout else 0.0
    var_D = rho * rho * var_D + (un.res**2 + un.ud**2 + u_rho) * D * D
    # π: p̂'s relative error per pair (score, the exponent's roundings, exp, ÷ℓ)
    log_l = np.log(f.ell)
    gap = f.gap if stats == "ml" else f.gap + log_l[..., None]
    var_pi = f.var_s + (EXP_ARG_ROUNDINGS - 1) * un.uc**2 * gap**2 + un.uf**2
    var_pi = np.where(ok, _lognormal(var_pi + (un.uc**2 if stats == "ml" else 0.0)), 0.0)
    tiny_c = 0.0 if arith.compute.e_min is None else 2.0**arith.compute.e_min
    under = np.where(ok & (f.e < tiny_c), un.mc**2, 0.0) / f.ell[..., None] ** 2  # p̂'s μ
    # shared by a row: φ (the frozen ℓ̂, which Ŷ and δ carry too), ψ (lse's log and sum), Δδ
    var_phi = f.common.sum(-1) + f.var_l
    lse = f.shift + log_l
    var_psi = un.uf**2 * log_l**2 + un.uc**2 * lse**2 if stats == "lse" else np.zeros_like(dlt)
    if delta == "gy":
        var_dlt = _delta_of_gy(prob, un, f, g, D, X, dlt, dvv)
    else:  # naive attention's Σ_j p̂_ij dP̂_ij
        var_dlt = (w * w * (var_pi * D * D + var_D) + under * D * D).sum(-1)
        var_dlt = var_dlt + un.ua**2 * _random_order(f.count, ((w * D) ** 2).sum(-1), dlt)
        var_dlt = var_dlt + un.res**2 * dlt**2
    # γ̂ = fl(p̂ · fl(dP̂ − δ̂)) per pair, and its per-row sensitivities
    var_g = w * w * (var_pi * X * X + var_D + un.uc**2 * X * X) + un.uc**2 * gam * gam
    var_g = var_g + under * X * X + np.where(ok, un.mc**2, 0.0)
    sens_d, sens_phi, sens_psi = w, w * (D - 2 * dlt[..., None]), gam
    # the scale (ĉ, log₂e): the derivative along s ↦ s(1 + η) of the raw scores
    raw = np.where(ok, f.raw, 0.0)
    if f.tanh is not None:  # through the soft-cap: ds/draw = 1 − t²
        raw = raw * (1 - f.tanh**2)
    dp = w * (raw - (w * raw).sum(-1)[..., None])
    gam1 = dp * X - w * (dp * D).sum(-1)[..., None]
    if f.tanh is not None:  # γ·(1 − t̂²): t's error, the square, the subtraction, the product
        t = np.where(ok, f.tanh, 0.0)
        slope = 1 - t * t
        cap = prob.softcap
        var_t = slope**2 * (f.var_raw + un.uc**2 * f.raw**2) / cap**2 + t * t * (
            un.uf**2 + un.uc**2
        )
        var_slope = 4 * t * t * var_t + un.uc**2 * (t**4 + slope**2)
        var_g = var_g * slope**2 + gam * gam * var_slope + un.uc**2 * (gam * slope) ** 2
        sens_d, sens_phi, sens_psi = sens_d * slope, sens_phi * slope, sens_psi * slope
        gam, gam1 = gam * slope, gam1 * slope
    if un.ug or un.mg:  # γ cast before the products
        var_g = var_g + un.ug**2 * gam * gam + np.where(ok, un.mg**2, 0.0)
    # dQ_i = ĉ Σ_j γ_ij K_j over key blocks (the row's shared terms coherent over j)
    k2 = k * k
    var_q = var_g @ k2 + (un.ux**2 * (gam * gam) @ k2 if entry is None else 0.0)
    if entry is not None:
        var_q = var_q + (gam * gam) @ (entry["k"] ** 2)
    var_q = var_q + var_dlt[..., None] * (sens_d @ k) ** 2
    var_q = var_q + var_phi[..., None] * (sens_phi @ k) ** 2
    var_q = var_q + var_psi[..., None] * (sens_psi @ k) ** 2
    squares, z2, n_in, T = _block_sums(gam, k, ok, arith.block)
    total = gam @ k
    var_q = var_q + un.ua**2 * (n_in[..., None] + 1) * (squares / 6 + z2 / 3) + un.res**2 * z2
    var_q = var_q + np.where(T > 1, un.uc**2, 0.0)[..., None] * _random_order(
        T[..., None], z2, total
    )
    dq = c * total
    var_q = c * c * var_q + SHARED_SCALE_ROUNDINGS * un.uc**2 * (c * (gam1 @ k)) ** 2
    var_q = var_q + 3 * un.uc**2 * dq * dq  # the product by ĉ, ĉ's two roundings
    out.dq[..., rows, :] = np.where(f.reorders[..., None], np.inf, var_q)
    out.dq_exact[..., rows, :] = dq
    # dK_j = ĉ Σ_i γ_ij Q_i, dV_j = Σ_i p_ij ρ_ij G_i: the rows' terms independent over i
    var_gt = var_g + var_dlt[..., None] * sens_d**2 + var_phi[..., None] * sens_phi**2
    var_gt = var_gt + var_psi[..., None] * sens_psi**2
    q2 = q * q
    out.dk += _swap(var_gt) @ q2
    if entry is None:
        out.dk += un.ux**2 * (_swap(gam * gam) @ q2)
    else:
        out.dk += _swap(gam * gam) @ (entry["q"][..., rows, :] ** 2)
    out.dk_sums.add(gam, q, ok, rows.start)
    out.dk_scale += _swap(gam1) @ q
    var_pv = var_pi + (var_phi + var_psi)[..., None] + un.ug**2 + u_rho + un.ux**2
    out.dv += _swap(wr * wr * var_pv + under * rho * rho + np.where(ok, un.mg**2, 0.0)) @ g2
    out.dv_sums.add(wr, g, ok, rows.start)
    out.dv_scale += _swap(dp * rho) @ g
    out.bad |= (f.reorders[..., None] & ok).any(-2)


def _delta_of_gy(prob, un, f: _Parts, g, D, X, dlt, dvv) -> np.ndarray:
    """``Var δ̂_i`` for ``δ̂_i = G_i·Ŷ_i``: Y's forward error projected on ``G_i`` (all but
    ``ℓ̂``'s and the scale's, carried apart), then the dot product's roundings."""
    w, wr, v, y = f.w, f.wr, prob.v, f.y
    g2 = g * g
    gy2 = (g2 * y * y).sum(-1)
    var = (f.common * X * X).sum(-1)  # Σ_j w_ij ε_ij (dP_ij − δ_i)
    u_p = un.up**2 + (un.uc**2 if prob.dropout else 0.0)  # the cast of p, ρ's product
    var = var + ((u_p * w * w + f.under) * D * D).sum(-1)
    values = v * v if dvv is None else dvv * dvv
    scale = un.ux**2 if dvv is None else 1.0
    var = var + scale * (g2 * ((wr * wr) @ values)).sum(-1)  # V's rounding
    var = var + (g2 * f.var_z).sum(-1)  # z's accumulations, independent over a
    var = var + (un.uc**2 + un.uo**2) * gy2 + (un.mo**2 + un.mc**2) * g2.sum(-1)
    n_v = v.shape[-1]  # G_i·Ŷ_i: v products in acc, rounded; G's rounding
    return var + un.ua**2 * _random_order(n_v, gy2, dlt) + (un.res**2 + un.ux**2) * gy2


def _copies(prob: Any, un: Any, name: str, var: np.ndarray, exact: np.ndarray) -> tuple:
    """A logical-batch variance and value summed into input ``name`` (broadcast copies, a
    GQA group: their additions in compute or in the output's format, each copy's cast to the
    output, as a backward that rounds each head first and sums them in the input format
    does), then the output cast: ``(variance, value)``."""
    var_in = rigorous.to_input(prob, name, var)
    value = rigorous.to_input(prob, name, exact)
    copies = prob.copies(name)
    if copies > 1:  # each copy perhaps rounded to the output first (a GQA kernel's heads)
        squares = rigorous.to_input(prob, name, exact * exact)
        u_sum = max(un.uc, un.uo)  # summed in compute, or in the output's format (torch's)
        var_in = var_in + u_sum**2 * _random_order(copies, squares, value) + un.uo**2 * squares
    return var_in + un.uo**2 * value * value + un.mo**2 + un.mc**2, value


def _gradients(prob: Any, un: Any, sums: _GradSums) -> dict[str, np.ndarray]:
    """``σ²`` of dQ, dK, dV shaped like q, k, v (``∞`` where a row has no estimate)."""
    c = prob.c
    dq, _ = _copies(prob, un, "q", sums.dq, sums.dq_exact)
    dk_exact = c * sums.dk_sums.total
    var_k = c * c * (sums.dk + sums.dk_sums.variance(un))
    var_k = var_k + SHARED_SCALE_ROUNDINGS * un.uc**2 * (c * sums.dk_scale) ** 2
    var_k = var_k + 3 * un.uc**2 * dk_exact**2
    var_k = np.where(sums.bad[..., None], np.inf, var_k)
    var_v = sums.dv + sums.dv_sums.variance(un)
    var_v = var_v + SHARED_SCALE_ROUNDINGS * un.uc**2 * sums.dv_scale**2
    var_v = np.where(sums.bad[..., None], np.inf, var_v)
    dk, _ = _copies(prob, un, "k", var_k, dk_exact)
    dv, _ = _copies(prob, un, "v", var_v, sums.dv_sums.total)
    return {"dq": dq / 3, "dk": dk / 3, "dv": dv / 3}
