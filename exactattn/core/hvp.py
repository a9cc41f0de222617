"""The tiled second-order reverse: the directional derivative of the VJP (a Hessian-vector product).

The reverse (:func:`exactattn.core.algorithm.backward`) maps ``(Q, K, V, G)`` to
``(dQ, dK, dV)``, the gradient of ``L = Σ_ia G_ia Y_ia``. This module differentiates that map
along tangents ``(Q̇, K̇, V̇, Ġ)`` (and ``Ḃ`` of a bias array): it returns ``Ẏ`` and

    (dQ̇, dK̇, dV̇) = d/dε (dQ, dK, dV)(Q + εQ̇, K + εK̇, V + εV̇, G + εĠ) at ε = 0,

which is ``H·(Q̇, K̇, V̇) + Jᵀ Ġ``: ``H`` the Hessian of ``L`` in ``(Q, K, V)``, ``Jᵀ Ġ`` the
first reverse at ``Ġ``. Since ``H`` is symmetric, the reverse of the reverse (what
``create_graph=True`` needs) is this same map with the cotangents as the tangents and ``Ġ = 0``,
plus ``Ẏ`` for the cotangent of ``G``.

The maths, per tile, with ``u_ij = c·q_i·k_j``, ``s = mod(u)`` (then −∞ off ``A_i``) and the
frozen statistics ``m, ℓ`` of the forward (``p_ij = e^{s_ij − m_i}/ℓ_i``, a function of the
inputs whose derivative is the softmax's: the frozen max cancels):

    u̇_ij = c(q̇_i·k_j + q_i·k̇_j),      ṡ_ij = mod′(u_ij)·u̇_ij (+ Ḃ_ij for a bias),
    ṗ_ij = p_ij (ṡ_ij − σ_i),           σ_i = Σ_j p_ij ṡ_ij,
    Ẏ_i = Σ_j ρ_ij (ṗ_ij V_j + p_ij V̇_j) = Σ_j p_ij ρ_ij (ṡ_ij V_j + V̇_j) − σ_i Y_i,
    dP_ij = ρ_ij G_i·V_j,               dṖ_ij = ρ_ij (Ġ_i·V_j + G_i·V̇_j),
    δ_i = G_i·Y_i (− ∂L/∂lse_i),        δ̇_i = Ġ_i·Y_i + G_i·Ẏ_i
                                            = Σ_j p_ij (ṡ_ij dP_ij + dṖ_ij) − σ_i Σ_j p_ij dP_ij,
    γ_ij = p_ij (dP_ij − δ_i),          γ̇_ij = ṗ_ij (dP_ij − δ_i) + p_ij (dṖ_ij − δ̇_i),
    γᵘ = γ·mod′(u),                     γ̇ᵘ = γ̇·mod′(u) + γ·mod″(u)·u̇,
    dQ̇_i = c Σ_j (γ̇ᵘ_ij K_j + γᵘ_ij K̇_j),   dK̇_j = c Σ_i (γ̇ᵘ_ij Q_i + γᵘ_ij Q̇_i),
    dV̇_j = Σ_i ρ_ij (ṗ_ij G_i + p_ij Ġ_i),  dḂ_ij = γ̇_ij (a bias array's gradient).

``σ``, ``δ̇`` and ``Ẏ`` are sums over all of a row's keys: like ``δ`` for the first reverse
they are per-row statistics, complete once every tile holding the row has been visited
(``δ̇`` from the row sums above, so it needs no ``Ẏ``; ``Ẏ`` itself, two more tile
products, only where asked for: the reverse of the reverse needs it as ``G``'s cotangent).
Each tile of :func:`exactattn.core.algorithm.tiles` is visited twice: its first visit
recomputes ``p, ṡ`` from ``Q, K`` and the frozen ``m, ℓ``, forms ``dP, dṖ`` and adds its
terms of the row sums (:func:`first_visit`); its second visit (:func:`second_visit`) reads
the same ``p, ṡ, dP, dṖ`` and the rows' ``σ, δ, δ̇`` and accumulates ``dQ̇, dK̇, dV̇``. The
visits run in the order of :func:`row_schedule`: tiles by their first row, and a tile's
second visit as soon as every row it holds is complete, so only the tiles that straddle the
frontier of complete rows are kept — about two runs of rows against all keys (``row_block``
rows, or :data:`BAND_ROWS` when the rows are whole), never an ``(n_q, n_k)`` array — and no
tile product is computed twice: 10 per tile (``s``, ``ṡ`` (2), ``dP``, ``dṖ``, ``dQ̇`` (2),
``dK̇`` (2), ``dV̇``), 12 with ``Ẏ``, against the first reverse's 5. Dropout replays the
same ``ρ_ij``; GQA sums the group's dK̇, dV̇ into its key/value head as the reverse does.

Each step is a module-level function, so the proofs can substitute a broken step.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..backends.protocol import Array, ArrayContext
from .algorithm import (
    geometry_of,
    grouped,
    logical_layout,
    softmax_delta,
    tile_gamma,
    tile_layout,
    tile_probabilities,
    tile_scores,
    tiles,
)
from .masks import Mask
from .scores import ScoreMod

BAND_ROWS = 128  # rows per run where the caller keeps rows whole (row_block=None)


class Tangents(NamedTuple):
    """The direction of a second-order product: ``(Q̇, K̇, V̇, Ġ)``, None for a zero tangent.

    Each is shaped like its primal (``q``, ``k``, ``v``, ``grad_y``). ``bias`` is ``Ḃ``, the
    tangent of a bias array (shaped like it), for callers that differentiate in the bias too.
    """

    q: Any = None
    k: Any = None
    v: Any = None
    grad_y: Any = None
    bias: Any = None


class SecondOrder(NamedTuple):
    """``Ẏ`` (None when not asked for) and ``(dQ̇, dK̇, dV̇)``, in the compute type, shaped
    like y, q, k, v."""

    y: Array | None
    q: Array
    k: Array
    v: Array


# --- the pieces of one step -----------------------------------------------------------------
def score_tangent(
    ctx: ArrayContext, q: Array, k: Array, q_dot: Array | None, k_dot: Array | None, scale: Any
) -> Array:
    """``u̇_ij = c(q̇_i·k_j + q_i·k̇_j)`` on the tile (0 where both tangents are zero)."""
    out = None if q_dot is None else ctx.matmul(q_dot, ctx.transpose(k))
    if k_dot is not None:
        part = ctx.matmul(q, ctx.transpose(k_dot))
        if out is None:
            out = part
        else:
            out += part  # in place: out is a fresh tile
    if out is None:
        return ctx.zeros((*q.shape[:-1], k.shape[-2])) * scale
    out *= scale
    return out


def tile_sigma(ctx: ArrayContext, p_s_dot: Array) -> Array:
    """This tile's part of ``σ_i = Σ_j p_ij ṡ_ij`` (from ``p∘ṡ``)."""
    return ctx.rowsum(p_s_dot)


def output_tangent_part(
    ctx: ArrayContext, p_s_dot: Array, weights: Array, rho: Any, v: Array, v_dot: Array | None
) -> Array:
    """This tile's part of ``Σ_j p_ij ρ_ij (ṡ_ij V_j + V̇_j)`` (``p∘ṡ``, ``weights = p∘ρ``)."""
    out = ctx.matmul(p_s_dot if rho is None else p_s_dot * rho, v)
    if v_dot is not None:
        out += ctx.matmul(weights, v_dot)  # in place: out is a fresh (r, d) block
    return out


def output_tangent_of(ctx: ArrayContext, w: Array, sigma: Array, y: Array) -> Array:
    """``Ẏ_i = Σ_j p_ij ρ_ij (ṡ_ij V_j + V̇_j) − σ_i Y_i`` from the first pass's sums ``w, σ``."""
    return w - sigma[..., None] * y


def delta_tangent(ctx: ArrayContext, sigma: Array, p_dp: Array, p_ds: Array) -> Array:
    """``δ̇_i = Σ_j p_ij (ṡ_ij dP_ij + dṖ_ij) − σ_i Σ_j p_ij dP_ij``, the derivative of
    ``δ_i = G_i·Y_i``: ``Ġ_i·Y_i + G_i·Ẏ_i = Σ_j ρ_ij (p_ij Ġ_i·V_j + ṗ_ij G_i·V_j + p_ij
    G_i·V̇_j)``, with ``ṗ = p(ṡ − σ)`` (from the row sums ``p_dp = Σ_j p dP``,
    ``p_ds = Σ_j p(ṡ dP + dṖ)``, without ``Ẏ``)."""
    return p_ds - sigma * p_dp


def probability_tangent(ctx: ArrayContext, p: Array, s_dot: Array, sigma: Array) -> Array:
    """``ṗ_ij = p_ij (ṡ_ij − σ_i)``: the softmax's derivative along ``ṡ``.

    Computed in ``s_dot``'s storage: the caller hands over a tile it no longer reads.
    """
    s_dot -= sigma[..., None]
    s_dot *= p
    return s_dot


def gamma_tangent(
    ctx: ArrayContext,
    p: Array,
    p_dot: Array,
    dp: Array,
    dp_dot: Array,
    delta: Array,
    delta_dot: Array,
) -> Array:
    """``γ̇_ij = ṗ_ij (dP_ij − δ_i) + p_ij (dṖ_ij − δ̇_i)``.

    Computed in ``dp_dot``'s storage (consumed, as :func:`tile_gamma` consumes ``dp``).
    """
    out = dp - delta[..., None]
    out *= p_dot
    dp_dot -= delta_dot[..., None]
    dp_dot *= p
    dp_dot += out
    return dp_dot


def query_gradient_tangent(
    ctx: ArrayContext, gamma: Array, gamma_dot: Array, k: Array, k_dot: Array | None, scale: Any
) -> Array:
    """This tile's ``dQ̇_i = c Σ_j (γ̇_ij k_j + γ_ij k̇_j)``."""
    out = ctx.matmul(gamma_dot, k)
    if k_dot is not None:
        out = out + ctx.matmul(gamma, k_dot)
    return out * scale


def key_gradient_tangent(
    ctx: ArrayContext, gamma: Array, gamma_dot: Array, q: Array, q_dot: Array | None, scale: Any
) -> Array:
    """This tile's ``dK̇_j = c Σ_i (γ̇_ij q_i + γ_ij q̇_i)``."""
    out = ctx.matmul(ctx.transpose(gamma_dot), q)
    if q_dot is not None:
        out = out + ctx.matmul(ctx.transpose(gamma), q_dot)
    return out * scale


def value_gradient_tangent(
    ctx: ArrayContext, weights: Array, weights_dot: Array, g: Array, g_dot: Array | None
) -> Array:
    """This tile's ``dV̇_j = Σ_i (ṗ_ij ρ_ij G_i + p_ij ρ_ij Ġ_i)``."""
    out = ctx.matmul(ctx.transpose(weights_dot), g)
    if g_dot is not None:
        out = out + ctx.matmul(ctx.transpose(weights), g_dot)
    return out


# --- one tile's visit in each pass ------------------------------------------------------------
class TileOperands(NamedTuple):
    """One tile's operands: q, q̇ (rows), k, k̇, v, v̇ (keys), G, Ġ (rows); None: zero."""

    q: Array
    q_dot: Array | None
    k: Array
    k_dot: Array | None
    v: Array
    v_dot: Array | None
    g: Array
    g_dot: Array | None


class Recomputed(NamedTuple):
    """A tile's ``p_ij`` (from the frozen ``m, ℓ``), ``ṡ_ij`` and ``ρ_ij`` (None: no dropout)."""

    p: Array
    s_dot: Array
    rho: Any


def recompute(
    ctx: ArrayContext,
    x: TileOperands,
    allowed: Any,
    scale: Any,
    m: Array,
    l: Array,
    mod: Any = None,
    mod_tangents: dict[str, Array] | None = None,
    rho: Any = None,
) -> Recomputed:
    """``s = mod(c·q·k)`` (−∞ off ``A_i``, the mask last as in ``tile_scores``), ``ṡ`` and
    ``p = e^{s − m}/ℓ``; ``mod`` records what its :meth:`pullback_tangent` needs."""
    u_dot = score_tangent(ctx, x.q, x.k, x.q_dot, x.k_dot, scale)
    s = tile_scores(ctx, x.q, x.k, scale, None)
    s_dot = u_dot
    if mod is not None:
        s, s_dot = mod.apply_tangent(s, u_dot, {} if mod_tangents is None else mod_tangents)
    if allowed is not None:
        s = ctx.where(allowed, s, ctx.neg_inf)
    return Recomputed(tile_probabilities(ctx, s, m, l), s_dot, rho)


def _weights(r: Recomputed, p: Array) -> Array:
    return p if r.rho is None else p * r.rho


def tile_products(ctx: ArrayContext, x: TileOperands, rho: Any) -> tuple[Array, Array]:
    """``dP_ij = ρ_ij G_i·V_j`` and ``dṖ_ij = ρ_ij (Ġ_i·V_j + G_i·V̇_j)`` on the tile."""
    dp = ctx.matmul(x.g, ctx.transpose(x.v))
    dp_dot = None if x.v_dot is None else ctx.matmul(x.g, ctx.transpose(x.v_dot))
    if x.g_dot is not None:
        part = ctx.matmul(x.g_dot, ctx.transpose(x.v))
        if dp_dot is None:
            dp_dot = part
        else:
            dp_dot += part  # in place: fresh tiles, as below
    if dp_dot is None:
        dp_dot = dp * ctx.scalar(0)
    if rho is not None:
        dp *= rho
        dp_dot *= rho
    return dp, dp_dot


class FirstTerms(NamedTuple):
    """A tile's first visit: its terms of the row sums ``σ = Σ_j p ṡ``, ``Σ_j p dP``,
    ``Σ_j p(ṡ dP + dṖ)`` and (when ``Ẏ`` is formed) ``w = Σ_j pρ(ṡ V_j + V̇_j)``; and its
    ``dP, dṖ``, kept for its second visit."""

    sigma: Array
    p_dp: Array
    p_ds: Array
    w: Array | None
    dp: Array
    dp_dot: Array


def first_visit(
    ctx: ArrayContext, x: TileOperands, r: Recomputed, output_tangent: bool = True
) -> FirstTerms:
    """The tile's terms of the row sums (:class:`FirstTerms`); ``w`` None unless
    ``output_tangent`` (its two tile products are for ``Ẏ`` alone: ``δ̇`` does not need it)."""
    p_s_dot = r.p * r.s_dot
    dp, dp_dot = tile_products(ctx, x, r.rho)
    w = None
    if output_tangent:
        w = output_tangent_part(ctx, p_s_dot, _weights(r, r.p), r.rho, x.v, x.v_dot)
    p_ds = r.s_dot * dp  # p(ṡ dP + dṖ) in one fresh tile
    p_ds += dp_dot
    p_ds *= r.p
    return FirstTerms(
        tile_sigma(ctx, p_s_dot), ctx.rowsum(r.p * dp), ctx.rowsum(p_ds), w, dp, dp_dot
    )


def second_visit(
    ctx: ArrayContext,
    x: TileOperands,
    r: Recomputed,
    dp: Array,
    dp_dot: Array,
    sigma: Array,
    delta: Array,
    delta_dot: Array,
    scale: Any,
    mod: Any = None,
    grad_tangents: dict[str, Array] | None = None,
) -> tuple[Array, Array, Array]:
    """The tile's terms ``(dQ̇_i, dK̇_j, dV̇_j)`` from its first visit's ``dP, dṖ``
    (:func:`tile_products`, consumed) and the rows' ``σ, δ, δ̇`` (module docstring)."""
    p_dot = probability_tangent(ctx, r.p, r.s_dot, sigma)
    gamma_dot = gamma_tangent(ctx, r.p, p_dot, dp, dp_dot, delta, delta_dot)
    gamma = tile_gamma(ctx, r.p, dp, delta)  # consumes dp
    if mod is not None:
        grads = {} if grad_tangents is None else grad_tangents
        gamma, gamma_dot = mod.pullback_tangent(gamma, gamma_dot, grads)
    return (
        query_gradient_tangent(ctx, gamma, gamma_dot, x.k, x.k_dot, scale),
        key_gradient_tangent(ctx, gamma, gamma_dot, x.q, x.q_dot, scale),
        value_gradient_tangent(ctx, _weights(r, r.p), _weights(r, p_dot), x.g, x.g_dot),
    )


# --- the two passes -----------------------------------------------------------------------
class _Operands(NamedTuple):
    q: Array
    k: Array
    v: Array


def _tangent_operands(ctx, geometry, t: Tangents) -> Tangents:
    """The tangents in the compute type and the tile layout (None stays None)."""
    q_dot, k_dot, v_dot = (None if x is None else ctx.compute(x) for x in t[:3])
    if geometry.group != 1:  # the layout of algorithm.grouped
        q_dot = None if q_dot is None else grouped(geometry, q_dot, q_dot, q_dot)[0]
        k_dot, v_dot = (None if x is None else x[..., None, :, :] for x in (k_dot, v_dot))
    g_dot = None if t.grad_y is None else tile_layout(geometry, ctx.compute(t.grad_y))
    return Tangents(q_dot, k_dot, v_dot, g_dot, t.bias)


def _slice(x: Array | None, at: slice) -> Array | None:
    return None if x is None else x[..., at, :]


class _Visits:
    """A call's arrays, and one tile read from them: its operands, ``p, ṡ, ρ`` and mod."""

    def __init__(self, ctx, geometry, a, t, g, m, l, *, scale, dropout, score_mod, mod_t):
        self.ctx, self.geometry, self.a, self.t, self.g = ctx, geometry, a, t, g
        self.m, self.l, self.scale, self.dropout = m, l, scale, dropout
        self.score_mod, self.mod_t = score_mod, mod_t
        self.flat = geometry.flat_index(ctx) if dropout is not None else None

    def read(self, tile: Any) -> tuple[TileOperands, Recomputed, Any]:
        ctx, a, t, rows, cols = self.ctx, self.a, self.t, tile.rows, tile.cols
        x = TileOperands(
            a.q[..., rows, :], _slice(t.q, rows), a.k[..., cols, :], _slice(t.k, cols),
            a.v[..., cols, :], _slice(t.v, cols), self.g[..., rows, :], _slice(t.grad_y, rows),
        )  # fmt: skip
        mod = None
        if self.score_mod is not None:
            mod = self.score_mod.at(ctx, tile.index, self.geometry)
        rho = None
        if self.dropout is not None:
            rho = self.dropout.factors(ctx, self.flat, tile.index.i, tile.index.j)
        m, l = self.m[..., rows], self.l[..., rows]
        return x, recompute(ctx, x, tile.allowed, self.scale, m, l, mod, self.mod_t, rho), mod


def row_schedule(rows: Sequence[range]) -> list[tuple[list[int], list[int]]]:
    """The visit order of tiles whose query rows are ``rows``: steps ``(firsts, seconds)``.

    Tiles are first-visited by their first row (stably, so a row's key blocks stay in
    order). Once every tile starting before row ``f`` has had its first visit, the rows
    ``< f`` are complete (a tile holding row ``r`` starts at most at ``r``); each step then
    second-visits the tiles that end at the new frontier ``f`` or before it, in order of
    their last row. So every tile is first-visited once and second-visited once, after the
    first visit of every tile that shares a row with it.
    """
    order = sorted(range(len(rows)), key=lambda t: rows[t].start)
    steps, waiting, at = [], [], 0
    while at < len(order):
        first_row, firsts = rows[order[at]].start, []
        while at < len(order) and rows[order[at]].start == first_row:
            firsts.append(order[at])
            heapq.heappush(waiting, (rows[order[at]].stop, order[at]))
            at += 1
        frontier = rows[order[at]].start if at < len(order) else None
        seconds = []
        while waiting and (frontier is None or waiting[0][0] <= frontier):
            seconds.append(heapq.heappop(waiting)[1])
        steps.append((firsts, seconds))
    return steps


class _RowTotals:
    """The per-row sums of the first visits: ``σ``, ``Σ_j p dP``, ``Σ_j p(ṡ dP + dṖ)`` and
    ``w`` (None when ``Ẏ`` is not formed)."""

    def __init__(self, ctx: ArrayContext, geometry: Any, v_dim: int, output_tangent: bool):
        rows_shape = (*geometry.tile_batch, geometry.n_q)
        self.sigma, self.p_dp, self.p_ds = (ctx.zeros(rows_shape) for _ in range(3))
        self.w = ctx.zeros((*rows_shape, v_dim)) if output_tangent else None

    def add(self, rows: slice, terms: FirstTerms) -> None:
        self.sigma[..., rows] += terms.sigma
        self.p_dp[..., rows] += terms.p_dp
        self.p_ds[..., rows] += terms.p_ds
        if self.w is not None:
            self.w[..., rows, :] += terms.w


def hvp(
    ctx: ArrayContext,
    q: Array,
    k: Array,
    v: Array,
    y: Array,
    m: Array,
    l: Array,
    g: Array,
    tangents: Tangents,
    *,
    scale: Any,
    block_size: int,
    mask: Mask | None = None,
    dropout: Any = None,
    row_block: int | None = None,
    score_mod: ScoreMod | None = None,
    enable_gqa: bool = False,
    grad_lse: Array | None = None,
    mod_tangents: dict[str, Array] | None = None,
    mod_grad_tangents: dict[str, Array] | None = None,
    output_tangent: bool = True,
) -> SecondOrder:
    """``Ẏ`` and ``(dQ̇, dK̇, dV̇)`` along ``tangents`` (module docstring), tiled.

    Arguments as :func:`~exactattn.core.algorithm.backward`'s; ``tangents`` a
    :class:`Tangents` of arrays shaped like q, k, v, g (None: zero). ``grad_lse``: an
    upstream gradient of lse, held fixed (``δ_i = G_i·Y_i − ∂L/∂lse_i``, its tangent 0).
    ``mod_tangents``: the tangents of the score modifications' parameters (``{"bias": Ḃ}``);
    ``mod_grad_tangents``: arrays into which their gradients' tangents (``dḂ = γ̇``) are
    added, by name, when given. ``output_tangent=False``: ``Ẏ`` is not formed (returned
    as None; two fewer tile products per tile). Both visits are of the tiles of the one
    ``tiles()`` call (``b`` is read there only), in the order of :func:`row_schedule`.
    """
    geometry = geometry_of(q, k, v, enable_gqa)
    q_shape, k_shape, v_shape = tuple(q.shape), tuple(k.shape), tuple(v.shape)
    a = _Operands(*grouped(geometry, ctx.compute(q), ctx.compute(k), ctx.compute(v)))
    t = _tangent_operands(ctx, geometry, tangents)
    g, y, m, l = (tile_layout(geometry, x) for x in (ctx.compute(g), ctx.compute(y), m, l))
    grads_dot = {} if mod_grad_tangents is None else mod_grad_tangents
    visits = _Visits(
        ctx, geometry, a, t, g, m, l, scale=scale, dropout=dropout, score_mod=score_mod,
        mod_t={} if mod_tangents is None else mod_tangents,
    )  # fmt: skip

    delta = softmax_delta(ctx, g, y)
    if grad_lse is not None:
        delta = delta - tile_layout(geometry, ctx.compute(grad_lse))
    totals = _RowTotals(ctx, geometry, a.v.shape[-1], output_tangent)
    dq = ctx.zeros((*geometry.tile_batch, geometry.n_q, a.q.shape[-1]))
    dk, dv = ctx.zeros(tuple(a.k.shape)), ctx.zeros(tuple(a.v.shape))
    runs = BAND_ROWS if row_block is None else row_block
    every_tile, partial = [], []
    for tile in tiles(ctx, mask, geometry, block_size, runs):
        every_tile.append(tile)  # a PARTIAL tile's allowed pairs are formed again at its
        partial.append(tile.allowed is not None)  # first visit: never all of them at once
        tile.allowed = None
    kept: dict[int, Any] = {}  # the tiles between their visits: operands, p, ṡ, ρ, mod, dP, dṖ
    for firsts, seconds in row_schedule([range(x.rows.start, x.rows.stop) for x in every_tile]):
        for at in firsts:
            tile = every_tile[at]
            if partial[at]:
                tile.allowed = mask.allowed(tile.index, geometry)
            x, r, mod = visits.read(tile)
            tile.allowed = None  # p is 0 off A_i from here on
            terms = first_visit(ctx, x, r, output_tangent)
            totals.add(tile.rows, terms)
            kept[at] = (x, r, mod, terms.dp, terms.dp_dot)
        for at in seconds:  # every row of these tiles is complete: σ, δ̇ are final
            tile, (x, r, mod, dp, dp_dot) = every_tile[at], kept.pop(at)
            rows, cols = tile.rows, tile.cols
            sigma = totals.sigma[..., rows]
            delta_dot = delta_tangent(ctx, sigma, totals.p_dp[..., rows], totals.p_ds[..., rows])
            dq_t, dk_t, dv_t = second_visit(
                ctx, x, r, dp, dp_dot, sigma, delta[..., rows], delta_dot, scale, mod, grads_dot
            )
            dq[..., rows, :] += dq_t
            dk[..., cols, :] += ctx.sum_to(dk_t, dk[..., cols, :].shape)
            dv[..., cols, :] += ctx.sum_to(dv_t, dv[..., cols, :].shape)
    y_dot = None
    if output_tangent:
        y_dot = logical_layout(geometry, output_tangent_of(ctx, totals.w, totals.sigma, y))
    if geometry.group != 1:
        dq, dk, dv = logical_layout(geometry, dq), dk[..., 0, :, :], dv[..., 0, :, :]
    return SecondOrder(
        y_dot, ctx.sum_to(dq, q_shape), ctx.sum_to(dk, k_shape), ctx.sum_to(dv, v_shape)
    )
