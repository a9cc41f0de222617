"""The two passes on torch tensors, shared by the custom op and the non-op Function.

A :class:`Plan` holds everything a call decides besides the tensors (context, sizes,
``c``, ``b``, the mask ``A_i`` and its lowering, the score modifications, dropout, the
kernel choice), made by :func:`plan_for` from the prepared :class:`~exactattn.core.calls.Call`
and the mask lowered once (:func:`lower`: the kernels, ``b`` and the split into pieces all
read that one :class:`~exactattn.core.masks.Band`);
:func:`forward` gives ``(Y, lse)`` with ``lse = m + log ℓ`` and :func:`backward` gives
``(dQ, dK, dV)`` and, on request, ``dB = Σ γ`` for a bias array — the library's own
:func:`exactattn.core.algorithm.forward` / :func:`~exactattn.core.algorithm.backward` over a
:class:`~exactattn.backends.torch_backend.TorchContext`, or the Triton kernels when
:mod:`exactattn.torch.dispatch` chose them. No check runs here: rows whose ``A_i`` is empty
end at ⊥ and give ``Y = 0``, ``lse = −∞`` and zero gradients (SDPA ≥ 2.5's convention);
the strict checks are the callers' (outside any traced region).
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from ..backends.torch_backend import TorchContext
from ..core import algorithm, hvp
from ..core.calls import Call
from ..core.dropout import Dropout
from ..core.masks import Band, Geometry, Mask
from ..core.scores import ScoreMod
from . import dispatch
from .dispatch import Kernel

# Key-block size b of the generic path: the fastest on the CPU benchmark
# (`exactattn bench-torch`, docs/torch.md); any b >= 1 gives the same exact result.
DEFAULT_BLOCK_SIZE = 512
BAND_BLOCK_SIZE = 128  # the smallest default b under a window mask (see key_block_size)
# Elements of one (*batch, rows, b) score tile: the generic path runs the algorithm over
# blocks of query rows sized to this (a cache-sized tile on the CPU; large on CUDA, where
# bigger launches pay). Small problems take b above the default while the tile fits, so a
# decode step (few rows, many keys) is one tile instead of n_k / 512 of them.
TILE_ELEMENTS = {"cpu": 1 << 19, "cuda": 1 << 26}
MIN_ROW_BLOCK = 16
# A call with at least PIECE_WORK score elements (n_q·n_k summed over the heads) whose
# heads are independent runs as pieces of whole heads (:func:`pieces`), with tiles of
# PIECE_TILE elements and PIECE_ROWS query rows per head where that fits: a 1 MiB float32
# tile stays in a core's L2 cache, and 256 rows keep the GEMMs efficient (measured on the
# benchmark machine, `exactattn bench-torch`).
PIECE_WORK = 1 << 21
PIECE_TILE = 1 << 18
PIECE_ROWS = 256
# At least this many pieces (where there are as many heads): a piece's running state and
# its Y are then at most an eighth of the output each, which bounds the extra memory.
MIN_PIECES = 8


@dataclass(frozen=True)
class Plan:
    """Everything the two passes share besides the tensors."""

    ctx: TorchContext
    geometry: Geometry  # the logical sizes (heads unsplit)
    scale: Any
    block_size: int
    mask: Mask | None
    band: Band | None  # the mask lowered (no mask: Band()); None: no band says it
    score_mod: ScoreMod | None
    dropout: Dropout | None
    drop_all: bool  # dropout_p = 1: every weight dropped, Y = 0 and every gradient 0
    kernel: Kernel | None  # None: the generic path
    impl: str = "auto"  # what the caller asked for (dispatch.IMPLS)

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


def lower(mask: Mask | None, geometry: Geometry) -> Band | None:
    """``mask`` as the kernels' :class:`~exactattn.core.masks.Band` (no mask: the empty band), or
    None when no band says it: a call's one lowering, kept in its :attr:`Plan.band`."""
    return Band() if mask is None else mask.lower(geometry)


def plan_for(call: Call, band: Band | None, *, impl: str, drop_all: bool = False) -> Plan:
    """The :class:`Plan` of a prepared call whose mask lowers to ``band`` (:func:`lower`).

    ``b`` is the call's, else chosen from the sizes and ``band`` (:func:`band_block_size`);
    ``drop_all``: dropout with ``p = 1``.
    """
    q, k, v = call.arrays["q"], call.arrays["k"], call.arrays["v"]
    kernel = dispatch.kernel_plan(
        q, k, v, call.mask, band,
        dropout=call.dropout is not None, score_mod=call.score_mod,
        impl=impl, enable_gqa=call.enable_gqa,
    )  # fmt: skip
    return Plan(
        ctx=call.ctx,
        geometry=call.geometry,
        scale=call.scale,
        block_size=band_block_size(call.geometry, call.block_size, q.device, band),
        mask=call.mask,
        band=band,
        score_mod=call.score_mod,
        dropout=call.dropout,
        drop_all=drop_all,
        kernel=kernel,
        impl=impl,
    )


def key_block_size(
    geometry: Geometry, block_size: int | None, device: torch.device, mask: Mask | None = None
) -> int:
    """:func:`band_block_size` for ``mask`` (lowered here; a call's plan uses its own band)."""
    return band_block_size(geometry, block_size, device, lower(mask, geometry))


def band_block_size(
    geometry: Geometry, block_size: int | None, device: torch.device, band: Band | None
) -> int:
    """``b``: the caller's, else :data:`DEFAULT_BLOCK_SIZE` (under a window ``band``
    ``n_k / 16`` within [:data:`BAND_BLOCK_SIZE`, the default]), raised up to ``n_k``
    while a ``(*batch, n_q, b)`` tile stays within the device's :data:`TILE_ELEMENTS`.

    A window (causal) makes the tiles its edge crosses PARTIAL: about ``n_k·b`` scores per
    head are computed and then masked, against ``n_q·n_k/2`` allowed, so a window takes a
    smaller ``b``.
    """
    if block_size is not None:
        return block_size
    default = DEFAULT_BLOCK_SIZE
    if band is not None and band.has_window:
        default = min(DEFAULT_BLOCK_SIZE, max(BAND_BLOCK_SIZE, geometry.n_k // 16))
    budget = TILE_ELEMENTS.get(device.type, TILE_ELEMENTS["cuda"])
    rows = max(1, math.prod(geometry.batch)) * max(1, geometry.n_q)
    return max(default, min(geometry.n_k, budget // rows))


def row_block_size(ctx: TorchContext, geometry: Geometry, block_size: int) -> int:
    """Query rows per tile, so one ``(*batch, r, b)`` score tile fits the device's budget.

    The rows are independent in the forward and the reverse sums dK, dV over them, so the
    split changes no row's arithmetic; it keeps each tile cache-sized on the CPU.
    """
    budget = TILE_ELEMENTS.get(ctx.device.type, TILE_ELEMENTS["cuda"])
    per_row = max(1, math.prod(geometry.batch)) * min(block_size, max(geometry.n_k, 1))
    return max(MIN_ROW_BLOCK, budget // per_row)


def _generic_keywords(plan: Plan, geometry: Geometry) -> dict[str, Any]:
    return dict(
        scale=plan.scale,
        block_size=plan.block_size,
        mask=plan.mask,
        dropout=plan.dropout,
        score_mod=plan.score_mod,
        enable_gqa=plan.geometry.group != 1,
        row_block=row_block_size(plan.ctx, geometry, plan.block_size),
    )


# --- independent pieces ----------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    """One slice of the leading (batch, head) dims: an index into q (and Y, lse, dQ) and the
    matching one into k, v (and dK, dV)."""

    q: tuple[Any, ...]
    kv: tuple[Any, ...]


WHOLE = Piece((Ellipsis,), (Ellipsis,))


def splittable(plan: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the (batch, head) slices of the call are independent problems.

    They are when nothing reads ``b`` or ``h``: the mask lowers to a window on ``(i, j)``
    alone (no per-batch key lengths, dense mask or predicate), the score modifications hold
    no bias array, there is no dropout (its keep-bits read ``b·H + h``), and no leading dim
    is broadcast (dK, dV would sum across the slices).
    """
    if plan.kernel is not None or plan.dropout is not None or k.dim() < 3:
        return False
    if plan.band is None or plan.band.kv_lengths is not None:
        return False
    if plan.score_mod is not None:
        lowered = plan.score_mod.lower()
        if lowered is None or lowered.bias is not None:
            return False
    lead = -2 if plan.geometry.group == 1 else -3
    return q.shape[:lead] == k.shape[:lead] == v.shape[:lead] and k.shape[:-2] == v.shape[:-2]


def pieces(
    plan: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, threads: int
) -> list[Piece]:
    """The call as independent pieces of whole key/value heads (one piece: the whole call).

    A piece holds ``c`` consecutive heads of the last leading dim: as many as one tile of
    :data:`PIECE_TILE` elements holds with :data:`PIECE_ROWS` rows each, and no more than
    leaves :data:`MIN_PIECES` pieces and one piece per thread.
    """
    geometry, units = plan.geometry, tuple(k.shape[:-2])
    work = math.prod(geometry.batch) * geometry.n_q * geometry.n_k
    if work < PIECE_WORK or not splittable(plan, q, k, v):
        return [WHOLE]
    g, last = geometry.group, units[-1]
    rows = g * min(geometry.n_q, PIECE_ROWS) * min(plan.block_size, geometry.n_k)
    most = math.prod(units) // max(threads, MIN_PIECES)
    heads = max(1, min(PIECE_TILE // rows, last, most))
    out = []
    for outer in itertools.product(*(range(n) for n in units[:-1])):
        lead = tuple(slice(i, i + 1) for i in outer)
        for h in range(0, last, heads):
            kv = slice(h, min(h + heads, last))
            out.append(Piece((*lead, slice(kv.start * g, kv.stop * g)), (*lead, kv)))
    return out


def _piece_keywords(plan: Plan, q, k, v) -> dict[str, Any]:
    """The algorithm's keywords for one piece: its rows per tile fill :data:`PIECE_TILE`."""
    geometry = algorithm.geometry_of(q, k, v, plan.geometry.group != 1)
    per_row = math.prod(geometry.batch) * min(plan.block_size, geometry.n_k)
    keywords = _generic_keywords(plan, geometry)
    keywords["row_block"] = max(MIN_ROW_BLOCK, PIECE_TILE // per_row)
    return keywords


# --- running the pieces ------------------------------------------------------------------------
_POOL: tuple[int, ThreadPoolExecutor] | None = None
_POOL_LOCK = threading.Lock()


def _serial_worker(barrier: threading.Barrier) -> None:
    # A thread takes the process default (torch.set_num_threads) at its first parallel op:
    # take it now, then set this thread alone to one (OpenMP and MKL keep it per thread).
    torch.get_num_threads()
    torch.set_num_threads(1)
    barrier.wait()


def _workers(threads: int) -> ThreadPoolExecutor:
    """``threads`` worker threads, each running torch single-threaded (made once per count)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != threads:
            if _POOL is not None:
                _POOL[1].shutdown(wait=False)
            pool = ThreadPoolExecutor(threads, thread_name_prefix="exactattn")
            barrier = threading.Barrier(threads)  # one task per thread: every thread starts
            list(pool.map(_serial_worker, [barrier] * threads))
            torch.set_num_threads(threads)  # the workers' call set the default for new threads
            _POOL = (threads, pool)
        return _POOL[1]


def _forget_workers() -> None:
    global _POOL
    _POOL = None  # a forked child has none of its parent's threads


os.register_at_fork(after_in_child=_forget_workers)


def run_pieces(work: Callable[[Piece], None], parts: list[Piece], threads: int) -> None:
    """``work`` on every piece: here when there is one piece or one torch thread, else on
    the worker threads, one piece per thread at a time (no other synchronisation: each
    piece writes its own slices of the outputs)."""
    if len(parts) == 1 or threads == 1:
        for part in parts:
            work(part)
        return

    def task(part: Piece) -> None:
        with torch.no_grad():  # grad mode is per thread
            work(part)

    for _ in _workers(threads).map(task, parts):
        pass


def forward(plan: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, with_max=False):
    """``(Y, lse)``: ``Y`` in the inputs' dtype, ``lse`` (*batch, n_q) in the compute dtype;
    ``with_max``: ``(Y, lse, m)`` with ``m_i = max_{j∈A_i} s_ij`` (−∞ for an empty row), the
    running maximum the generic pass ends with (a plan without a kernel only)."""
    if with_max and plan.kernel is not None:
        raise ValueError("the row maxima m come from the generic pass; plan it with impl='generic'")
    with torch.no_grad():  # no graph inside the block loop
        if plan.kernel is not None:
            y, lse = dispatch.triton().triton_forward(
                q, k, v, scale=float(plan.scale), **plan.kernel_keywords()
            )
        else:
            y, lse, m = _generic_forward(plan, q, k, v)
    if plan.drop_all:
        y = torch.zeros_like(y)
    if with_max:
        return y.contiguous(), lse.contiguous(), m.contiguous()
    return y.contiguous(), lse.contiguous()


def _generic_forward(plan: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """``(Y, lse, m)`` of the algorithm, whole or in pieces."""
    ctx, threads = plan.ctx, torch.get_num_threads()
    parts = pieces(plan, q, k, v, threads)
    if parts == [WHOLE]:
        y, state = algorithm.forward(ctx, q, k, v, **_generic_keywords(plan, plan.geometry))
        return ctx.output(y), algorithm.log_sum_exp(ctx, state.m, state.l), state.m
    batch, n_q = plan.geometry.batch, plan.geometry.n_q
    y = torch.empty((*batch, n_q, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse, m = (torch.empty((*batch, n_q), dtype=ctx.compute_dtype, device=q.device) for _ in "lm")

    def work(part: Piece) -> None:
        qp, kp, vp = q[part.q], k[part.kv], v[part.kv]
        y_p, state = algorithm.forward(ctx, qp, kp, vp, **_piece_keywords(plan, qp, kp, vp))
        y[part.q] = y_p
        lse[part.q] = algorithm.log_sum_exp(ctx, state.m, state.l)
        m[part.q] = state.m

    run_pieces(work, parts, threads)
    return y, lse, m


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
            dq, dk, dv = _generic_backward(plan, q, k, v, y, lse, g, mod_grads)
    grads = tuple(ctx.output(x).contiguous() for x in (dq, dk, dv))
    return (*grads, mod_grads.get("bias"))


def _generic_backward(plan: Plan, q, k, v, y, lse, g, mod_grads: dict[str, torch.Tensor]):
    """The reverse with ``m = lse, ℓ = 1``, whole or in pieces."""
    ctx, threads = plan.ctx, torch.get_num_threads()
    parts = pieces(plan, q, k, v, threads)
    if parts == [WHOLE]:
        one = torch.ones((), dtype=lse.dtype, device=lse.device).expand(lse.shape)
        keywords = _generic_keywords(plan, plan.geometry)
        return algorithm.backward(ctx, q, k, v, y, lse, one, g, mod_grads=mod_grads, **keywords)
    dq, dk, dv = (torch.empty(x.shape, dtype=ctx.compute_dtype, device=x.device) for x in (q, k, v))

    def work(part: Piece) -> None:
        qp, kp, vp, lse_p = q[part.q], k[part.kv], v[part.kv], lse[part.q]
        one = torch.ones((), dtype=lse.dtype, device=lse.device).expand(lse_p.shape)
        keywords = _piece_keywords(plan, qp, kp, vp)
        grads = algorithm.backward(ctx, qp, kp, vp, y[part.q], lse_p, one, g[part.q], **keywords)
        dq[part.q], dk[part.kv], dv[part.kv] = grads

    run_pieces(work, parts, threads)
    return dq, dk, dv


# --- the second-order reverse ------------------------------------------------------------------
def second_order(
    plan: Plan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    y: torch.Tensor,
    lse: torch.Tensor,
    g: torch.Tensor,
    tangents: hvp.Tangents,
    bias_grad: bool,
    output_tangent: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(Ẏ, dQ̇, dK̇, dV̇, dḂ)`` along ``tangents`` (:func:`exactattn.core.hvp.hvp`, frozen
    ``m = lse, ℓ = 1``), ``dḂ`` None unless ``bias_grad``, ``Ẏ`` None unless
    ``output_tangent`` (G's cotangent: wanted only where G requires grad; it costs two tile
    products per tile): the reverse of :func:`backward`.

    Always the generic tiled pass (whole, not in pieces): the Triton kernels have no second
    derivative, but their ``Y`` and ``lse`` are the generic pass's, so a call that ran them
    (``impl='auto'``) differentiates its backward here; ``impl='triton'`` insists on the
    kernels and is refused.
    """
    if plan.impl == "triton":
        raise NotImplementedError(
            "impl='triton' has no double backward: the Triton kernels' backward is not "
            "differentiable. Pass impl='auto' or impl='generic' (the second-order reverse "
            "then runs the generic tiled pass, exactattn.core.hvp)"
        )
    ctx = plan.ctx
    mod_grads = {"bias": ctx.zeros(plan.score_mod.gradients()["bias"])} if bias_grad else {}
    if plan.drop_all:
        zeros = [torch.zeros_like(x, memory_format=torch.contiguous_format) for x in (y, q, k, v)]
        return (zeros[0] if output_tangent else None, *zeros[1:], mod_grads.get("bias"))
    mod_tangents = {} if tangents.bias is None else {"bias": ctx.compute(tangents.bias)}
    with torch.no_grad():
        out = _generic_second_order(
            plan, q, k, v, y, lse, g, tangents, mod_tangents, mod_grads, output_tangent
        )
    return (
        *(None if x is None else ctx.output(x).contiguous() for x in out),
        mod_grads.get("bias"),
    )


def _generic_second_order(
    plan: Plan, q, k, v, y, lse, g, tangents, mod_tangents, mod_grads, output_tangent: bool
):
    """``(Ẏ, dQ̇, dK̇, dV̇)`` with ``m = lse, ℓ = 1``, whole or in :func:`pieces` (as the
    reverse: whole heads on single-threaded workers, cache-sized tiles)."""
    ctx, threads = plan.ctx, torch.get_num_threads()
    parts = pieces(plan, q, k, v, threads)

    def run(qp, kp, vp, yp, lse_p, gp, tp, keywords):
        one = torch.ones((), dtype=lse.dtype, device=lse.device).expand(lse_p.shape)
        return hvp.hvp(
            ctx, qp, kp, vp, yp, lse_p, one, gp, tp, mod_tangents=mod_tangents,
            mod_grad_tangents=mod_grads, output_tangent=output_tangent, **keywords,
        )  # fmt: skip

    if parts == [WHOLE]:
        return run(q, k, v, y, lse, g, tangents, _generic_keywords(plan, plan.geometry))
    out: list[Any] = [
        torch.empty(x.shape, dtype=ctx.compute_dtype, device=x.device) for x in (y, q, k, v)
    ]
    if not output_tangent:
        out[0] = None

    def work(part: Piece) -> None:
        qp, kp, vp = q[part.q], k[part.kv], v[part.kv]
        tp = hvp.Tangents(*(
            None if x is None else x[at]
            for x, at in zip(tangents[:4], (part.q, part.kv, part.kv, part.q))
        ))  # fmt: skip
        got = run(
            qp, kp, vp, y[part.q], lse[part.q], g[part.q], tp, _piece_keywords(plan, qp, kp, vp)
        )
        for x, at, value in zip(out, (part.q, part.q, part.kv, part.kv), got):
            if x is not None:
                x[at] = value

    run_pieces(work, parts, threads)
    return tuple(out)
