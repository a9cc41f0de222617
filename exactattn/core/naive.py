"""Naive (materialising) softmax attention and its exact VJP, over the same ``ctx``.

This is the textbook computation the tiled algorithm is compared against: the whole
score matrix ``S = mod(c·Q Kᵀ)`` (−∞ off ``A_i``), the row max ``m``, ``P = e^{S − m} / ℓ``,
``Y = (P∘ρ) V``; the reverse is the softmax Jacobian applied to ``dP = G Vᵀ``:
``dS = P ∘ (dP∘ρ − rowsum(P ∘ dP ∘ ρ))`` (times ``∂mod/∂s``), ``dQ = c dS K``,
``dK = c dSᵀ Q``, ``dV = (P∘ρ)ᵀ G``. Note that ``δ`` here is ``rowsum(P ∘ dP∘ρ)``, summed
over ``P``, not the tiled pass's ``G·Y`` shortcut, so the two passes are independent
computations. It allocates ``(n_q, n_k)`` arrays by design; use it at sizes where that is
affordable.
"""

from __future__ import annotations

from typing import Any

from ..backends.protocol import Array, ArrayContext
from .algorithm import geometry_of, grouped, logical_layout, safe_shift, tile_layout
from .masks import Geometry, Mask, create_mask, tile_index
from .scores import ScoreMod


def _probabilities(ctx, geometry: Geometry, q, k, v, scale, mask, dropout, score_mod):
    """``(P, m, ℓ, ρ, mod)`` on the whole grid, in the tile layout."""
    s = ctx.matmul(ctx.compute(q), ctx.transpose(ctx.compute(k))) * scale
    whole = tile_index(ctx, geometry, range(geometry.n_q), range(geometry.n_k))
    mod = None if score_mod is None else score_mod.at(ctx, whole, geometry)
    if mod is not None:
        s = mod.apply(s)
    if mask is not None:
        s = ctx.where(create_mask(mask, geometry, ctx), s, ctx.neg_inf)
    rows_shape = (*geometry.tile_batch, geometry.n_q)
    m = ctx.rowmax(s)
    if tuple(m.shape) != rows_shape:
        m = ctx.broadcast_to(m, rows_shape)
    e = ctx.exp(s - safe_shift(ctx, m)[..., None])
    l = ctx.rowsum(e)
    p = e / ctx.where(ctx.is_neg_inf(m), ctx.scalar(1), l)[..., None]
    rho = None
    if dropout is not None:
        rho = dropout.factors(ctx, geometry.flat_index(ctx), whole.i, whole.j)
    return p, m, l, rho, mod


def naive_forward(
    ctx: ArrayContext,
    q: Array,
    k: Array,
    v: Array,
    *,
    scale: Any,
    mask: Mask | None = None,
    dropout: Any = None,
    score_mod: ScoreMod | None = None,
    enable_gqa: bool = False,
) -> tuple[Array, Array, Array]:
    """``Y = (P∘ρ) V`` with the whole ``P``; returns ``(Y, m, ℓ)`` in the compute type."""
    geometry = geometry_of(q, k, v, enable_gqa)
    q, k, v = grouped(geometry, q, k, v)
    p, m, l, rho, _ = _probabilities(ctx, geometry, q, k, v, scale, mask, dropout, score_mod)
    weights = p if rho is None else p * rho
    y = ctx.pv_product(weights, ctx.compute(v))
    return tuple(logical_layout(geometry, x) for x in (y, m, l))


def naive_backward(
    ctx: ArrayContext,
    q: Array,
    k: Array,
    v: Array,
    g: Array,
    *,
    scale: Any,
    mask: Mask | None = None,
    dropout: Any = None,
    score_mod: ScoreMod | None = None,
    enable_gqa: bool = False,
    mod_grads: dict[str, Array] | None = None,
) -> tuple[Array, Array, Array]:
    """The exact VJP of naive attention: ``(dQ, dK, dV)`` shaped like ``q, k, v``.

    Gradients of the score modifications' parameters are added into ``mod_grads``.
    """
    geometry = geometry_of(q, k, v, enable_gqa)
    shapes = tuple(q.shape), tuple(k.shape), tuple(v.shape)
    q, k, v = grouped(geometry, q, k, v)
    p, _, _, rho, mod = _probabilities(ctx, geometry, q, k, v, scale, mask, dropout, score_mod)
    qc, kc, vc = (ctx.compute(x) for x in (q, k, v))
    gc = tile_layout(geometry, ctx.compute(g))
    dp = ctx.matmul(gc, ctx.transpose(vc))
    weights = p
    if rho is not None:
        dp, weights = dp * rho, p * rho
    ds = p * (dp - ctx.rowsum(p * dp)[..., None])
    if mod is not None:
        ds = mod.pullback(ds, {} if mod_grads is None else mod_grads)
    dq = logical_layout(geometry, ctx.matmul(ds, kc) * scale)
    dk = ctx.matmul(ctx.transpose(ds), qc) * scale
    dv = ctx.matmul(ctx.transpose(weights), gc)
    if geometry.group != 1:
        dk = ctx.sum_to(dk, tuple(k.shape))[..., 0, :, :]
        dv = ctx.sum_to(dv, tuple(v.shape))[..., 0, :, :]
    return tuple(ctx.sum_to(x, shape) for x, shape in zip((dq, dk, dv), shapes))
