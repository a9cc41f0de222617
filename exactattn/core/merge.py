"""Merging partial results: split the keys, attend to each part, combine by log-sum-exp.

A partial result over a key set ``I`` is the pair ``(y, lse)`` with ``y = z/ℓ`` and
``lse = m + log ℓ`` of the summary ``Σ_i(I) = (m, ℓ, z)``; the pair *is* a summary,
``(lse, 1, y)``, since ``ℓ·e^m = e^lse`` and ``z·e^m = y·e^lse`` (the homomorphism
``(m, ℓ, z) ↦ (ℓe^m, ze^m)`` of ``docs/algorithm.md``). So merging partials is the fold of
the one merge ``⋆`` of :func:`exactattn.core.algorithm.merge` over those summaries:

    Σ(I_1 ∪ … ∪ I_k) = Σ(I_1) ⋆ … ⋆ Σ(I_k)    (disjoint I_t, any order and bracketing)

followed by ``y = z/ℓ`` and ``lse = m + log ℓ``. An empty part is ``(y = 0, lse = −∞)``,
the summary ⊥. This is what FA3's ``num_splits``, FA4's ``flash_attn_combine``, xformers'
``merge_attentions`` and FlashInfer's ``merge_state`` compute. FlashInfer keeps its lse in
base 2 (``lse₂ = lse / ln 2``): pass ``lse_base=2`` and the inputs and the returned lse are
read and written in base 2; the merge itself runs in the natural base.

On torch tensors the fold is made of differentiable torch operations, so autograd flows
through ``y`` and ``lse`` of every part (:func:`exactattn.torch.merge_partials`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..backends import resolve_backend
from ..backends.protocol import Array, ArrayContext
from . import algorithm
from .algorithm import Summary

LSE_BASES = ("e", 2)


def check_lse_base(lse_base: Any) -> None:
    if isinstance(lse_base, bool) or lse_base not in LSE_BASES:
        raise ValueError(
            f"lse_base must be 'e' (natural log: flash-attn, Flex, xformers, exactattn) or 2 "
            f"(FlashInfer's merge_state); got {lse_base!r}"
        )


def partial_summary(ctx: ArrayContext, y: Array, lse: Array) -> Summary:
    """The summary ``(lse, 1, y)`` of a partial result; ``(−∞, 0, 0) = ⊥`` where lse = −∞."""
    empty = ctx.is_neg_inf(lse)
    l = ctx.where(empty, ctx.scalar(0), ctx.scalar(1))
    return Summary(lse, l + ctx.zeros(tuple(lse.shape)), ctx.where(empty[..., None], 0 * y, y))


def fold(ctx: ArrayContext, summaries: Sequence[Summary]) -> Summary:
    """``Σ_1 ⋆ Σ_2 ⋆ … ⋆ Σ_k`` left to right (⋆ is associative: any bracketing agrees)."""
    state = summaries[0]
    for summary in summaries[1:]:
        state = algorithm.merge(ctx, state, summary)
    return state


def result(ctx: ArrayContext, state: Summary) -> tuple[Array, Array]:
    """``(y, lse) = (z/ℓ, m + log ℓ)``; ``(0, −∞)`` for a row still at ⊥."""
    return algorithm.finalize(ctx, state), algorithm.log_sum_exp(ctx, state.m, state.l)


def _natural(ctx: ArrayContext, lse: Array, lse_base: Any) -> Array:
    return lse if lse_base == "e" else lse * ctx.log(ctx.scalar(2))


def _in_base(ctx: ArrayContext, lse: Array, lse_base: Any) -> Array:
    return lse if lse_base == "e" else lse / ctx.log(ctx.scalar(2))


def _check_partials(partials: Any) -> list[tuple[Any, Any]]:
    if isinstance(partials, (str, bytes)) or not isinstance(partials, Sequence):
        raise TypeError(
            "partials must be a sequence of (y, lse) pairs or Summary objects; "
            f"got {type(partials).__name__}"
        )
    if not partials:
        raise ValueError("partials is empty; give at least one (y, lse) pair")
    pairs = []
    for t, part in enumerate(partials):
        if isinstance(part, Summary):
            pairs.append(part)
            continue
        if not (isinstance(part, Sequence) and len(part) == 2):
            raise TypeError(
                f"partials[{t}] must be a (y, lse) pair or a Summary; got {type(part).__name__}"
            )
        pairs.append(tuple(part))
    return pairs


def _check_shapes(pairs: list[Any]) -> None:
    first = None
    for t, part in enumerate(pairs):
        if isinstance(part, Summary):
            y_shape, lse_shape = tuple(part.z.shape), tuple(part.m.shape)
        else:
            y_shape, lse_shape = tuple(part[0].shape), tuple(part[1].shape)
        if y_shape[:-1] != lse_shape:
            raise ValueError(
                f"partials[{t}]: y has shape {y_shape} and lse {lse_shape}; lse must be y's "
                "shape without its last axis (one lse per query row)"
            )
        if first is None:
            first = (y_shape, lse_shape)
        elif (y_shape, lse_shape) != first:
            raise ValueError(
                f"partials[{t}] has y {y_shape}, lse {lse_shape} but partials[0] has y "
                f"{first[0]}, lse {first[1]}; every part must cover the same query rows"
            )


def merge_partials(
    partials: Sequence[Any], *, lse_base: Any = "e", backend: Any = None
) -> tuple[Array, Array]:
    """Merge partial results over disjoint key sets into ``(y, lse)`` over their union.

    ``partials``: a sequence of ``(y, lse)`` pairs (``y (..., n_q, v)``, ``lse (..., n_q)``,
    as ``attention(..., return_stats=True)`` gives ``(y, stats.lse)``) or
    :class:`~exactattn.core.algorithm.Summary` ``(m, ℓ, z)`` objects, all over the same query
    rows. ``lse_base``: ``'e'`` or ``2`` for the given and returned lse (summaries are always
    natural). Returns ``(y, lse)`` with ``y = Σ_t e^{lse_t − lse} y_t`` and
    ``lse = log Σ_t e^{lse_t}``, computed as the fold of ``⋆`` (no ``e^{lse_t}`` overflows).
    """
    check_lse_base(lse_base)
    pairs = _check_partials(partials)
    _check_shapes(pairs)
    # the values pick the number system; lse, m and ℓ are statistics, read in its compute type
    named = [
        (f"partials[{t}]", p.z if isinstance(p, Summary) else p[0]) for t, p in enumerate(pairs)
    ]
    ctx = resolve_backend(backend, *named)
    with ctx.scope():
        summaries = []
        for part in pairs:
            if isinstance(part, Summary):
                m, l, z = (ctx.as_compute(x) for x in (part.m, part.l, part.z))
                summaries.append(Summary(m, l, z))
            else:
                y, lse = ctx.compute(ctx.asarray(part[0])), ctx.as_compute(part[1])
                summaries.append(partial_summary(ctx, y, _natural(ctx, lse, lse_base)))
        y, lse = result(ctx, fold(ctx, summaries))
        return ctx.output(y), _in_base(ctx, lse, lse_base)
