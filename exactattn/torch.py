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
from .masks import Band, Geometry, Mask, as_mask, causal

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
class _Plan:
    """Everything the two passes share besides the tensors."""

    ctx: TorchContext
    geometry: Geometry  # the logical sizes (heads unsplit)
    scale: Any
    block_size: int
    mask: Mask | None
    dropout: Dropout | None
    empty_rows: str
    check_finite: bool
    kernel: Band | None  # None: the generic path

    def kernel_keywords(self) -> dict[str, Any]:
        """The Triton kernels' mask keywords for :attr:`kernel`."""
        band = self.kernel
        lengths = band.kv_lengths
        if lengths is not None:
            batch = self.geometry.batch[0]
            lengths = torch.as_tensor(lengths).expand(batch)
        window = (band.left, band.right) if band.has_window else None
        return {"window": window, "alignment": band.alignment, "kv_lengths": lengths}


class _TiledAttention(torch.autograd.Function):
    """``Y = softmax(c·Q Kᵀ on A_i) V`` with the block-recomputed reverse as its VJP."""

    @staticmethod
    def forward(fctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Plan):
        with torch.no_grad():  # no graph inside the block loop
            if plan.kernel is not None:
                y, lse = _triton().triton_forward(
                    q, k, v, scale=float(plan.scale), **plan.kernel_keywords()
                )
            else:
                y, lse = _generic_forward(plan, q, k, v)
        validation.check_empty_rows(plan.ctx, lse, plan.empty_rows, plan.mask, plan.geometry)
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
                q, k, v, y, lse, g, scale=float(plan.scale), **plan.kernel_keywords()
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


def _generic_keywords(plan: _Plan) -> dict[str, Any]:
    return dict(
        scale=plan.scale,
        block_size=plan.block_size,
        mask=plan.mask,
        dropout=plan.dropout,
        enable_gqa=plan.geometry.group != 1,
        row_block=row_block_size(plan.ctx, plan.geometry, plan.block_size),
    )


def _generic_forward(plan: _Plan, q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Y, lse)`` by :func:`exactattn.algorithm.forward`."""
    ctx = plan.ctx
    y, state = algorithm.forward(ctx, q, k, v, **_generic_keywords(plan))
    return ctx.output(y), algorithm.log_sum_exp(ctx, state.m, state.l)


def _generic_backward(plan: _Plan, q, k, v, y, lse, g) -> tuple[torch.Tensor, ...]:
    """``(dQ, dK, dV)`` by :func:`exactattn.algorithm.backward` from ``(Y, lse)`` alone.

    The frozen statistics are ``m = lse, ℓ = 1``: ``e^{s − lse} = e^{s − m}/ℓ``, and
    ``lse = −∞`` marks the rows at ⊥ exactly as ``m = −∞`` does.
    """
    ctx = plan.ctx
    one = torch.ones((), dtype=lse.dtype, device=lse.device).expand(lse.shape)
    grads = algorithm.backward(ctx, q, k, v, y, lse, one, g, **_generic_keywords(plan))
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
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool; got {enable_gqa!r}")
    validation.check_policy(empty_rows)
    ctx = TorchContext(q.dtype, device=q.device)
    mask = as_mask(mask)
    mask = None if mask is None else mask.adopt(ctx)
    if is_causal:
        mask = causal() if mask is None else mask & causal()
    geometry = validation.check_qkv(q, k, v, enable_gqa)
    if mask is not None:
        mask.validate(geometry)
    if check_finite:
        for name, x in (("q", q), ("k", k), ("v", v)):
            validation.check_finite(ctx, name, x)
    dropout = make_dropout(dropout_p, seed)
    scale = validation.check_scale(ctx, scale, q.shape[-1])
    block_size = validation.check_block_size(block_size, DEFAULT_BLOCK_SIZE)
    kernel = _kernel_plan(q, k, v, mask, geometry, dropout, impl, enable_gqa)
    plan = _Plan(ctx, geometry, scale, block_size, mask, dropout, empty_rows, check_finite, kernel)
    return _TiledAttention.apply(q, k, v, plan)


# --- input checks -------------------------------------------------------------------------
def _check_tensors(q: Any, k: Any, v: Any) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")


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


def _kernel_plan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Mask | None,
    geometry: Geometry,
    dropout: Dropout | None,
    impl: str,
    enable_gqa: bool,
) -> Band | None:
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
    band = None
    if not reasons:
        band = Band() if mask is None else mask.lower(geometry)
        if band is None:
            reasons.append(f"the mask {type(mask).__name__}")
    if not reasons and not _triton_available():
        reasons.append("triton is not importable")
    if reasons and impl == "triton":
        raise ValueError(f"impl='triton' cannot run this call: {', '.join(reasons)}")
    return None if reasons else band
