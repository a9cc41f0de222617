"""The two passes on torch tensors, shared by the custom op and the non-op Function.

A :class:`Plan` holds everything a call decides besides the tensors (context, sizes,
``c``, ``b``, the mask ``A_i``, the score modifications, dropout, the kernel choice);
:func:`forward` gives ``(Y, lse)`` with ``lse = m + log ℓ`` and :func:`backward` gives
``(dQ, dK, dV)`` and, on request, ``dB = Σ γ`` for a bias array — the library's own
:func:`exactattn.algorithm.forward` / :func:`~exactattn.algorithm.backward` over a
:class:`~exactattn.backends.torch_backend.TorchContext`, or the Triton kernels when
:mod:`exactattn.torch.dispatch` chose them. No check runs here: rows whose ``A_i`` is empty
end at ⊥ and give ``Y = 0``, ``lse = −∞`` and zero gradients (SDPA ≥ 2.5's convention);
the strict checks are the callers' (outside any traced region).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .. import algorithm
from ..backends.torch_backend import TorchContext
from ..dropout import Dropout
from ..masks import Geometry, Mask
from ..scores import ScoreMod
from . import dispatch
from .dispatch import Kernel

# Key-block size b of the generic path: the fastest on the CPU benchmark
# (`exactattn bench-torch`, README); any b >= 1 gives the same exact result.
DEFAULT_BLOCK_SIZE = 512
# Elements of one (*batch, rows, b) score tile: the generic path runs the algorithm over
# blocks of query rows sized to this (a cache-sized tile on the CPU; large on CUDA, where
# bigger launches pay). Small problems take b above the default while the tile fits, so a
# decode step (few rows, many keys) is one tile instead of n_k / 512 of them.
TILE_ELEMENTS = {"cpu": 1 << 19, "cuda": 1 << 26}
MIN_ROW_BLOCK = 16


@dataclass(frozen=True)
class Plan:
    """Everything the two passes share besides the tensors."""

    ctx: TorchContext
    geometry: Geometry  # the logical sizes (heads unsplit)
    scale: Any
    block_size: int
    mask: Mask | None
    score_mod: ScoreMod | None
    dropout: Dropout | None
    drop_all: bool  # dropout_p = 1: every weight dropped, Y = 0 and every gradient 0
    kernel: Kernel | None  # None: the generic path

    def kernel_keywords(self) -> dict[str, Any]:
        """The Triton kernels' keywords for :attr:`kernel`: mask, softcap and bias."""
        band, scores = self.kernel.band, self.kernel.scores
        lengths = band.kv_lengths
        if lengths is not None:
            batch = self.geometry.batch[0]
            lengths = torch.as_tensor(lengths).expand(batch)
        window = (band.left, band.right) if band.has_window else None
        softcap = None if scores.softcap is None else float(scores.softcap)
        return {
            "window": window,
            "alignment": band.alignment,
            "kv_lengths": lengths,
            "softcap": softcap,
            "bias": scores.bias,
        }


_CONTEXTS: dict[tuple[torch.dtype, torch.device], TorchContext] = {}


def context(dtype: torch.dtype, device: torch.device) -> TorchContext:
    """One :class:`TorchContext` per (dtype, device): its constants are cached with it."""
    ctx = _CONTEXTS.get((dtype, device))
    if ctx is None:
        ctx = _CONTEXTS[dtype, device] = TorchContext(dtype, device=device)
    return ctx


def key_block_size(geometry: Geometry, block_size: int | None, device: torch.device) -> int:
    """``b``: the caller's, else :data:`DEFAULT_BLOCK_SIZE`, raised up to ``n_k`` while a
    ``(*batch, n_q, b)`` tile stays within the device's :data:`TILE_ELEMENTS`."""
    if block_size is not None:
        return block_size
    budget = TILE_ELEMENTS.get(device.type, TILE_ELEMENTS["cuda"])
    rows = max(1, math.prod(geometry.batch)) * max(1, geometry.n_q)
    return max(DEFAULT_BLOCK_SIZE, min(geometry.n_k, budget // rows))


def row_block_size(ctx: TorchContext, geometry: Geometry, block_size: int) -> int:
    """Query rows per tile, so one ``(*batch, r, b)`` score tile fits the device's budget.

    The rows are independent in the forward and the reverse sums dK, dV over them, so the
    split changes no row's arithmetic; it keeps each tile cache-sized on the CPU.
    """
    budget = TILE_ELEMENTS.get(ctx.device.type, TILE_ELEMENTS["cuda"])
    per_row = max(1, math.prod(geometry.batch)) * min(block_size, max(geometry.n_k, 1))
    return max(MIN_ROW_BLOCK, budget // per_row)


def _generic_keywords(plan: Plan) -> dict[str, Any]:
    return dict(
        scale=plan.scale,
        block_size=plan.block_size,
        mask=plan.mask,
        dropout=plan.dropout,
        score_mod=plan.score_mod,
        enable_gqa=plan.geometry.group != 1,
        row_block=row_block_size(plan.ctx, plan.geometry, plan.block_size),
    )


def forward(plan: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """``(Y, lse)``: ``Y`` in the inputs' dtype, ``lse`` (*batch, n_q) in the compute dtype."""
    ctx = plan.ctx
    with torch.no_grad():  # no graph inside the block loop
        if plan.kernel is not None:
            y, lse = dispatch.triton().triton_forward(
                q, k, v, scale=float(plan.scale), **plan.kernel_keywords()
            )
        else:
            y, state = algorithm.forward(ctx, q, k, v, **_generic_keywords(plan))
            y, lse = ctx.output(y), algorithm.log_sum_exp(ctx, state.m, state.l)
    if plan.drop_all:
        y = torch.zeros_like(y)
    return y.contiguous(), lse.contiguous()


def backward(
    plan: Plan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    y: torch.Tensor,
    lse: torch.Tensor,
    g: torch.Tensor,
    bias_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(dQ, dK, dV, dB)`` from ``(Y, lse)`` alone (``dB`` None unless ``bias_grad``).

    The generic reverse runs with the frozen statistics ``m = lse, ℓ = 1``:
    ``e^{s − lse} = e^{s − m}/ℓ``, and ``lse = −∞`` marks the rows at ⊥ exactly as
    ``m = −∞`` does.
    """
    ctx = plan.ctx
    if plan.drop_all:
        dbias = plan.score_mod.gradients()["bias"] if bias_grad else None
        return (
            torch.zeros_like(q, memory_format=torch.contiguous_format),
            torch.zeros_like(k, memory_format=torch.contiguous_format),
            torch.zeros_like(v, memory_format=torch.contiguous_format),
            None if dbias is None else ctx.zeros(dbias),
        )
    with torch.no_grad():
        if plan.kernel is not None:
            dq, dk, dv, *dbias = dispatch.triton().triton_backward(
                q, k, v, y, lse, g, scale=float(plan.scale), bias_grad=bias_grad,
                **plan.kernel_keywords(),
            )  # fmt: skip
            mod_grads: dict[str, torch.Tensor] = {"bias": dbias[0]} if dbias else {}
        else:
            mod_grads = {"bias": ctx.zeros(plan.score_mod.gradients()["bias"])} if bias_grad else {}
            one = torch.ones((), dtype=lse.dtype, device=lse.device).expand(lse.shape)
            dq, dk, dv = algorithm.backward(
                ctx, q, k, v, y, lse, one, g, mod_grads=mod_grads, **_generic_keywords(plan)
            )
    grads = tuple(ctx.output(x).contiguous() for x in (dq, dk, dv))
    return (*grads, mod_grads.get("bias"))
