"""``exactattn.torch.flex_attention``: FlexAttention's function, exact, with a CPU backward.

Same signature and semantics as ``torch.nn.attention.flex_attention.flex_attention`` (torch
2.13): inputs ``(B, H, L, E)``, ``(B, H_kv, S, E)``, ``(B, H_kv, S, E_v)``; scores
``s = scale·q·k`` (``scale`` default ``1/sqrt(E)``), then ``score_mod(s, b, h, q_idx,
kv_idx)``, then the ``block_mask`` (−∞ where its mask_mod is False); rows with no allowed
key give output 0 and lse −∞; ``enable_gqa`` lets ``H`` query heads share ``H_kv``
key/value heads (head ``h`` reads ``h // (H/H_kv)``); the log-sum-exp is natural-log, shape
``(B, H, L)``, returned through ``return_aux=AuxRequest(lse=True)`` or the deprecated
``return_lse=True``; ``AuxRequest(max_scores=True)`` gives ``m_i = max_{j∈A_i} s_ij`` of the
modified, masked scores (natural units, ``(B, H, L)``, −∞ for a row with no allowed key; in
the compute dtype, float32 for half inputs, as FlexAttention's reference ``math_attention``
takes ``torch.max`` of its working-precision ``post_mod_scores``), the running maximum ``m``
the tiled pass ends with, and like FlexAttention's not differentiable. So a FlexAttention
program moves here by changing its import.

What differs: nothing is compiled (mods are evaluated per tile, in eager torch), the
backward runs on the CPU as on CUDA, and a ``BlockMask`` whose block structure disagrees
with its mask_mod is an error instead of a silent answer
(:class:`exactattn.core.masks.FlexBlockMask`). ``kernel_options`` tune FlexAttention's kernels and
are accepted and ignored (the tiles never change the result). ``AuxRequest(max_scores=True)`` works
on the CPU too (where FlexAttention raises) and runs the generic pass. Beyond FlexAttention's
signature, ``block_mask`` may be any mask exactattn takes (a ``mask_mod`` itself, an
:class:`exactattn.core.masks.Mask`).

Gradients reach ``query``, ``key``, ``value`` and the tensors a score_mod reads that require
grad (a learned bias table): those found through its closure, default arguments, the
globals it names, or — a bound method — its object's attributes it names
(:func:`captured_tensors`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..core import algorithm, calls
from ..core.scores import ScoreFn, param_name, score_fn
from . import passes
from .function import TiledBackward, first_order_only

# How deep captured_tensors follows functions that a score_mod calls or closes over.
CAPTURE_DEPTH = 4


def flex_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    score_mod: Callable[..., Any] | None = None,
    block_mask: Any = None,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
    kernel_options: Mapping[str, Any] | None = None,
    *,
    return_aux: Any = None,
) -> Any:
    """FlexAttention, exact: ``softmax(mask(score_mod(scale·QKᵀ))) V``, differentiable.

    Returns the output ``(B, H, L, E_v)``; with ``return_aux`` also an ``AuxOutput`` whose
    ``lse`` (natural log, ``(B, H, L)``) and ``max_scores`` (``max_{j∈A_i} s_ij``,
    ``(B, H, L)``) are set when requested; with ``return_lse=True``
    (deprecated in FlexAttention, as here) ``(output, lse)``.
    """
    _check_inputs(query, key, value, block_mask, enable_gqa)
    if kernel_options is not None and not isinstance(kernel_options, Mapping):
        raise TypeError(f"kernel_options must be a dict or None; got {kernel_options!r}")
    want_lse, want_max = _check_outputs(return_lse, return_aux)
    mod = None
    if score_mod is not None:
        mod = score_fn(score_mod, captured_tensors(score_mod) if callable(score_mod) else ())
    call = calls.prepare(
        passes.context(query.dtype, query.device), {"q": query, "k": key, "v": value},
        scale=scale, block_size=None, mask=block_mask, score_mod=mod, dropout=None,
        enable_gqa=enable_gqa,
    )  # fmt: skip
    block_size = _block_size(call.mask, call.geometry, query.device)
    band = passes.lower(call.mask, call.geometry)  # the call's one lowering
    impl = "generic" if want_max else "auto"  # m is the generic pass's running maximum
    plan = passes.plan_for(dataclasses.replace(call, block_size=block_size), band, impl=impl)
    params = mod.params if isinstance(mod, ScoreFn) else ()
    if torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value, *params)):
        out, lse, m = FlexFunction.apply(query, key, value, plan, want_max, *params)
    else:
        out, lse, *m = passes.forward(plan, query, key, value, with_max=want_max)
        m = m[0] if m else None
    if return_aux is not None:
        return out, _aux_output()(lse=lse if want_lse else None, max_scores=m)
    return (out, lse) if return_lse else out


class FlexFunction(torch.autograd.Function):
    """``(Y, lse, m)`` of a :class:`~exactattn.torch.passes.Plan` (``m`` the row maxima when
    ``with_max``, else None), and its block-recomputed VJP, including the gradients of the
    score_mod's parameter tensors (inputs after the plan and the flag)."""

    @staticmethod
    def forward(q, k, v, plan: passes.Plan, with_max: bool, *params):
        if with_max:
            return passes.forward(plan, q, k, v, with_max=True)
        return (*passes.forward(plan, q, k, v), None)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        q, k, v, plan = inputs[:4]
        y, lse, m = output
        ctx.save_for_backward(q, k, v, y, lse)
        ctx.plan = plan
        ctx.mark_non_differentiable(*(x for x in (lse, m) if x is not None))

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor, grad_lse: Any, grad_m: Any):
        q, k, v, y, lse = ctx.saved_tensors
        plan = ctx.plan
        params = plan.score_mod.params if isinstance(plan.score_mod, ScoreFn) else ()
        wanted = [n for n in range(len(params)) if ctx.needs_input_grad[5 + n]]
        if not wanted:  # differentiable once more: the tiled second-order reverse
            y, lse = y.detach(), lse.detach()  # constants of the second order
            dq, dk, dv, _ = TiledBackward.apply(grad_y, q, k, v, y, lse, None, plan, False)
            return dq, dk, dv, None, None, *(None,) * len(params)
        return first_order_only(
            "flex_attention with score_mod parameters that require grad",
            FlexFunction.parameter_backward(ctx, grad_y, wanted, params),
            (*ctx.saved_tensors[:3], *params),
        )

    @staticmethod
    def parameter_backward(ctx: Any, grad_y: torch.Tensor, wanted: list, params: tuple) -> tuple:
        """The reverse with the gradients of the score_mod's parameters ``wanted``."""
        q, k, v, y, lse = ctx.saved_tensors
        plan = ctx.plan
        grads = {param_name(n): plan.ctx.zeros(tuple(params[n].shape)) for n in wanted}
        with torch.no_grad():
            one = torch.ones((), dtype=lse.dtype, device=lse.device).expand(lse.shape)
            dq, dk, dv = algorithm.backward(
                plan.ctx, q, k, v, y, lse, one, grad_y,
                scale=plan.scale, block_size=plan.block_size, mask=plan.mask,
                score_mod=plan.score_mod, enable_gqa=plan.geometry.group != 1,
                row_block=passes.row_block_size(plan.ctx, plan.geometry, plan.block_size),
                mod_grads=grads,
            )  # fmt: skip
        dparams = [
            grads[param_name(n)].to(p.dtype) if n in wanted else None for n, p in enumerate(params)
        ]
        out = (plan.ctx.output(x).contiguous() for x in (dq, dk, dv))
        return *out, None, None, *dparams


def _block_size(mask: Any, geometry: Any, device: torch.device) -> int:
    """The key-block size ``b``: the default, rounded down to a multiple of a BlockMask's
    KV_BLOCK_SIZE so that tiles fall on its blocks (any ``b`` gives the same result)."""
    b = passes.key_block_size(geometry, None, device)
    kv_block = getattr(mask, "block", (None, None))[1]
    return b if kv_block is None else max(kv_block, b // kv_block * kv_block)


# --- the tensors a score_mod reads --------------------------------------------------------------
def captured_tensors(fn: Callable[..., Any]) -> tuple[torch.Tensor, ...]:
    """Tensors requiring grad that ``fn`` reads, each once, in the order found.

    Looked for in a function's closure cells, default arguments and the globals its code
    names; in the attributes its code names of the objects found there (``self.table``
    in a closure over ``self``) or of a bound method's object; in a ``functools.partial``'s
    arguments; inside lists, tuples and dicts. Functions found are followed the same way,
    :data:`CAPTURE_DEPTH` levels deep.
    """
    found: dict[int, torch.Tensor] = {}
    _collect(fn, found, CAPTURE_DEPTH, set())
    return tuple(found.values())


def _collect(x: Any, found: dict[int, torch.Tensor], depth: int, seen: set[int]) -> None:
    if isinstance(x, torch.Tensor):
        if x.requires_grad:
            found.setdefault(id(x), x)
        return
    if depth < 0 or id(x) in seen:
        return
    seen.add(id(x))
    for value in _reads(x):
        _collect(value, found, depth - 1, seen)


def _reads(x: Any) -> list[Any]:
    """What ``x`` holds (a container, a partial) or reads (a function, a bound method)."""
    if isinstance(x, (list, tuple)):
        return list(x)
    if isinstance(x, dict):
        return list(x.values())
    if isinstance(x, functools.partial):
        return [x.func, *x.args, *x.keywords.values()]
    if inspect.ismethod(x):
        return _function_reads(x.__func__, [x.__self__])
    if inspect.isfunction(x):
        return _function_reads(x, [])
    return []


def _function_reads(fn: Any, objects: list[Any]) -> list[Any]:
    names = fn.__code__.co_names
    held = [cell.cell_contents for cell in fn.__closure__ or () if _filled(cell)]
    held += [*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()]
    held += [fn.__globals__[n] for n in names if n in fn.__globals__]
    objects = objects + [v for v in held if not _followed(v)]
    held += [getattr(o, n) for o in objects for n in names if hasattr(o, n)]
    return held


def _followed(x: Any) -> bool:
    """Whether :func:`_reads` looks into ``x`` itself (else it is an object whose named
    attributes are read); modules and tensors are neither."""
    return (
        isinstance(x, (torch.Tensor, types.ModuleType, list, tuple, dict, functools.partial))
        or inspect.ismethod(x)
        or inspect.isfunction(x)
        or inspect.isbuiltin(x)
    )


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


# --- input checks (FlexAttention's, with its messages) ------------------------------------------
def _check_inputs(query, key, value, block_mask, enable_gqa) -> None:
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, L, E); got shape {tuple(x.shape)}")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(
            f"query, key, value must share one dtype; got {query.dtype}, {key.dtype}, {value.dtype}"
        )
    if not (query.device == key.device == value.device):
        raise ValueError(
            f"query, key, value must be on one device; got {query.device}, {key.device}, "
            f"{value.device}"
        )
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool; got {enable_gqa!r}")
    shapes = f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
    if key.shape[:3] != value.shape[:3]:
        raise ValueError(f"key and value must agree in (B, H_kv, S); got {shapes}")
    if not enable_gqa and query.size(1) != key.size(1):
        raise ValueError(
            f"Expect query and key/value to have the same number of heads but got "
            f"Hq={query.size(1)} and Hkv={key.size(1)}. Try setting enable_gqa=True for GQA."
        )
    if key.size(0) not in (1, query.size(0)):
        raise ValueError(
            f"key/value must have the batch size of query (or 1, broadcast); got {shapes}"
        )
    if block_mask is not None and hasattr(block_mask, "kv_num_blocks"):
        device = block_mask.kv_num_blocks.device
        if device != query.device:
            raise RuntimeError(
                f"Expect q/k/v and block_mask to be on the same device but got "
                f"{query.device} and {device}."
            )


def _check_outputs(return_lse: bool, return_aux: Any) -> tuple[bool, bool]:
    """Whether the lse and the row maxima are wanted; FlexAttention's rules for
    ``return_lse``/``return_aux``."""
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool; got {return_lse!r}")
    if return_lse and return_aux is not None:
        raise ValueError(
            "Cannot specify both return_lse and return_aux. return_lse is deprecated, "
            "please use return_aux=AuxRequest(lse=True) instead."
        )
    if return_lse:
        warnings.warn(
            "return_lse is deprecated; use return_aux=AuxRequest(lse=True) instead.",
            FutureWarning,
            stacklevel=3,
        )
        return True, False
    if return_aux is None:
        return False, False
    if not (hasattr(return_aux, "lse") and hasattr(return_aux, "max_scores")):
        raise TypeError(f"return_aux must be an AuxRequest; got {return_aux!r}")
    return bool(return_aux.lse), bool(return_aux.max_scores)


def _aux_output() -> Any:
    from torch.nn.attention.flex_attention import AuxOutput

    return AuxOutput
