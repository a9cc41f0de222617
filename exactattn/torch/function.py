"""The non-operator path: an ``autograd.Function`` over a whole :class:`.passes.Plan`.

A custom operator's schema carries tensors and plain scalars only, so a call whose mask is
a Python predicate or ``mask_mod(b, h, i, j)``, a :class:`~exactattn.core.masks.Mask` that does
not lower to a :class:`~exactattn.core.masks.Band`, or whose bias is a function ``fn(b, h, i, j)``
cannot go through ``exactattn::attention``: it runs here, with the same two passes
(:func:`exactattn.torch.passes.forward` / :func:`~exactattn.torch.passes.backward`).
Eager autograd and ``torch.func.grad`` work (``setup_context``); ``torch.compile`` traces
into the Python mask code instead of treating the call as one opaque operator.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from . import passes


class TiledAttention(torch.autograd.Function):
    """``(Y, lse)`` with ``Y = softmax(mod(c·Q Kᵀ) on A_i) V`` and the block-recomputed VJP.

    Inputs ``(q, k, v, bias, plan)``: ``bias`` is the tensor behind the plan's bias (or
    None), an input so that autograd can deliver ``dB``.
    """

    @staticmethod
    def forward(q, k, v, bias, plan: passes.Plan):
        return passes.forward(plan, q, k, v)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        q, k, v, bias, plan = inputs
        y, lse = output
        ctx.save_for_backward(q, k, v, y, lse)
        ctx.plan = plan
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.mark_non_differentiable(lse)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_y: torch.Tensor, grad_lse: Any):
        q, k, v, y, lse = ctx.saved_tensors
        bias_grad = ctx.bias_dtype is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dbias = passes.backward(ctx.plan, q, k, v, y, lse, grad_y, bias_grad)
        return dq, dk, dv, (dbias.to(ctx.bias_dtype) if bias_grad else None), None
