"""The tolerance of a backward that rounds parts of dK, dV before summing them: a GQA
group's heads, or blocks of query rows (``Claim.qsplit``, torch's CPU flash backward).

A kernel that expands ``K, V`` over a group of ``g`` query heads (torch's SDPA with
``enable_gqa``, transformers' ``repeat_kv``, or the check itself for a function without
``enable_gqa``) gets one gradient per expanded head, ``dK_h``, rounded to the output format
``o``, and sums the group's ``g`` of them in a format ``s`` (torch: the input's, fp16 for
fp16 inputs): ``dK = fl_s(… fl_s(fl_o(dK_1) + fl_o(dK_2)) … + fl_o(dK_g))``. The claimed
bound (:func:`exactattn.error.bounds.bounds`) charges one rounding of the exact sum; this one
charges the ``g`` roundings to ``o`` and the ``g − 1`` additions in ``s``:

    |extra| ≤ (u_o + γ_{g−1}(s)·(1 + u_o))·Σ_h M_h + g·μ_o·(1 + γ_{g−1}(s)) + (g − 1)·μ_s,

with ``M_h ≥ |computed dK_h|``: the head's magnitude bound (below) plus the claimed bound
of the whole group (which bounds each head's own error). The magnitudes come from the
definition, on the held inputs, in float64 with every term positive (no cancellation to
lose): ``P = exp(s − lse)`` with the reference's ``lse``, ``dP = G·Vᵀ``, ``δ = G·Y`` with
the reference's ``Y``, ``|γ| ≤ P∘(ρ∘|dP| + |δ|)``, ``|dK_h| ≤ |c|·|γ|ᵀ·|Q|``,
``|dV_h| ≤ (ρ∘P)ᵀ·|G|`` (a soft-cap's slope is at most 1), widened by 2^-30 for float64's
own roundings. With ``qsplit`` the same backward also forms dQ one key block of the
claimed size ``b`` at a time, rounds each block's part to ``o`` and sums the parts in it
(measured on torch's CPU flash backward, fp16: parts 1.9e-8, −3.3e-8 rounded to 0 and
−5.96e-8, exact sum −1.4e-8): :func:`split_bound` over ``⌈n_k/b⌉`` parts, with
``|dQ| ≤ |c|·|γ|·|K|``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..backends.formats import Format
from ..cases import Case
from ..cases.exact import Reference

MARGIN = 1 + 2.0**-30


STRIP_ELEMENTS = 1 << 22  # score entries per strip of query rows (32 MB in float64)


def strip_probabilities(
    case: Case, ref: Reference, q: np.ndarray, k_t: np.ndarray, c: float, r0: int, r1: int
) -> np.ndarray:
    """``p_ij = e^{s_ij − lse_i}`` on query rows ``[r0, r1)`` from the definition: ``s = c·q·k``
    (soft-capped, plus the bias and a program's bias, −∞ off ``A_i``) and the reference's
    lse (0 on an empty row); ``k_t`` is ``kᵀ`` with the group's heads expanded."""
    held, strip = ref.held, (..., slice(r0, r1), slice(None))
    with np.errstate(over="ignore", invalid="ignore"):
        s = c * (q[strip] @ k_t)
        if case.softcap is not None:
            s = case.softcap * np.tanh(s / case.softcap)
        for extra in (held.get("bias"), ref.program_bias):
            if extra is not None:
                s = s + (extra if extra.shape[-2] == 1 else extra[strip])
        s = np.where(case.allowed_rows(r0, r1), s, -np.inf)
        lse = ref.near["lse"][..., r0:r1, None]
        return np.where(np.isfinite(lse), np.exp(np.minimum(s - lse, 0.0)), 0.0)


def _expanded(case: Case, ref: Reference) -> tuple[Any, ...]:
    """``q, k, v, G`` as the reference holds them (K, V repeated over a GQA group's heads),
    the scale ``c`` and the dropout factors ``ρ`` (None without dropout)."""
    held, g = ref.held, case.group
    q, k, v, up = (held[x] for x in "qkvg")
    if g > 1:
        k, v = (np.repeat(x, g, axis=-3) for x in (k, v))
    return q, k, v, up, case.c(), case.rho() if case.dropout_p else None


def head_magnitudes(case: Case, ref: Reference) -> dict[str, np.ndarray]:
    """Upper bounds on ``|dQ|``, ``|dK_h|`` and ``|dV_h|`` per expanded head, ``(*batch, n, ·)``:
    ``|c|·Σ_j γ⁺_ij |k_j|``, ``|c|·Σ_i γ⁺_ij |q_i|`` and ``Σ_i p_ij |G_i|`` with ``p`` from the
    reference's lse and ``γ⁺ = p(|G·V| + |G·Y|)``, a strip of :data:`STRIP_ELEMENTS` score
    entries at a time (memory linear in ``n``: the allowed set read per strip)."""
    q, k, v, up, c, rho = _expanded(case, ref)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    n_q, n_k = q.shape[-2], k.shape[-2]
    rows = max(1, STRIP_ELEMENTS // max(1, n_k * math.prod(batch)))
    k_t, v_t, ak = np.swapaxes(k, -1, -2), np.swapaxes(v, -1, -2), np.abs(k)
    dq = np.zeros((*batch, n_q, k.shape[-1]))
    dk = np.zeros((*batch, n_k, q.shape[-1]))
    dv = np.zeros((*batch, n_k, up.shape[-1]))
    for r0 in range(0, n_q, rows):
        r1 = min(r0 + rows, n_q)
        strip = (..., slice(r0, r1), slice(None))
        p = strip_probabilities(case, ref, q, k_t, c, r0, r1)
        if rho is not None:
            p = p * rho[strip]
        dp = np.abs(up[strip] @ v_t)
        delta = np.abs((up[strip] * ref.near["y"][strip]).sum(axis=-1))[..., None]
        gamma = p * (dp + delta)
        dq[strip] = abs(c) * (gamma @ ak)
        dk += abs(c) * (np.swapaxes(gamma, -1, -2) @ np.abs(q[strip]))
        dv += np.swapaxes(p, -1, -2) @ np.abs(up[strip])
    return {"dq": dq * MARGIN, "dk": dk * MARGIN, "dv": dv * MARGIN}


def gamma(n: int, u: float) -> float:
    """``γ_n = n·u / (1 − n·u)`` (inf when ``n·u ≥ 1``)."""
    return n * u / (1 - n * u) if n * u < 1 else np.inf


def extra_bound(
    case: Case, ref: Reference, claimed: dict[str, np.ndarray], out: Format, summed: Format
) -> dict[str, np.ndarray]:
    """What the per-head roundings to ``out`` and the group's sum in ``summed`` add to the
    claimed bounds of ``dk`` and ``dv`` (see the module docstring)."""
    g = case.group
    gs = gamma(g - 1, summed.u)
    extra = {}
    for name, m in head_magnitudes(case, ref).items():
        if name not in claimed or name == "dq":
            continue
        groups = m.reshape((*m.shape[:-3], m.shape[-3] // g, g, *m.shape[-2:]))
        total = (groups + claimed[name][..., None, :, :]).sum(axis=-3)
        with np.errstate(over="ignore", invalid="ignore"):
            extra[name] = (
                (out.u + gs * (1 + out.u)) * total + g * out.mu * (1 + gs) + (g - 1) * summed.mu
            )
    return extra


def split_bound(
    case: Case,
    ref: Reference,
    claimed: dict[str, np.ndarray],
    out: Format,
    qsplit: int,
    block: int | None = None,
) -> dict[str, np.ndarray]:
    """What a backward adds that rounds dK, dV's part of each block of ``qsplit`` query rows
    to ``out`` and sums the ``P = ⌈n_q/qsplit⌉`` parts in ``out`` (and dQ's part of each key
    block of ``block`` keys, ``P = ⌈n_k/block⌉``): the parts' magnitudes sum to at most the
    whole's positive-term bound ``M`` (the same terms, split), so
    ``|extra| ≤ (u_o + γ_{P−1}(1 + u_o))·(M + claimed) + P·μ_o·(1 + γ_{P−1})``."""
    rows = -(-case.q.shape[-2] // qsplit)
    keys = -(-case.k.shape[-2] // block) if block else 1
    extra = {}
    for name, m in head_magnitudes(case, ref).items():
        parts = keys if name == "dq" else rows
        if name not in claimed or parts < 2:
            continue
        gp = gamma(parts - 1, out.u)
        g = case.group
        whole = m
        if g > 1 and name != "dq":
            whole = m.reshape((*m.shape[:-3], m.shape[-3] // g, g, *m.shape[-2:])).sum(axis=-3)
        with np.errstate(over="ignore", invalid="ignore"):
            total = whole + claimed[name]
            extra[name] = (out.u + gp * (1 + out.u)) * total + parts * out.mu * (1 + gp)
    return extra


def widened(variant: Any, case: Case, ref: Reference, bound: dict[str, Any]) -> dict[str, Any]:
    """``bound`` with the terms of the roundings the claim states beyond one per output:
    a GQA group's rounded per-head gradients summed (:attr:`~exactattn.targets.Variant.
    group_sum`), and the query-split parts of dK, dV (``Claim.qsplit``)."""
    from ..backends.formats import number_format

    if "dk" not in bound:
        return bound
    out = variant.arith(None).output  # the claim's output format (ftz: its flush charged)
    summed, qsplit = variant.group_sum, variant.claim.qsplit
    extras = []
    if case.group > 1 and summed is not None:
        extras.append(extra_bound(case, ref, bound, out, number_format(summed)))
    if qsplit is not None:
        block = variant.bound_block(case)
        extras.append(split_bound(case, ref, bound, out, qsplit, block))
    for extra in extras:
        bound = {name: b + extra[name] if name in extra else b for name, b in bound.items()}
    return bound


def split_variance(
    case: Case, ref: Reference, out: Format, qsplit: int, block: int | None = None
) -> dict[str, np.ndarray]:
    """The variance the query-split parts add to the *expected* error of dK, dV (and dQ's
    key-block parts), :mod:`exactattn.testing.suspicion`'s counterpart of
    :func:`split_bound`: each of the ``P`` parts ``Z_t`` rounded to ``out`` and the parts
    summed in it, every rounding an independent mean-zero variable of variance ``u_o²/3``:
    ``u_o²/3·(Σ_t Z_t² + (P + 1)(Σ_t Z_t²/6 + (Σ_t Z_t)²/3))`` (the random-order partial
    sums of :mod:`exactattn.error.expected_bounds`), the parts' exact values from the
    definition (``p`` from the reference's lse, ``δ = G·Y`` from its Y), shaped like q, k, v
    (a GQA group's heads summed)."""
    g = case.group
    q, k, v, up, c, rho = _expanded(case, ref)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    n_q, n_k = q.shape[-2], k.shape[-2]
    k_t, v_t = np.swapaxes(k, -1, -2), np.swapaxes(v, -1, -2)
    keys = block if block else n_k
    sums = {
        "dq": [np.zeros((*batch, n_q, k.shape[-1])) for _ in range(2)],
        "dk": [np.zeros((*batch, n_k, q.shape[-1])) for _ in range(2)],
        "dv": [np.zeros((*batch, n_k, up.shape[-1])) for _ in range(2)],
    }
    for r0 in range(0, n_q, qsplit):  # one part of dK, dV per block of qsplit rows
        r1 = min(r0 + qsplit, n_q)
        strip = (..., slice(r0, r1), slice(None))
        p = strip_probabilities(case, ref, q, k_t, c, r0, r1)
        pr = p if rho is None else p * rho[strip]
        delta = (up[strip] * ref.near["y"][strip]).sum(axis=-1)[..., None]
        gam = p * ((up[strip] @ v_t) * (1.0 if rho is None else rho[strip]) - delta)
        for name, part in (
            ("dk", c * (np.swapaxes(gam, -1, -2) @ q[strip])),
            ("dv", np.swapaxes(pr, -1, -2) @ up[strip]),
        ):
            sums[name][0] += part * part
            sums[name][1] += part
        for j0 in range(0, n_k, keys):  # dQ's parts: one per key block
            part = c * (gam[..., j0 : j0 + keys] @ k[..., j0 : j0 + keys, :])
            sums["dq"][0][strip] += part * part
            sums["dq"][1][strip] += part
    found = {}
    for name, (squares, total) in sums.items():
        parts = -(-n_k // keys) if name == "dq" else -(-n_q // qsplit)
        var = out.u**2 / 3 * (squares + (parts + 1) * (squares / 6 + total * total / 3))
        if g > 1 and name != "dq":
            var = var.reshape((*var.shape[:-3], var.shape[-3] // g, g, *var.shape[-2:]))
            var = var.sum(axis=-3)
        found[name] = var
    return found
