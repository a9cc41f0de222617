"""The tiled forward and the block-recomputed reverse, written once against a ``ctx``.

Notation (``docs/algorithm.md``; Dao et al. 2022 §3.1 and App. B.2–B.4; Milakov &
Gimelshein 2018): scores ``s_ij = mod(c·q_i·k_j)`` (``mod``: the optional score
modifications of :mod:`exactattn.core.scores`, identity by default) over the allowed keys
``A_i``, key blocks ``J_t`` of size ``b``; for a row ``i`` and key set ``I`` the summary is

    Σ_i(I) = (m, ℓ, z),  m = max_{j∈I} s_ij,
                         ℓ = Σ_{j∈I} e^{s_ij − m},  z = Σ_{j∈I} e^{s_ij − m} V_j

and the merge ``⋆`` rescales both sides to ``M = max(m1, m2)``:

    (m1, ℓ1, z1) ⋆ (m2, ℓ2, z2) = (M, ℓ1·e^{m1−M} + ℓ2·e^{m2−M}, z1·e^{m1−M} + z2·e^{m2−M}).

``⊥ = (−∞, 0, 0)`` is the identity. The forward folds ``⋆`` over the blocks,
``Y = z / ℓ``, and keeps ``m`` and ``ℓ`` (``lse = m + log ℓ``). The reverse recomputes one
block's ``p_ij = e^{s_ij − m_i} / ℓ_i`` from the frozen ``m, ℓ``, with ``δ_i = G_i·Y_i``,
``γ_ij = p_ij (G_i·V_j − δ_i)`` (times ``∂mod/∂s`` through the score modifications),
``dQ += c γ K``, ``dK += c γᵀ Q``, ``dV += pᵀ G``.

Every step works on a ``(*batch, r, b)`` tile for all query rows at once (``r ≤ n_q``,
narrowed by the mask's ``row_span``); no ``(n_q, n_k)`` array exists in either pass.
Grouped-query attention (``enable_gqa``) runs the ``H`` query heads as ``(H_kv, g)`` against
key/value heads ``(H_kv, 1)``: broadcasting shares each key/value head with its group, and
the reverse's ``sum_to`` adds the group's dK, dV into it.
Each step is a module-level function, so the proofs can substitute a deliberately broken
step (``proofs/`` mutants) and watch the same code path fail.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.protocol import Array, ArrayContext
from .masks import INT, Geometry, IntOps, Mask, TileIndex, TileKind, tile_index
from .scores import ScoreMod, TileMod


@dataclass
class Summary:
    """Per-row running summary ``(m, ℓ, z)``: shapes (*batch, r), (*batch, r), (*batch, r, v)."""

    m: Array
    l: Array
    z: Array


class Tile:
    """One (query rows × key block) tile: where it sits, and the allowed tile when PARTIAL.

    ``index`` (the index arrays ``b, h, i, j``) is built on first use: only masks, score
    modifications and dropout read it, and a tile without them is a few slices.
    """

    def __init__(self, rows: range, cols: range, locate: Callable[[range, range], TileIndex]):
        self.rows, self.cols = slice(rows.start, rows.stop), slice(cols.start, cols.stop)
        self._ranges, self._locate = (rows, cols), locate
        self.allowed: Any = None  # boolean (*batch, r, b); None when every pair is allowed

    @functools.cached_property
    def index(self) -> TileIndex:
        return self._locate(*self._ranges)


# --- the pieces of one step ---------------------------------------------------------------
# The iterator's integer logic is three small formulas over an integer-operations namespace
# (``masks.IntOps``; a proof passes SMT terms) and one loop, :func:`runs`; the ``smt`` proof
# family runs these very formulas on symbols and proves, for all n, that :func:`tiles` is
# the stated loop of ``proofs/families/smt.py``.
def key_block(start: Any, block_size: Any, n_k: Any, ops: IntOps = INT) -> tuple[Any, Any]:
    """``J_t = [tb, min((t+1)b, n_k))`` from its first key ``start = tb``."""
    return start, ops.min(start + block_size, n_k)


def run_widths(
    start: Any, stop: Any, block_size: Any, row_block: Any, edge: bool, ops: IntOps = INT
) -> tuple[Any, Any]:
    """``(w₀, w)``: rows per run of a key block's span ``[start, stop)``.

    ``w = max(1, ρ)`` for a ``row_block`` ρ, else ``max(1, stop − start)`` (one run);
    ``w₀ = min(w, b)`` for the first run when ``edge`` (see :func:`tiles`), else ``w``.
    """
    w = ops.max(1, ops.max(stop - start, 0) if row_block is None else row_block)
    return (ops.min(w, block_size) if edge else w), w


def row_run(first: Any, start: Any, stop: Any, widths: tuple[Any, Any], ops: IntOps = INT):
    """The run of rows from ``first``: ``[first, min(first + w', stop))``, ``w' = w₀`` for
    the first run (``first = start``) and ``w`` after it."""
    w0, w = widths
    return first, ops.min(first + ops.where(first == start, w0, w), stop)


def runs(start: Any, stop: Any, run: Callable[[Any], tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
    """``run(f) = (f, g)`` for ``f = start`` and then each run's end ``g``, while ``f < stop``
    (the iterator's one loop, written once for key blocks and row runs)."""
    while start < stop:
        first, end = run(start)
        yield first, end
        start = end


def _ranges(start: int, stop: int, run: Callable[[int], tuple[int, int]]) -> Iterator[range]:
    return (range(first, end) for first, end in runs(start, stop, run))


def tiles(
    ctx: ArrayContext,
    mask: Mask | None,
    geometry: Geometry,
    block_size: int,
    row_block: int | None = None,
    edge_first: bool = False,
) -> Iterator[Tile]:
    """Key blocks ``J_t`` in order, each with the query rows it can reach.

    ``row_block`` splits those rows into runs of at most that many, one tile each (keeps a
    tile cache-sized; rows are independent, so no row's arithmetic changes); ``None``
    keeps them whole. ``edge_first`` (with a mask and a ``row_block``) makes the first run
    at most ``b`` rows: a causal edge crosses the first ``b`` rows of ``J_t``'s span, so
    its PARTIAL tile is not padded with FULL rows (the forward's choice: the reverse's
    row runs also count its dK, dV additions). EMPTY tiles are skipped before any score is
    computed; FULL tiles skip the predicate; a PARTIAL tile whose predicate allows
    nothing is skipped as well.
    """
    bh: list[Any] = []  # the batch and head indices, made once if a tile needs them

    def locate(rows: range, cols: range) -> TileIndex:
        if not bh:
            bh.append(geometry.batch_head(ctx))
        return tile_index(ctx, geometry, rows, cols, bh[0])

    n_k, edge = geometry.n_k, edge_first and mask is not None and row_block is not None
    for cols in _ranges(0, n_k, functools.partial(key_block, block_size=block_size, n_k=n_k)):
        span = range(geometry.n_q) if mask is None else mask.row_span(cols, geometry)
        widths = run_widths(span.start, span.stop, block_size, row_block, edge)
        run = functools.partial(row_run, start=span.start, stop=span.stop, widths=widths)
        for rows in _ranges(span.start, span.stop, run):
            kind = TileKind.FULL if mask is None else mask.classify(rows, cols, geometry)
            if kind is TileKind.EMPTY:
                continue
            tile = Tile(rows, cols, locate)
            if kind is TileKind.PARTIAL:
                tile.allowed = mask.allowed(tile.index, geometry)
                if not ctx.any(tile.allowed):
                    continue
            yield tile


def tile_scores(
    ctx: ArrayContext, q: Array, k: Array, scale: Any, allowed: Any, mod: TileMod | None = None
) -> Array:
    """``s_ij = mod(c·q_i·k_j)`` on the tile, −∞ where ``j ∉ A_i`` (so ``e^{s−m}`` is exactly 0).

    The mask comes last, so no modification can turn an excluded pair into a finite score.
    """
    s = ctx.matmul(q, ctx.transpose(k))
    s *= scale  # in place: s is a fresh tile
    if mod is not None:
        s = mod.apply(s)
    if allowed is not None:
        s = ctx.where(allowed, s, ctx.neg_inf)
    return s


def safe_shift(ctx: ArrayContext, m: Array) -> Array:
    """The shift used for ``e^{x − m}``: ``m``, or 0 where ``m = −∞`` (the summary is ⊥).

    Shifting ⊥ by 0 keeps ``e^{−∞ − 0} = 0`` and never evaluates ``−∞ − (−∞)`` (NaN).
    """
    return ctx.where(ctx.is_neg_inf(m), ctx.scalar(0), m)


def block_summary(
    ctx: ArrayContext, s: Array, v: Array, rho: Any = None, floor: Array | None = None
) -> Summary:
    """``Σ_i(J_t ∩ A_i)`` for every row of the tile; ⊥ for rows with no allowed key.

    ``ℓ`` sums ``p`` before dropout; ``z`` sums ``p·ρ·V`` (the dropped-out weights), the
    product by ``ctx.pv_product``. ``floor``: the running max ``m_old`` of a context with
    ``running_max`` (FlashAttention-2's order): the summary is taken at ``max(m, m_old)``,
    the same summary (``(m, ℓ, z) ~ (m', ℓe^{m−m'}, ze^{m−m'})``), ``p`` computed against it.
    """
    m = ctx.rowmax(s)
    if floor is not None:
        m = ctx.maximum(m, floor)
    p = ctx.exp_shifted(s, safe_shift(ctx, m))
    l = ctx.rowsum(p)
    weights = p if rho is None else p * rho
    z = ctx.pv_product(weights, v)
    return Summary(m, l, z)


def merge(ctx: ArrayContext, a: Summary, b: Summary) -> Summary:
    """``a ⋆ b``: rescale both to ``M = max(m_a, m_b)`` and add (⊥ ⋆ ⊥ stays ⊥)."""
    m = ctx.maximum(a.m, b.m)
    shift = safe_shift(ctx, m)
    alpha = ctx.exp(a.m - shift)  # e^{m_old − m_new}, the rescale of what came before
    beta = ctx.exp(b.m - shift)
    return Summary(m, a.l * alpha + b.l * beta, a.z * alpha[..., None] + b.z * beta[..., None])


def _nonzero_l(ctx: ArrayContext, m: Array, l: Array) -> Array:
    """ℓ, with 1 in place of the 0 of rows still at ⊥ (their z is 0, so Y = 0)."""
    return ctx.where(ctx.is_neg_inf(m), ctx.scalar(1), l)


def finalize(ctx: ArrayContext, state: Summary) -> Array:
    """``Y = z / ℓ``; rows still at ⊥ (no allowed key) give ``Y = 0``."""
    return state.z / _nonzero_l(ctx, state.m, state.l)[..., None]


def log_sum_exp(ctx: ArrayContext, m: Array, l: Array) -> Array:
    """``lse = m + log ℓ = log Σ_{j∈A_i} e^{s_ij}``; −∞ for rows at ⊥."""
    return ctx.where(ctx.is_neg_inf(m), ctx.neg_inf, m + ctx.log(_nonzero_l(ctx, m, l)))


def softmax_delta(ctx: ArrayContext, g: Array, y: Array) -> Array:
    """``δ_i = Σ_a G_ia Y_ia`` (equals ``Σ_j p_ij dP_ij``, with no pass over ``p``)."""
    return ctx.rowsum(g * y)


def tile_probabilities(ctx: ArrayContext, s: Array, m: Array, l: Array) -> Array:
    """``p_ij = e^{s_ij − m_i} / ℓ_i`` from the frozen forward statistics (0 off ``A_i``)."""
    p = ctx.exp_shifted(s, safe_shift(ctx, m))
    p /= _nonzero_l(ctx, m, l)[..., None]  # in place: p is a fresh tile
    return p


def tile_gamma(ctx: ArrayContext, p: Array, dp: Array, delta: Array) -> Array:
    """``γ_ij = p_ij (dP_ij − δ_i)`` with ``dP_ij = G_i·V_j`` (times ``ρ_ij`` with dropout).

    Computed in ``dp``'s storage: the caller hands over a fresh tile it no longer reads.
    """
    dp -= delta[..., None]
    dp *= p
    return dp


def key_gradient(ctx: ArrayContext, gamma: Array, q: Array, scale: Any) -> Array:
    """This tile's ``dK_j = c Σ_i γ_ij q_i``."""
    return ctx.matmul(ctx.transpose(gamma), q) * scale


def query_gradient(ctx: ArrayContext, gamma: Array, k: Array, scale: Any) -> Array:
    """This tile's ``dQ_i = c Σ_j γ_ij k_j``."""
    return ctx.matmul(gamma, k) * scale


def value_gradient(ctx: ArrayContext, weights: Array, g: Array) -> Array:
    """This tile's ``dV_j = Σ_i p_ij ρ_ij G_i``."""
    return ctx.matmul(ctx.transpose(weights), g)


# --- the two passes -----------------------------------------------------------------------
def geometry_of(q: Array, k: Array, v: Array, enable_gqa: bool = False) -> Geometry:
    """Sizes and the logical batch ``(*B, H)``; with ``enable_gqa`` the head axis (−3) of k
    and v has ``H_kv`` heads for the ``H = g·H_kv`` of q (validated by the caller)."""
    if enable_gqa:
        lead = np.broadcast_shapes(tuple(q.shape[:-3]), tuple(k.shape[:-3]), tuple(v.shape[:-3]))
        h, h_kv = q.shape[-3], k.shape[-3]
        return Geometry(q.shape[-2], k.shape[-2], (*lead, h), h // h_kv)
    batch = np.broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2]))
    return Geometry(n_q=q.shape[-2], n_k=k.shape[-2], batch=tuple(batch))


def grouped(geometry: Geometry, q: Array, k: Array, v: Array) -> tuple[Array, Array, Array]:
    """The operands in the tile layout: q ``(…, H_kv, g, n, d)``, k, v ``(…, H_kv, 1, n, ·)``."""
    if geometry.group == 1:
        return q, k, v
    split = (*q.shape[:-3], q.shape[-3] // geometry.group, geometry.group, *q.shape[-2:])
    return q.reshape(split), k[..., None, :, :], v[..., None, :, :]


def forward(
    ctx: ArrayContext,
    q: Array,
    k: Array,
    v: Array,
    *,
    scale: Any,
    block_size: int,
    mask: Mask | None = None,
    dropout: Any = None,
    row_block: int | None = None,
    score_mod: ScoreMod | None = None,
    enable_gqa: bool = False,
    initial: Summary | None = None,
) -> tuple[Array, Summary]:
    """Fold ``⋆`` over the key blocks: returns ``Y`` (compute type) and the final summary.

    ``q, k, v`` are in the context's storage type with shapes (..., n_q, d), (..., n_k, d),
    (..., n_k, v); leading dims broadcast. ``dropout`` is ``None`` or an object with
    ``factors(ctx, flat_index, i, j) -> ρ`` tile. ``row_block``: see :func:`tiles`.
    ``score_mod``: the score modifications. The summary's ``m, ℓ`` have shape (*batch, n_q)
    (with GQA, the ``H`` query heads in order). ``initial``: the summary each row starts
    from, in the logical layout (default ⊥; an attention sink ``σ_h`` is ``(σ_h, 1, 0)``,
    one more term of the denominator, :mod:`exactattn.core.sinks`).
    """
    geometry = geometry_of(q, k, v, enable_gqa)
    q, k, v = grouped(geometry, ctx.compute(q), ctx.compute(k), ctx.compute(v))
    rows_shape = (*geometry.tile_batch, geometry.n_q)
    state = Summary(  # ⊥ for every row
        ctx.full(rows_shape, ctx.neg_inf),
        ctx.zeros(rows_shape),
        ctx.zeros((*rows_shape, v.shape[-1])),
    )
    if initial is not None:  # shaped like the result's summary
        for name in ("m", "l", "z"):
            getattr(state, name)[...] = tile_layout(geometry, getattr(initial, name))
    flat_index = geometry.flat_index(ctx) if dropout is not None else None
    for tile in tiles(ctx, mask, geometry, block_size, row_block, edge_first=True):
        rows, cols = tile.rows, tile.cols
        mod = None if score_mod is None else score_mod.at(ctx, tile.index, geometry)
        s = tile_scores(ctx, q[..., rows, :], k[..., cols, :], scale, tile.allowed, mod)
        rho = (
            None
            if dropout is None
            else dropout.factors(ctx, flat_index, tile.index.i, tile.index.j)
        )
        old = Summary(state.m[..., rows], state.l[..., rows], state.z[..., rows, :])
        running = {"floor": old.m} if ctx.running_max else {}
        block = block_summary(ctx, s, v[..., cols, :], rho, **running)
        new = merge(ctx, old, block)
        state.m[..., rows], state.l[..., rows], state.z[..., rows, :] = new.m, new.l, new.z
    merged = Summary(*(logical_layout(geometry, x) for x in (state.m, state.l, state.z)))
    return finalize(ctx, merged), merged


def logical_layout(geometry: Geometry, x: Array) -> Array:
    """Per-row state (*tile_batch, n_q, ...) back in the logical layout (*batch, n_q, ...)."""
    if geometry.group == 1:
        return x
    lead = len(geometry.tile_batch)
    return x.reshape((*geometry.batch, *x.shape[lead:]))


def tile_layout(geometry: Geometry, x: Array) -> Array:
    """Per-row arrays (*batch, n_q, ...) in the tile layout (*tile_batch, n_q, ...)."""
    if geometry.group == 1:
        return x
    lead = len(geometry.batch)
    return x.reshape((*geometry.tile_batch, *x.shape[lead:]))


def backward(
    ctx: ArrayContext,
    q: Array,
    k: Array,
    v: Array,
    y: Array,
    m: Array,
    l: Array,
    g: Array,
    *,
    scale: Any,
    block_size: int,
    mask: Mask | None = None,
    dropout: Any = None,
    row_block: int | None = None,
    score_mod: ScoreMod | None = None,
    enable_gqa: bool = False,
    mod_grads: dict[str, Array] | None = None,
    grad_lse: Array | None = None,
) -> tuple[Array, Array, Array]:
    """The block-recomputed VJP: ``(dQ, dK, dV)`` in the compute type, shaped like q, k, v.

    ``m`` and ``ℓ`` are the forward's frozen statistics (the max is never differentiated);
    ``y`` is the forward's output and ``g`` the upstream gradient ``G``. Gradients of the
    score modifications' parameters (a bias array's ``∂L/∂B = γ``) are added into the
    arrays of ``mod_grads`` (name → array shaped like the parameter), when given.
    ``grad_lse`` (shape of ``m``): an upstream gradient of ``lse`` too; since
    ``∂lse_i/∂s_ij = p_ij`` it enters as ``γ_ij = p_ij (dP_ij − (δ_i − ∂L/∂lse_i))``.
    """
    geometry = geometry_of(q, k, v, enable_gqa)
    q_shape, k_shape, v_shape = tuple(q.shape), tuple(k.shape), tuple(v.shape)
    q, k, v = grouped(geometry, ctx.compute(q), ctx.compute(k), ctx.compute(v))
    g, y, m, l = (tile_layout(geometry, x) for x in (ctx.compute(g), ctx.compute(y), m, l))
    delta = softmax_delta(ctx, g, y)
    if grad_lse is not None:
        delta = delta - tile_layout(geometry, ctx.compute(grad_lse))
    dq = ctx.zeros((*geometry.tile_batch, geometry.n_q, q.shape[-1]))
    dk = ctx.zeros(tuple(k.shape))
    dv = ctx.zeros(tuple(v.shape))
    grads = {} if mod_grads is None else mod_grads
    flat_index = geometry.flat_index(ctx) if dropout is not None else None
    for tile in tiles(ctx, mask, geometry, block_size, row_block):
        rows, cols = tile.rows, tile.cols
        q_t, g_t = q[..., rows, :], g[..., rows, :]
        k_b, v_b = k[..., cols, :], v[..., cols, :]
        mod = None if score_mod is None else score_mod.at(ctx, tile.index, geometry)
        s = tile_scores(ctx, q_t, k_b, scale, tile.allowed, mod)
        p = tile_probabilities(ctx, s, m[..., rows], l[..., rows])
        dp = ctx.matmul(g_t, ctx.transpose(v_b))
        weights = p
        if dropout is not None:
            rho = dropout.factors(ctx, flat_index, tile.index.i, tile.index.j)
            dp, weights = dp * rho, p * rho
        gamma = tile_gamma(ctx, p, dp, delta[..., rows])
        if mod is not None:
            gamma = mod.pullback(gamma, grads)
        dq[..., rows, :] += query_gradient(ctx, gamma, k_b, scale)
        dk[..., cols, :] += ctx.sum_to(key_gradient(ctx, gamma, q_t, scale), dk[..., cols, :].shape)
        dv[..., cols, :] += ctx.sum_to(value_gradient(ctx, weights, g_t), dv[..., cols, :].shape)
    if geometry.group != 1:
        dq, dk, dv = logical_layout(geometry, dq), dk[..., 0, :, :], dv[..., 0, :, :]
    return ctx.sum_to(dq, q_shape), ctx.sum_to(dk, k_shape), ctx.sum_to(dv, v_shape)
