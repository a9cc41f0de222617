"""``exactattn.torch.attention``: the tiled algorithm as a differentiable torch op.

A drop-in for ``torch.nn.functional.scaled_dot_product_attention`` (same shapes
``(..., H, n, d)``, ``is_causal`` top-left aligned, boolean ``attn_mask`` with True =
attend, ``scale``, ``enable_gqa``) whose two passes are the library's own:

* forward — :func:`exactattn.algorithm.forward` over a
  :class:`~exactattn.backends.torch_backend.TorchContext` (fold of ``⋆`` over the key
  blocks ``J_t``), run without recording an autograd graph; it saves only
  ``q, k, v, Y`` and ``lse = m + log ℓ``;
* backward — :func:`exactattn.algorithm.backward`, the block-recomputed reverse with the
  frozen statistics ``m = lse, ℓ = 1`` (then ``p_ij = e^{s_ij − lse_i}``, exactly the
  forward's ``e^{s_ij − m_i}/ℓ_i``), ``δ_i = G_i·Y_i`` and
  ``γ_ij = p_ij (G_i·V_j − δ_i)``.

On CUDA, when the mask is one the Triton kernels express (causal, a sliding window,
per-batch key lengths, or their conjunction) and there is no dropout, both passes run
:mod:`exactattn.triton_kernels` instead (FlashAttention-2 kernels, compared against the
generic code in the tests and ``gpu/check.py``); every other case takes the generic path.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from .optional import needs

with needs("exactattn.torch"):
    import torch
    from torch.autograd.function import once_differentiable

from . import algorithm, validation
from .backends.torch_backend import TorchContext
from .dropout import Dropout, make_dropout
from .masks import (
    And,
    Dense,
    Geometry,
    KeyPadding,
    Mask,
    Or,
    SlidingWindow,
    as_mask,
    causal,
)

__all__ = ["DEFAULT_BLOCK_SIZE", "attention"]

# Key-block size b of the generic path: the fastest on the CPU benchmark
# (`exactattn bench-torch`, README); any b >= 1 gives the same exact result.
DEFAULT_BLOCK_SIZE = 512
# Elements of one (*batch, rows, b) score tile: the generic path runs the algorithm over
# blocks of query rows sized to this (a cache-sized tile on the CPU; large on CUDA, where
# bigger launches pay).
TILE_ELEMENTS = {"cpu": 1 << 19, "cuda": 1 << 26}
MIN_ROW_BLOCK = 16
IMPLS = ("auto", "generic", "triton")


@dataclass(frozen=True)
class KernelArgs:
    """The mask as the Triton kernels' keyword arguments."""

    causal: str | None = None
    window: tuple[int | None, int | None] | None = None
    alignment: str | None = None
    kv_lengths: torch.Tensor | None = None

    def keywords(self) -> dict[str, Any]:
        return {
            "causal": self.causal,
            "window": self.window,
            "alignment": self.alignment,
            "kv_lengths": self.kv_lengths,
        }


@dataclass(frozen=True)
class _Plan:
    """Everything the two passes share besides the tensors."""

    ctx: TorchContext
    scale: Any
    block_size: int
    mask: Mask | None
    dropout: Dropout | None
    empty_rows: str
    check_finite: bool
    kernel: KernelArgs | None  # None: the generic path


class _TiledAttention(torch.autograd.Function):
    """``Y = softmax(c·Q Kᵀ on A_i) V`` with the block-recomputed reverse as its VJP."""

    @staticmethod
    def forward(fctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Plan):
        with torch.no_grad():  # no graph inside the block loop
            if plan.kernel is not None:
                y, lse = _triton().triton_forward(
                    q, k, v, scale=float(plan.scale), **plan.kernel.keywords()
                )
            else:
                y, lse = _generic_forward(plan, q, k, v)
        geometry = Geometry(q.shape[-2], k.shape[-2], tuple(lse.shape[:-1]))
        validation.check_empty_rows(plan.ctx, lse, plan.empty_rows, plan.mask, geometry)
        if plan.check_finite:  # finite inputs, so a non-finite y overflowed
            validation.check_output(plan.ctx, "y", y)
        fctx.save_for_backward(q, k, v, y, lse)
        fctx.plan = plan
        return y

    @staticmethod
    @once_differentiable
    def backward(fctx: Any, g: torch.Tensor):
        q, k, v, y, lse = fctx.saved_tensors
        plan: _Plan = fctx.plan
        if plan.kernel is not None:
            grads = _triton().triton_backward(
                q, k, v, y, lse, g, scale=float(plan.scale), **plan.kernel.keywords()
            )
        else:
            grads = _generic_backward(plan, q, k, v, y, lse, g)
        return (*grads, None)


# --- the generic path ----------------------------------------------------------------------
def row_block_size(ctx: TorchContext, geometry: Geometry, block_size: int) -> int:
    """Query rows per tile, so one ``(*batch, r, b)`` score tile fits the device's budget.

    The rows are independent in the forward and the reverse sums dK, dV over them, so the
    split changes no row's arithmetic; it keeps each tile cache-sized on the CPU.
    """
    budget = TILE_ELEMENTS.get(ctx.device.type, TILE_ELEMENTS["cuda"])
    per_row = max(1, math.prod(geometry.batch)) * min(block_size, max(geometry.n_k, 1))
    return max(MIN_ROW_BLOCK, budget // per_row)


def _generic_forward(plan: _Plan, q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Y, lse)`` by :func:`exactattn.algorithm.forward`."""
    ctx = plan.ctx
    row_block = row_block_size(ctx, algorithm.geometry_of(q, k, v), plan.block_size)
    y, state = algorithm.forward(
        ctx, q, k, v, scale=plan.scale, block_size=plan.block_size, mask=plan.mask,
        dropout=plan.dropout, row_block=row_block,
    )  # fmt: skip
    return ctx.output(y), algorithm.log_sum_exp(ctx, state.m, state.l)


def _generic_backward(plan: _Plan, q, k, v, y, lse, g) -> tuple[torch.Tensor, ...]:
    """``(dQ, dK, dV)`` by :func:`exactattn.algorithm.backward` from ``(Y, lse)`` alone.

    The frozen statistics are ``m = lse, ℓ = 1``: ``e^{s − lse} = e^{s − m}/ℓ``, and
    ``lse = −∞`` marks the rows at ⊥ exactly as ``m = −∞`` does.
    """
    ctx = plan.ctx
    one = torch.ones((), dtype=lse.dtype, device=lse.device).expand(lse.shape)
    row_block = row_block_size(ctx, algorithm.geometry_of(q, k, v), plan.block_size)
    grads = algorithm.backward(
        ctx, q, k, v, y, lse, one, g, scale=plan.scale, block_size=plan.block_size,
        mask=plan.mask, dropout=plan.dropout, row_block=row_block,
    )  # fmt: skip
    return tuple(ctx.output(grad) for grad in grads)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    block_size: int | None = None,
    scale: float | None = None,
    mask: Any = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    seed: int | None = None,
    enable_gqa: bool = False,
    empty_rows: str = "error",
    check_finite: bool = True,
    impl: str = "auto",
) -> torch.Tensor:
    """Exact softmax attention ``Y_i = Σ_{j∈A_i} softmax_j(c·q_i·k_j) V_j``, differentiable.

    Shapes as SDPA: ``q (..., H, n_q, d)``, ``k (..., H_kv, n_k, d)``,
    ``v (..., H_kv, n_k, v)``; without ``enable_gqa`` the leading dims broadcast. ``scale``
    is ``c`` (default ``1/sqrt(d)``); ``block_size`` is the key-block size ``b`` of the
    generic path (any ``b >= 1`` gives the same exact result). ``mask`` is an
    :class:`~exactattn.masks.Mask`, a boolean tensor or array broadcastable to
    ``(..., H, n_q, n_k)`` (True = attend, SDPA's boolean ``attn_mask``), or a predicate
    ``(i, j) -> bool tensor`` on index tensors; ``is_causal`` adds the top-left causal mask
    ``j ≤ i`` (combined with ``mask`` by AND). ``dropout_p > 0`` needs ``seed``: the
    keep-bits are a pure function of (seed, batch·head, i, j), replayed in the backward.
    ``enable_gqa``: ``H`` is a multiple of ``H_kv`` and query head ``h`` reads key/value
    head ``h // (H / H_kv)``. ``empty_rows='zero'`` gives rows with no allowed key
    ``Y = 0`` and zero gradients (default: ValueError). ``impl``: ``'auto'`` runs the
    Triton kernels on CUDA when they express the call, ``'generic'`` always runs
    :mod:`exactattn.algorithm`, ``'triton'`` insists on the kernels (on the CPU only under
    ``TRITON_INTERPRET=1``).
    """
    _check_tensors(q, k, v)
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}; got {impl!r}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool; got {is_causal!r}")
    validation.check_policy(empty_rows)
    ctx = TorchContext(q.dtype, device=q.device)
    mask = as_mask(mask)
    mask = None if mask is None else mask.adopt(ctx)
    if is_causal:
        mask = causal() if mask is None else mask & causal()
    heads = _check_gqa(q, k, v) if enable_gqa else None
    # The generic path's operands: with GQA, (..., H, n, d) -> (..., H_kv, g, n, d), so
    # broadcasting groups the query heads and the reverse's sum_to adds each group's dK,
    # dV into its key/value head.
    gq, gk, gv, gmask = q, k, v, mask
    if heads is not None:
        gq, gk, gv = q.unflatten(-3, heads), k.unsqueeze(-3), v.unsqueeze(-3)
        gmask = _split_heads(mask, *heads)
    geometry = validation.check_qkv(gq, gk, gv)
    if gmask is not None:
        gmask.validate(geometry)
    if check_finite:
        for name, x in (("q", q), ("k", k), ("v", v)):
            validation.check_finite(ctx, name, x)
    dropout = make_dropout(dropout_p, seed)
    scale = validation.check_scale(ctx, scale, q.shape[-1])
    block_size = validation.check_block_size(block_size, DEFAULT_BLOCK_SIZE)
    kernel = _kernel_plan(q, k, v, mask, dropout, impl, enable_gqa)
    if kernel is not None:
        plan = _Plan(ctx, scale, block_size, mask, dropout, empty_rows, check_finite, kernel)
        return _TiledAttention.apply(q, k, v, plan)
    plan = _Plan(ctx, scale, block_size, gmask, dropout, empty_rows, check_finite, None)
    y = _TiledAttention.apply(gq, gk, gv, plan)
    return y.flatten(-4, -3) if heads is not None else y


# --- input checks -------------------------------------------------------------------------
def _check_tensors(q: Any, k: Any, v: Any) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")


def _check_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int]:
    """``(H_kv, g)`` for grouped heads: ``H = g·H_kv``, heads on axis −3 of q, k and v."""
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if min(q.dim(), k.dim(), v.dim()) < 3:
        raise ValueError(f"enable_gqa needs a head axis (..., H, n, d); got {shapes}")
    h, h_kv = q.shape[-3], k.shape[-3]
    if v.shape[-3] != h_kv or h_kv == 0 or h % h_kv:
        raise ValueError(
            f"enable_gqa needs k and v with H_kv heads where H_kv divides the H query heads; "
            f"got {shapes}"
        )
    return h_kv, h // h_kv


# --- masks on the tensors' device ---------------------------------------------------------
def _split_axis(x: torch.Tensor, axis: int, h_kv: int, group: int) -> torch.Tensor:
    """Axis of size H becomes (H_kv, g); a broadcast axis of size 1 becomes (1, 1)."""
    if x.shape[axis] == 1:
        return x.unsqueeze(axis)
    return x.unflatten(axis, (h_kv, group))


def _split_heads(mask: Mask | None, h_kv: int, group: int) -> Mask | None:
    """The same mask over the grouped batch shape (..., H_kv, g) instead of (..., H)."""
    if isinstance(mask, Dense) and mask.allowed.dim() >= 3:
        return Dense(_split_axis(mask.allowed, -3, h_kv, group))
    if isinstance(mask, KeyPadding):
        # lengths align with the leading batch dims; only the last of those is the head axis
        lengths = mask.lengths
        return mask if lengths.dim() < 2 else KeyPadding(_split_axis(lengths, -1, h_kv, group))
    if isinstance(mask, (And, Or)):
        return type(mask)(tuple(_split_heads(part, h_kv, group) for part in mask.parts))
    return mask


# --- the Triton dispatch ------------------------------------------------------------------
@functools.cache
def _triton() -> Any:
    from . import triton_kernels

    return triton_kernels


def _triton_available() -> bool:
    try:
        _triton()
    except Exception:  # no triton, or no driver it can use
        return False
    return True


def kernel_args(mask: Mask | None, batch: tuple[int, ...]) -> KernelArgs | None:
    """The Triton kernels' arguments for ``mask``, or None when they cannot express it.

    Expressible: no mask, one :class:`SlidingWindow` (causal is ``right = 0`` with no left
    bound), one :class:`KeyPadding` whose lengths do not vary across heads, and the
    conjunction of one of each. ``batch`` is ``(B, H)``.
    """
    parts = [] if mask is None else list(_conjuncts(mask))
    if any(p is None for p in parts):
        return None
    windows = [p for p in parts if isinstance(p, SlidingWindow)]
    paddings = [p for p in parts if isinstance(p, KeyPadding)]
    if len(windows) > 1 or len(paddings) > 1 or len(windows) + len(paddings) != len(parts):
        return None
    args: dict[str, Any] = {}
    if windows:
        w = windows[0]
        if w.left is None and w.right == 0:
            args["causal"] = w.alignment
        else:
            args["window"], args["alignment"] = (w.left, w.right), w.alignment
    if paddings:
        lengths = torch.as_tensor(paddings[0].lengths)
        shape = tuple(lengths.shape) + (1,) * (len(batch) - lengths.dim())
        if len(shape) == len(batch) and shape[-1] != 1:
            return None  # lengths that differ per head
        args["kv_lengths"] = lengths.reshape(shape).expand(*batch[:-1], 1)[..., 0].reshape(-1)
    return KernelArgs(**args)


def _conjuncts(mask: Mask) -> Any:
    if isinstance(mask, And):
        for part in mask.parts:
            yield from _conjuncts(part)
    elif isinstance(mask, (SlidingWindow, KeyPadding)):
        yield mask
    else:
        yield None


def _kernel_plan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Mask | None,
    dropout: Dropout | None,
    impl: str,
    enable_gqa: bool,
) -> KernelArgs | None:
    """Kernel arguments when this call runs the Triton kernels, else None."""
    if impl == "generic" or (impl == "auto" and q.device.type != "cuda"):
        return None
    reasons = []
    if dropout is not None:
        reasons.append("dropout")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        reasons.append(f"dtype {q.dtype}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        reasons.append("inputs that are not (B, H, n, d)")
    elif (
        q.shape[0] != k.shape[0]
        or k.shape[:2] != v.shape[:2]
        or (not enable_gqa and q.shape[1] != k.shape[1])
    ):
        reasons.append("broadcast batch or head dims")
    if max(q.shape[-1], v.shape[-1]) > 256:
        reasons.append("head dims above 256")
    args = None if reasons or q.dim() != 4 else kernel_args(mask, tuple(q.shape[:2]))
    if args is None and not reasons:
        reasons.append(f"the mask {type(mask).__name__}")
    if not reasons and not _triton_available():
        reasons.append("triton is not importable")
    if reasons and impl == "triton":
        raise ValueError(f"impl='triton' cannot run this call: {', '.join(reasons)}")
    if args is not None and args.kv_lengths is not None:
        args = KernelArgs(args.causal, args.window, args.alignment, args.kv_lengths.to(q.device))
    return None if reasons else args
