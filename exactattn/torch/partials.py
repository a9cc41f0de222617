"""Attention with its log-sum-exp, differentiable in both, and the torch twin of the merge.

:func:`attention_with_lse` runs :func:`exactattn.attention` (any mask, score modification,
dropout, sinks, key range) on torch tensors and returns ``(Y, lse)``; its reverse is
:func:`exactattn.attention_backward` with the upstream gradients of both outputs
(``∂lse_i/∂s_ij = p_ij``, so ``∂L/∂lse`` enters as ``δ_i − ∂L/∂lse_i``) and, with sinks,
``∂L/∂σ``. With it a split of the keys can be computed and merged under autograd:

    parts = [attention_with_lse(q, k, v, key_range=r) for r in ranges]
    y, lse = merge_partials(parts)        # the fold of ⋆, made of torch operations

:func:`merge_partials` is :func:`exactattn.core.merge.merge_partials` itself: on torch tensors its
fold is differentiable as it stands.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import api
from ..core.merge import merge_partials
from .function import first_order_only

__all__ = ["attention_with_lse", "merge_partials"]


class _AttentionWithLse(torch.autograd.Function):
    """``(Y, lse)`` of :func:`exactattn.attention`; inputs ``(q, k, v, sinks, keywords)``."""

    @staticmethod
    def forward(q, k, v, sinks, keywords: dict[str, Any]):
        y, stats = api.attention(q, k, v, sinks=sinks, return_stats=True, **keywords)
        return y, stats.lse, stats.m, stats.l

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        q, k, v, sinks, keywords = inputs
        y, lse, m, l = output
        ctx.save_for_backward(q, k, v, sinks, y, lse, m, l)
        ctx.keywords = keywords
        ctx.mark_non_differentiable(m, l)

    @staticmethod
    def backward(ctx: Any, grad_y: Any, grad_lse: Any, _grad_m: Any, _grad_l: Any):
        q, k, v, sinks, y, lse, m, l = ctx.saved_tensors
        if grad_y is None:
            grad_y = torch.zeros_like(y)
        grads = api.attention_backward(
            q, k, v, y, api.Stats(m, l, lse), grad_y,
            grad_lse=grad_lse, sinks=sinks, **ctx.keywords,
        )  # fmt: skip
        dsinks = grads[3].to(sinks.dtype) if sinks is not None else None
        out = first_order_only(
            "attention_with_lse (and the sinks path of attention / the SDPA drop-in)",
            (grads[0], grads[1], grads[2], dsinks),
            (q, k, v, sinks),
        )
        return *out, None


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, sinks: Any = None, **keywords: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Y, lse)`` of :func:`exactattn.attention` on tensors, differentiable in q, k, v and
    ``sinks`` through both outputs (``lse`` in the compute dtype: float32 for half inputs).

    The keywords are :func:`exactattn.attention`'s (``mask``, ``scale``, ``softcap``,
    ``bias`` without a gradient, ``dropout_p``/``seed``, ``key_range``, ``block_size``,
    ``enable_gqa``, ``empty_rows``, ``check_finite``).
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if "return_stats" in keywords:
        raise TypeError("attention_with_lse always returns (y, lse); drop return_stats")
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        sinks = torch.as_tensor(sinks, dtype=q.dtype, device=q.device)
    y, lse, _, _ = _AttentionWithLse.apply(q, k, v, sinks, keywords)
    return y, lse
