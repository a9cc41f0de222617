"""The non-operator path: an ``autograd.Function`` over a whole :class:`.passes.Plan`.

A custom operator's schema carries tensors and plain scalars only, so a call whose mask is
a Python predicate or ``mask_mod(b, h, i, j)``, a :class:`~exactattn.core.masks.Mask` that does
not lower to a :class:`~exactattn.core.masks.Band`, or whose bias is a function ``fn(b, h, i, j)``
cannot go through ``exactattn::attention``: it runs here, with the same two passes
(:func:`exactattn.torch.passes.forward` / :func:`~exactattn.torch.passes.backward`).
Eager autograd and ``torch.func.grad`` work (``setup_context``); ``torch.compile`` traces
into the Python mask code instead of treating the call as one opaque operator. The backward
is itself a Function (:class:`TiledBackward`), whose own backward is the tiled second-order
reverse (:func:`exactattn.torch.passes.second_order`), so ``create_graph=True`` gives exact
second derivatives.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.hvp import Tangents
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
        ctx.save_for_backward(q, k, v, y, lse, bias)
        ctx.plan = plan
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.mark_non_differentiable(lse)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor, grad_lse: Any):
        q, k, v, y, lse, bias = ctx.saved_tensors
        bias_grad = ctx.bias_dtype is not None and ctx.needs_input_grad[3]
        y, lse = y.detach(), lse.detach()  # constants of the second order (see TiledBackward)
        dq, dk, dv, dbias = TiledBackward.apply(grad_y, q, k, v, y, lse, bias, ctx.plan, bias_grad)
        return dq, dk, dv, (dbias.to(ctx.bias_dtype) if bias_grad else None), None


class TiledBackward(torch.autograd.Function):
    """``(dQ, dK, dV, dB)`` of :class:`TiledAttention` at ``G``, differentiable once more.

    Inputs ``(G, q, k, v, Y, lse, bias, plan, bias_grad)``. Its reverse at the cotangents
    ``(Q̄, K̄, V̄, B̄)`` is the second-order reverse with them as the tangents (the Hessian of
    ``Σ G∘Y`` in ``(q, k, v, B)`` is symmetric): ``(dQ̇, dK̇, dV̇, dḂ)`` for ``(q, k, v,
    bias)`` and ``Ẏ`` for ``G``. ``Y`` and ``lse`` come detached and get none: the
    second-order reverse differentiates through them already (they are functions of q, k,
    v and the bias), and an edge to the forward would run its reverse again at a zero
    cotangent.
    """

    @staticmethod
    def forward(grad_y, q, k, v, y, lse, bias, plan: passes.Plan, bias_grad: bool):
        return passes.backward(plan, q, k, v, y, lse, grad_y, bias_grad)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        grad_y, q, k, v, y, lse, bias, plan, bias_grad = inputs
        ctx.save_for_backward(grad_y, q, k, v, y, lse)
        ctx.plan, ctx.bias_grad = plan, bias_grad
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.set_materialize_grads(False)  # a cotangent never given is a zero tangent, skipped

    @staticmethod
    def backward(ctx: Any, bar_q: Any, bar_k: Any, bar_v: Any, bar_bias: Any):
        grad_y, q, k, v, y, lse = ctx.saved_tensors
        tangents = Tangents(bar_q, bar_k, bar_v, None, bar_bias if ctx.bias_grad else None)
        wants_bias = ctx.bias_dtype is not None and ctx.needs_input_grad[6]
        y_dot, dq, dk, dv, dbias = passes.second_order(
            ctx.plan, q, k, v, y, lse, grad_y, tangents, bias_grad=wants_bias,
            output_tangent=ctx.needs_input_grad[0],
        )  # fmt: skip
        dbias = dbias.to(ctx.bias_dtype) if wants_bias else None
        return y_dot, dq, dk, dv, None, None, dbias, None, None


class _FirstOrderOnly(torch.autograd.Function):
    """The identity on a backward's gradients, whose own reverse refuses, naming the path.

    Inputs ``(path, n, *grads, *anchors)``: the ``n`` gradients, then the tensors they are
    gradients of (inputs that require grad, so that autograd records this node)."""

    @staticmethod
    def forward(ctx: Any, path: str, n: int, *tensors: Any) -> tuple:
        ctx.path = path
        return tuple(g.clone() for g in tensors[:n])

    @staticmethod
    def backward(ctx: Any, *bars: Any) -> tuple:
        raise NotImplementedError(
            f"{ctx.path} has no double backward. exactattn.torch.attention, "
            "exactattn.torch.scaled_dot_product_attention and torch.ops.exactattn.attention "
            "have one (create_graph=True), as has exactattn.attention_hvp on arrays"
        )


def first_order_only(path: str, grads: tuple, anchors: tuple) -> tuple:
    """``grads`` as they are; under ``create_graph=True`` (grad mode on in the backward)
    differentiating them raises a NotImplementedError naming ``path`` and the entry points
    that have a double backward. ``anchors``: the tensors they are gradients of."""
    anchors = tuple(a for a in anchors if isinstance(a, torch.Tensor) and a.requires_grad)
    if not torch.is_grad_enabled() or not anchors:
        return grads
    tensors = [n for n, g in enumerate(grads) if isinstance(g, torch.Tensor)]
    passed = _FirstOrderOnly.apply(path, len(tensors), *(grads[n] for n in tensors), *anchors)
    out = list(grads)
    for n, g in zip(tensors, passed):
        out[n] = g
    return tuple(out)
