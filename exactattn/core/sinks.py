"""Attention sinks: one learned logit ``σ_h`` per head, in the softmax's denominator only.

gpt-oss, FA4's ``learnable_sink`` and FlashInfer's ``sinks`` add to every row's softmax one
more term with score ``σ_h`` and value 0:

    Y_i = Σ_{j∈A_i} e^{s_ij} V_j / (e^{σ_h} + Σ_{j∈A_i} e^{s_ij}),
    lse_i = log(e^{σ_h} + Σ_{j∈A_i} e^{s_ij}).

The sink is one more term of the summary: each row starts at ``(m, ℓ, z) = (σ_h, 1, 0)``
instead of ⊥ (``algorithm.forward(initial=…)``), or, equivalently, the result is merged
with the partial ``(y = 0, lse = σ_h)``. A row with no allowed key then has ``lse = σ_h``
and ``Y = 0``. The reverse is the algorithm's reverse with the statistics ``(m, ℓ)`` that
include the sink: the sink's value is 0, so ``δ_i = G_i·Y_i`` still equals
``Σ_j p_ij G_i·V_j`` and ``γ`` is unchanged; the sink's own gradient is

    ∂L/∂σ_h = −Σ_{b, i} p_{σ,i} δ_i,   p_{σ,i} = e^{σ_h − m_i} / ℓ_i.
"""

from __future__ import annotations

from typing import Any

from ..backends.protocol import Array, ArrayContext
from . import algorithm
from .algorithm import Summary
from .masks import Geometry


def check_sinks(ctx: ArrayContext, sinks: Any, geometry: Geometry, check_finite: bool) -> Array:
    """``sinks`` as a compute array of shape ``(H,)``, one logit per query head."""
    try:
        arr = ctx.as_compute(sinks)
    except TypeError as error:
        raise TypeError(f"sinks: {error}") from None
    if tuple(arr.shape) != (geometry.heads,):
        raise ValueError(
            f"sinks has shape {tuple(arr.shape)}; give one logit per query head, shape "
            f"({geometry.heads},) for inputs with batch {geometry.batch}"
        )
    if check_finite and not ctx.all_finite(arr):
        raise ValueError("sinks has NaN or infinite entries; a sink logit must be finite")
    return arr


def sink_rows(ctx: ArrayContext, sinks: Array, rows_shape: tuple[int, ...]) -> Array:
    """``σ_h`` at every row position ``(*batch, n_q)`` (the head axis is the batch's last)."""
    column = sinks[:, None] if len(rows_shape) > 1 else sinks  # no batch: H = 1, rows only
    return ctx.broadcast_to(column, rows_shape) + ctx.zeros(rows_shape)


def initial_summary(ctx: ArrayContext, sinks: Array, geometry: Geometry, v_dim: int) -> Summary:
    """``(σ_h, 1, 0)`` for every row: the summary of the sink alone."""
    rows_shape = (*geometry.batch, geometry.n_q)
    m = sink_rows(ctx, sinks, rows_shape)
    return Summary(m, ctx.zeros(rows_shape) + ctx.scalar(1), ctx.zeros((*rows_shape, v_dim)))


def add_sinks(ctx: ArrayContext, y: Array, m: Array, l: Array, sinks: Array):
    """``(Y, m, ℓ)`` of a result without the sink, merged with the sink's ``(σ_h, 1, 0)``."""
    summary = Summary(m, l, y * l[..., None])
    sink = Summary(sink_rows(ctx, sinks, tuple(m.shape)), 0 * l + ctx.scalar(1), 0 * y)
    merged = algorithm.merge(ctx, summary, sink)
    return algorithm.finalize(ctx, merged), merged.m, merged.l


def sink_gradient(
    ctx: ArrayContext, sinks: Array, y: Array, g: Array, m: Array, l: Array, grad_lse: Any = None
) -> Array:
    """``∂L/∂σ_h = −Σ_{b,i} e^{σ_h − m_i}/ℓ_i · δ_i`` from the statistics with the sink.

    With an upstream ``∂L/∂lse`` (``∂lse_i/∂σ_h = p_{σ,i}``), ``δ_i`` becomes
    ``δ_i − ∂L/∂lse_i``, as for the scores.
    """
    delta = algorithm.softmax_delta(ctx, ctx.compute(g), ctx.compute(y))
    if grad_lse is not None:
        delta = delta - ctx.compute(grad_lse)
    p_sink = ctx.exp(sink_rows(ctx, sinks, tuple(m.shape)) - m) / l
    terms = -(p_sink * delta)  # (*batch, n_q) with the head axis last of batch
    per_head = ctx.rowsum(terms)  # (*batch,)
    return ctx.sum_to(per_head.reshape((-1, sinks.shape[0])), (sinks.shape[0],))
