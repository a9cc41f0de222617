"""Naive (materialising) softmax attention and its exact VJP, over the same ``ctx``.

This is the textbook computation the tiled algorithm is compared against: the whole
score matrix ``S = c·Q Kᵀ`` (−∞ off ``A_i``), the row max ``m``, ``P = e^{S − m} / ℓ``,
``Y = (P∘ρ) V``; the reverse is the softmax Jacobian applied to ``dP = G Vᵀ``:
``dS = P ∘ (dP∘ρ − rowsum(P ∘ dP ∘ ρ))``, ``dQ = c dS K``, ``dK = c dSᵀ Q``,
``dV = (P∘ρ)ᵀ G``. Note that ``δ`` here is ``rowsum(P ∘ dP∘ρ)``, summed over ``P``, not
the tiled pass's ``G·Y`` shortcut, so the two passes are independent computations.
It allocates ``(n_q, n_k)`` arrays by design; use it at sizes where that is affordable.
"""

from __future__ import annotations

from typing import Any

from .algorithm import batch_index_of, geometry_of, safe_shift
from .backends.base import Array, ArrayContext
from .masks import Mask


def _full_tile(ctx: ArrayContext, mask: Mask | None, geometry: Any) -> Any:
    if mask is None:
        return None
    i = ctx.index(0, geometry.n_q)[:, None]
    j = ctx.index(0, geometry.n_k)[None, :]
    return mask.tile(i, j, geometry)


def _probabilities(ctx, q, k, v, scale, mask, dropout) -> tuple[Array, Array, Array, Any]:
    geometry = geometry_of(q, k, v)
    s = ctx.matmul(ctx.compute(q), ctx.transpose(ctx.compute(k))) * scale
    allowed = _full_tile(ctx, mask, geometry)
    if allowed is not None:
        s = ctx.where(allowed, s, ctx.neg_inf)
    m = ctx.rowmax(s)
    if s.shape[:-1] != (*geometry.batch, geometry.n_q):
        m = ctx.broadcast_to(m, (*geometry.batch, geometry.n_q))
    e = ctx.exp(s - safe_shift(ctx, m)[..., None])
    l = ctx.rowsum(e)
    empty = ctx.is_neg_inf(m)
    p = e / ctx.where(empty, ctx.scalar(1), l)[..., None]
    rho = None
    if dropout is not None:
        i = ctx.index(0, geometry.n_q)[:, None]
        j = ctx.index(0, geometry.n_k)[None, :]
        rho = dropout.factors(ctx, batch_index_of(ctx, geometry.batch), i, j)
    return p, m, l, rho


def naive_forward(
    ctx: ArrayContext, q: Array, k: Array, v: Array, *, scale: Any, mask=None, dropout=None
) -> tuple[Array, Array, Array]:
    """``Y = (P∘ρ) V`` with the whole ``P``; returns ``(Y, m, ℓ)`` in the compute type."""
    p, m, l, rho = _probabilities(ctx, q, k, v, scale, mask, dropout)
    weights = p if rho is None else p * rho
    return ctx.matmul(ctx.round_p(weights), ctx.compute(v)), m, l


def naive_backward(
    ctx: ArrayContext,
    q: Array,
    k: Array,
    v: Array,
    g: Array,
    *,
    scale: Any,
    mask=None,
    dropout=None,
) -> tuple[Array, Array, Array]:
    """The exact VJP of naive attention: ``(dQ, dK, dV)`` shaped like ``q, k, v``."""
    p, _, _, rho = _probabilities(ctx, q, k, v, scale, mask, dropout)
    qc, kc, vc, gc = (ctx.compute(x) for x in (q, k, v, g))
    dp = ctx.matmul(gc, ctx.transpose(vc))
    weights = p
    if rho is not None:
        dp, weights = dp * rho, p * rho
    ds = p * (dp - ctx.rowsum(p * dp)[..., None])
    dq = ctx.matmul(ds, kc) * scale
    dk = ctx.matmul(ctx.transpose(ds), qc) * scale
    dv = ctx.matmul(ctx.transpose(weights), gc)
    return (
        ctx.sum_to(dq, tuple(q.shape)),
        ctx.sum_to(dk, tuple(k.shape)),
        ctx.sum_to(dv, tuple(v.shape)),
    )
