"""``exactattn::attention``: the tiled attention as a real torch operator.

Two custom operators (:func:`torch.library.custom_op`), opaque to ``torch.compile``,
``torch.export`` and ``torch.func`` alike:

* ``exactattn::attention(q, k, v, allowed, bias, kv_lengths, seed, scale, left, right,
  alignment, dropout_p, softcap, enable_gqa, block_size, impl) -> (Y, lse)``
* ``exactattn::attention_backward(G, q, k, v, Y, lse, <the same>, bias_grad)
  -> (dQ, dK, dV, dB)``
* ``exactattn::attention_hvp(G, q, k, v, Y, lse, Q̄, K̄, V̄, B̄, <the same>, bias_grad,
  output_tangent) -> (Ẏ, dQ̇, dK̇, dV̇, dḂ)`` (``Ẏ`` zeros unless ``output_tangent``, asked
  for when G requires grad): the backward's own reverse (the tiled second-order pass of
  :mod:`exactattn.core.hvp`), registered as ``attention_backward``'s autograd formula, so
  ``create_graph=True`` gives exact second derivatives (a third derivative is refused).

An operator's schema takes tensors and plain scalars, so the mask crosses it lowered: the
window of a :class:`~exactattn.core.masks.Band` (``left``, ``right``, ``alignment``: causal is
``right = 0``), per-batch key lengths ``kv_lengths`` (``j < L_b``), a caller-owned boolean
``allowed`` (True = attend), all ANDed; the additive bias ``B_ij`` as a tensor (``−∞``
excludes a pair); dropout's keep-bits ``r(seed, b·H + h, i, j)`` from an int64 ``seed``
tensor (a tensor, so drawing it from torch's generator stays in the traced graph; the
reverse replays the same bits). Python predicates and bias functions cannot cross: those
calls take :mod:`exactattn.torch.function` instead.

Each operator has a fake (meta) implementation giving the output shapes, so tracing never
runs the algorithm, and a batching rule (``vmap``). The forward's autograd formula is
registered with ``register_autograd`` (for callers of ``torch.ops.exactattn.attention``),
and the same ``setup_context``/``backward`` pair also forms :class:`AttentionFunction`,
which the public functions call: ``torch.func.grad`` rejects the wrapper that
``register_autograd`` generates in torch ≤ 2.13 (pytorch/pytorch#170834) but accepts an
``autograd.Function`` with ``setup_context``.

The operators check nothing that depends on values (no graph break when traced): the
callers validate shapes and dtypes, and rows with no allowed key give ``Y = 0``,
``lse = −∞`` and zero gradients.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..backends.torch_backend import HALF_DTYPES
from ..core import calls
from ..core.dropout import Dropout
from ..core.hvp import Tangents
from ..core.masks import And, Band, Dense, Geometry, KeyPadding, Mask, SlidingWindow
from ..core.scores import Bias, Softcap, chain
from . import passes

OPTIONS = (
    "scale", "left", "right", "alignment", "dropout_p", "softcap", "enable_gqa", "block_size",
    "impl",
)  # fmt: skip
N_TENSORS = 7  # q, k, v, allowed, bias, kv_lengths, seed


@torch.library.custom_op("exactattn::attention", mutates_args=())
def attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    allowed: Tensor | None,
    bias: Tensor | None,
    kv_lengths: Tensor | None,
    seed: Tensor | None,
    scale: float | None,
    left: int | None,
    right: int | None,
    alignment: str,
    dropout_p: float,
    softcap: float | None,
    enable_gqa: bool,
    block_size: int | None,
    impl: str,
) -> tuple[Tensor, Tensor]:
    """``(Y, lse)``: ``Y_i = Σ_{j∈A_i} softmax_j(s_ij) V_j``, ``lse_i = log Σ_{j∈A_i} e^{s_ij}``."""
    plan = plan_of(
        q, k, v, allowed, bias, kv_lengths, seed,
        scale, left, right, alignment, dropout_p, softcap, enable_gqa, block_size, impl,
    )  # fmt: skip
    return passes.forward(plan, q, k, v)


@attention_op.register_fake
def _attention_fake(q, k, v, allowed, bias, kv_lengths, seed, *options):
    enable_gqa = options[OPTIONS.index("enable_gqa")]
    batch = batch_shape(q, k, v, enable_gqa)
    y = q.new_empty((*batch, q.shape[-2], v.shape[-1]))
    lse = q.new_empty((*batch, q.shape[-2]), dtype=compute_dtype(q.dtype))
    return y, lse


@torch.library.custom_op("exactattn::attention_backward", mutates_args=())
def attention_backward_op(
    grad_y: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    y: Tensor,
    lse: Tensor,
    allowed: Tensor | None,
    bias: Tensor | None,
    kv_lengths: Tensor | None,
    seed: Tensor | None,
    scale: float | None,
    left: int | None,
    right: int | None,
    alignment: str,
    dropout_p: float,
    softcap: float | None,
    enable_gqa: bool,
    block_size: int | None,
    impl: str,
    bias_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dQ, dK, dV, dB)`` at ``G`` (``dB`` is empty unless ``bias_grad``)."""
    plan = plan_of(
        q, k, v, allowed, bias, kv_lengths, seed,
        scale, left, right, alignment, dropout_p, softcap, enable_gqa, block_size, impl,
    )  # fmt: skip
    dq, dk, dv, dbias = passes.backward(plan, q, k, v, y, lse, grad_y, bias_grad)
    dbias = q.new_empty(0) if dbias is None else dbias.to(bias.dtype)
    return dq, dk, dv, dbias


@attention_backward_op.register_fake
def _attention_backward_fake(grad_y, q, k, v, y, lse, allowed, bias, kv_lengths, seed, *rest):
    bias_grad = rest[-1]
    dbias = bias.new_empty(bias.shape) if bias_grad else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias


@torch.library.custom_op("exactattn::attention_hvp", mutates_args=())
def attention_hvp_op(
    grad_y: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    y: Tensor,
    lse: Tensor,
    bar_q: Tensor | None,
    bar_k: Tensor | None,
    bar_v: Tensor | None,
    bar_bias: Tensor | None,
    allowed: Tensor | None,
    bias: Tensor | None,
    kv_lengths: Tensor | None,
    seed: Tensor | None,
    scale: float | None,
    left: int | None,
    right: int | None,
    alignment: str,
    dropout_p: float,
    softcap: float | None,
    enable_gqa: bool,
    block_size: int | None,
    impl: str,
    bias_grad: bool,
    output_tangent: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(Ẏ, dQ̇, dK̇, dV̇, dḂ)`` along the tangents ``(Q̄, K̄, V̄, B̄)`` (None: zero; ``dḂ``
    empty unless ``bias_grad``; ``Ẏ`` zeros unless ``output_tangent``, which saves two tile
    products per tile): the reverse of ``attention_backward`` at those cotangents."""
    plan = plan_of(
        q, k, v, allowed, bias, kv_lengths, seed,
        scale, left, right, alignment, dropout_p, softcap, enable_gqa, block_size, impl,
    )  # fmt: skip
    tangents = Tangents(bar_q, bar_k, bar_v, None, bar_bias)
    y_dot, dq, dk, dv, dbias = passes.second_order(
        plan, q, k, v, y, lse, grad_y, tangents, bias_grad, output_tangent
    )
    dbias = q.new_empty(0) if dbias is None else dbias.to(bias.dtype)
    return (torch.zeros_like(y) if y_dot is None else y_dot), dq, dk, dv, dbias


@attention_hvp_op.register_fake
def _attention_hvp_fake(grad_y, q, k, v, y, lse, bar_q, bar_k, bar_v, bar_bias, allowed, bias,
                        *rest):  # fmt: skip
    dbias = bias.new_empty(bias.shape) if rest[-2] else q.new_empty(0)  # rest[-2]: bias_grad
    return y.new_empty(y.shape), q.new_empty(q.shape), k.new_empty(k.shape), \
        v.new_empty(v.shape), dbias  # fmt: skip


# --- the plan inside the operators -----------------------------------------------------------
def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of ``lse`` (and of m, ℓ, z): float32 for half inputs, else their own."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def batch_shape(q: Tensor, k: Tensor, v: Tensor, enable_gqa: bool) -> tuple[Any, ...]:
    """The logical batch ``(*B, H)``: the broadcast leading dims (GQA: heads from q)."""
    if enable_gqa:
        lead = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
        return (*lead, q.shape[-3])
    return tuple(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))


def lowered_mask(
    allowed: Tensor | None,
    kv_lengths: Tensor | None,
    left: int | None,
    right: int | None,
    alignment: str,
) -> Mask | None:
    """The AND of the window, the key lengths and the dense mask the operator was given."""
    parts: list[Mask] = []
    if left is not None or right is not None:
        parts.append(SlidingWindow(left, right, alignment))
    if kv_lengths is not None:
        parts.append(KeyPadding(kv_lengths))
    if allowed is not None:
        parts.append(Dense(allowed))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else And(tuple(parts))


def lowered_band(
    allowed: Tensor | None,
    kv_lengths: Tensor | None,
    left: int | None,
    right: int | None,
    alignment: str,
    geometry: Geometry,
) -> Band | None:
    """The :class:`~exactattn.core.masks.Band` the operator's mask arguments spell, read off them
    (they are a lowered mask: nothing is lowered again), or None where no band says it — a
    dense ``allowed``, or key lengths that are not one per batch element of ``(B, H)``
    inputs (per head, or lifted by ``vmap``): what :func:`lowered_mask`'s mask lowers to."""
    if allowed is not None:
        return None
    band = Band(alignment, left, right) if left is not None or right is not None else Band()
    if kv_lengths is None:
        return band
    shape = tuple(kv_lengths.shape)
    if len(geometry.batch) != 2 or len(shape) > 2 or shape[1:] not in ((), (1,)):
        return None
    return band.intersect(Band(kv_lengths=kv_lengths.reshape(shape[:1] or (1,))))


def plan_of(
    q, k, v, allowed, bias, kv_lengths, seed,
    scale, left, right, alignment, dropout_p, softcap, enable_gqa, block_size, impl,
) -> passes.Plan:  # fmt: skip
    """The :class:`~exactattn.torch.passes.Plan` of one operator call: its arguments
    prepared unchecked (the callers checked them) and its mask's band read off them."""
    dropout = None
    if 0.0 < dropout_p < 1.0:
        dropout = Dropout(dropout_p, int(seed) % 2**64)
    call = calls.prepare(
        passes.context(q.dtype, q.device), {"q": q, "k": k, "v": v},
        scale=scale, block_size=block_size,
        mask=lowered_mask(allowed, kv_lengths, left, right, alignment),
        score_mod=chain(
            None if softcap is None else Softcap(softcap), None if bias is None else Bias(bias)
        ),
        dropout=dropout, enable_gqa=enable_gqa, checked=False,
    )  # fmt: skip
    band = lowered_band(allowed, kv_lengths, left, right, alignment, call.geometry)
    return passes.plan_for(call, band, impl=impl, drop_all=dropout_p >= 1.0)


# --- autograd: one formula, registered on the operator and as a Function -------------------
def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    q, k, v, allowed, bias, kv_lengths, seed = inputs[:N_TENSORS]
    y, lse = output
    ctx.save_for_backward(q, k, v, y, lse, allowed, bias, kv_lengths, seed)
    ctx.options = tuple(inputs[N_TENSORS:])
    ctx.mark_non_differentiable(lse)


def _backward(ctx: Any, grad_y: Tensor, grad_lse: Tensor | None) -> tuple:
    q, k, v, y, lse, allowed, bias, kv_lengths, seed = ctx.saved_tensors
    bias_grad = bias is not None and ctx.needs_input_grad[4]
    # Y and lse enter the second-order pass as constants (it differentiates through them):
    # detached, so that autograd does not run this formula again with a zero cotangent.
    y, lse = y.detach(), lse.detach()
    args = (grad_y, q, k, v, y, lse, allowed, bias, kv_lengths, seed, *ctx.options, bias_grad)
    if needs_grad(grad_y, q, k, v, bias):  # create_graph=True: recorded, with _second_order
        dq, dk, dv, dbias = AttentionBackwardFunction.apply(*args)
    else:
        dq, dk, dv, dbias = attention_backward_op(*args)
    return (dq, dk, dv, None, dbias if bias_grad else None, None, None) + (None,) * len(OPTIONS)


attention_op.register_autograd(_backward, setup_context=_setup_context)

BACKWARD_TENSORS = 10  # grad_y, q, k, v, y, lse, allowed, bias, kv_lengths, seed


def _setup_second_order(ctx: Any, inputs: tuple, output: tuple) -> None:
    ctx.save_for_backward(*inputs[:BACKWARD_TENSORS])
    ctx.options = tuple(inputs[BACKWARD_TENSORS:-1])  # the operator's options, not bias_grad
    ctx.bias_grad = inputs[-1]


def _second_order(ctx: Any, bar_q, bar_k, bar_v, bar_bias) -> tuple:
    """The reverse of ``attention_backward``: the tiled second-order pass along its
    cotangents (``Ẏ`` for G, ``dQ̇, dK̇, dV̇, dḂ`` for q, k, v and the bias)."""
    grad_y, q, k, v, y, lse, allowed, bias, kv_lengths, seed = ctx.saved_tensors
    wants_bias = bias is not None and ctx.needs_input_grad[7]
    bar_bias = bar_bias if ctx.bias_grad and bar_bias is not None and bar_bias.numel() else None
    y_dot, dq, dk, dv, dbias = attention_hvp_op(
        grad_y, q, k, v, y, lse, bar_q, bar_k, bar_v, bar_bias,
        allowed, bias, kv_lengths, seed, *ctx.options, wants_bias, ctx.needs_input_grad[0],
    )  # fmt: skip
    y_dot = y_dot if ctx.needs_input_grad[0] else None
    return (y_dot, dq, dk, dv, None, None, None, dbias if wants_bias else None) + (None,) * (
        2 + len(OPTIONS) + 1
    )


attention_backward_op.register_autograd(_second_order, setup_context=_setup_second_order)


class AttentionBackwardFunction(torch.autograd.Function):
    """``exactattn::attention_backward`` with its registered formula, as a Function (the
    backward's own reverse under torch.func, as :class:`AttentionFunction` is the forward's)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(*args: Any) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return attention_backward_op(*args)

    setup_context = staticmethod(_setup_second_order)
    backward = staticmethod(_second_order)


class AttentionFunction(torch.autograd.Function):
    """``exactattn::attention`` with its registered formula, as a Function (for torch.func)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(*args: Any) -> tuple[Tensor, Tensor]:
        return attention_op(*args)

    setup_context = staticmethod(_setup_context)
    backward = staticmethod(_backward)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    allowed: Tensor | None = None,
    bias: Tensor | None = None,
    kv_lengths: Tensor | None = None,
    seed: Tensor | None = None,
    scale: float | None = None,
    band: Band | None = None,
    dropout_p: float = 0.0,
    softcap: float | None = None,
    enable_gqa: bool = False,
    block_size: int | None = None,
    impl: str = "auto",
) -> tuple[Tensor, Tensor]:
    """``(Y, lse)`` through the operator, differentiable (validated inputs only).

    ``band`` gives the window (its ``kv_lengths`` go in ``kv_lengths``).
    """
    band = band or Band()
    args = (
        q, k, v, allowed, bias, kv_lengths, seed,
        scale, band.left, band.right, band.alignment,
        float(dropout_p), softcap, enable_gqa, block_size, impl,
    )  # fmt: skip
    if needs_grad(q, k, v, bias):
        return AttentionFunction.apply(*args)
    # No graph to record: the op alone (dynamo cannot trace a Function none of whose
    # inputs requires grad, and the call is cheaper).
    return attention_op(*args)


def needs_grad(*tensors: Tensor | None) -> bool:
    """Whether autograd records this call (true under torch.func.grad for its inputs)."""
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)


# --- vmap: the mapped axis becomes one more leading (batch) dim ------------------------------
def _leading(size: int, x: Tensor, dim: int | None, rank: int) -> Tensor:
    """``x`` with the mapped axis first and ones padded after it to ``1 + rank`` dims.

    Leading dims broadcast from the right, so the padding keeps every other axis aligned;
    an unmapped ``x`` is expanded along the new axis (no copy).
    """
    x = x.unsqueeze(0).expand(size, *x.shape) if dim is None else x.movedim(dim, 0)
    pad = rank - (x.dim() - 1)
    return x.reshape(x.shape[0], *([1] * pad), *x.shape[1:]) if pad > 0 else x


def _mapped_inputs(size: int, in_dims: tuple, tensors: tuple) -> tuple:
    """The operator's tensors with the mapped axis as a new leading batch dim."""
    q, k, v, allowed, bias, kv_lengths, seed = tensors
    if in_dims[6] is not None:
        raise ValueError("vmap over the dropout seed is not supported; map the inputs only")
    # (*batch, n, features) and (*batch, n_q, n_k) share one rank: the inputs' largest
    rank = max(x.dim() - (d is not None) for x, d in zip((q, k, v), in_dims[:3]))
    q, k, v = (_leading(size, x, d, rank) for x, d in zip((q, k, v), in_dims[:3]))
    allowed, bias = (
        None if x is None else _leading(size, x, d, rank)
        for x, d in zip((allowed, bias), in_dims[3:5])
    )
    if kv_lengths is not None:  # aligned left: the mapped axis leads the batch
        d = in_dims[5]
        kv_lengths = kv_lengths.unsqueeze(0) if d is None else kv_lengths.movedim(d, 0)
    return (q, k, v, allowed, bias, kv_lengths, seed), rank


def _unmapped_shape(x: Tensor, dim: int | None) -> tuple[int, ...]:
    return tuple(x.shape) if dim is None else tuple(x.movedim(dim, 0).shape[1:])


@attention_op.register_vmap
def _attention_vmap(info, in_dims, *args):
    tensors, _ = _mapped_inputs(info.batch_size, in_dims, args[:N_TENSORS])
    return attention_op(*tensors, *args[N_TENSORS:]), (0, 0)


@attention_backward_op.register_vmap
def _attention_backward_vmap(info, in_dims, grad_y, q, k, v, y, lse, *rest):
    size, bias_grad = info.batch_size, rest[-1]
    shapes = [_unmapped_shape(x, d) for x, d in zip((q, k, v, rest[1]), (*in_dims[1:4], in_dims[7]))
              if x is not None]  # fmt: skip
    tensors, rank = _mapped_inputs(size, (*in_dims[1:4], *in_dims[6:10]), (q, k, v, *rest[:4]))
    grad_y, y = (_leading(size, x, d, rank) for x, d in ((grad_y, in_dims[0]), (y, in_dims[4])))
    lse = _leading(size, lse, in_dims[5], rank - 1)
    grads = attention_backward_op(grad_y, *tensors[:3], y, lse, *tensors[3:], *rest[4:])
    dq, dk, dv = (g.reshape(size, *s) for g, s in zip(grads[:3], shapes))
    if bias_grad:
        return (dq, dk, dv, grads[3].reshape(size, *shapes[3])), (0, 0, 0, 0)
    return (dq, dk, dv, grads[3]), (0, 0, 0, None)
