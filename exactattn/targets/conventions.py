"""Calling conventions: how a case becomes a call, and the call's result comes back.

A convention turns a :class:`~exactattn.cases.Case` (float64 arrays already held
in the target's format, a mask spec, keywords) into the arguments one family of attention
functions takes, calls the target, and returns its outputs as NumPy arrays keyed ``y``,
``lse``, ``dq``, ``dk``, ``dv`` (gradients by autograd at the case's upstream ``G``).
It also says which masks it can express: the mask arguments are derived from the case's
mask spec as its kind's entry in :data:`exactattn.cases.mask_kinds.MASK_KINDS` lowers it (a
boolean mask, ``is_causal``, a window, key lengths, the user's program), never from the
library's mask objects, except for the ``api`` and ``exactattn`` conventions whose argument
*is* a library mask (the entry's too).

* ``api``: exactattn's own number systems (``exactattn.attention`` /
  ``attention_backward`` with ``backend=ctx``), any leading dims.
* ``exactattn``: a torch function with this library's keywords (``scale``, ``mask`` — an
  :class:`exactattn.core.masks.Mask` —, ``dropout_p``, ``seed``, ``enable_gqa``, ``block_size``,
  ``empty_rows``), tensors ``(B, H, n, d)``; e.g. ``exactattn.torch.attention``.
  GQA passes ``enable_gqa=True`` here and in ``api``.
* ``sdpa``: ``F.scaled_dot_product_attention``'s signature: ``(B, H, n, d)``, boolean
  ``attn_mask`` (True = attend) or ``is_causal`` (top-left), ``dropout_p``, ``scale``,
  ``enable_gqa``.
* ``flash``: flash-attn's ``flash_attn_func``: ``(B, n, H, d)``, ``causal`` and
  ``window_size=(left, right)`` aligned bottom-right, ``softmax_scale``, ``dropout_p``;
  fewer key/value heads for GQA. Masks other than causal/window conjunctions are skipped.
* ``hf``: transformers' attention interface ``fn(module, query, key, value,
  attention_mask, dropout=, scaling=, is_causal=)`` → ``(output (B, n, H, v), weights)``,
  with a stand-in module carrying ``num_key_value_groups``, ``is_causal``, ``scaling``,
  ``training``; the mask is boolean (``sdpa``) or additive with the dtype's minimum
  (``eager``), as transformers' own mask builders make them.
* ``flex``: ``flex_attention(q, k, v, block_mask=, scale=, enable_gqa=, return_lse=)``
  with the block mask from ``create_block_mask`` (:mod:`exactattn.targets.flex_convention`).

Score modification: the bias reaches a target as held in its input format, lifted like the
inputs (:meth:`~exactattn.cases.Case.lifted_bias`): ``bias=`` for exactattn's own
(``api`` with ``bias_grad``, ``exactattn`` with a bias tensor that requires grad: both return
``dbias``), SDPA's / transformers' / xformers' float ``attn_mask`` (the bias where the mask
allows, ``−∞`` — or eager's ``finfo.min`` — elsewhere), a ``score_mod`` closing over the bias
tensor for Flex, and flash-attn's ``alibi_slopes`` when the bias is ALiBi in flash-attn's
form; ``softcap=`` for exactattn's own and flash-attn (``softcap``), ``cap·tanh(s/cap)`` in
Flex's ``score_mod``. A user's program (``mask_mod`` / ``score_mod``) runs as itself in the
``api`` and ``flex`` conventions (and its mask_mod in ``exactattn``). What a convention cannot
take is a skip with the reason (:class:`~exactattn.targets.target.Capabilities`,
:meth:`Convention.unsupported`).

Leading batch dims are lifted to the 4-d ``(B, H)`` layout foreign functions take:
``()`` → ``(1, 1)``, ``(B,)`` → ``(B, 1)``, ``(B, H)`` unchanged (:func:`lift`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..cases import Case, mask_kinds

Outputs = dict[str, Any]


class TargetError(Exception):
    """The target's result is unusable (wrong type or shape): a failed case, with this text."""


# --- shared helpers ------------------------------------------------------------------------
def lift(batch: tuple[int, ...]) -> tuple[int, int]:
    """The ``(B, H)`` a case's leading dims become for a 4-d convention: ``()`` → ``(1, 1)``,
    ``(B,)`` → ``(B, 1)`` (the first axis stays the batch axis that per-batch mask data —
    key lengths, document ids — is indexed by), ``(B, H)`` unchanged."""
    if len(batch) > 2:
        raise ValueError(f"4-d conventions take at most 2 leading dims; got {batch}")
    return (*batch, 1, 1)[:2]  # type: ignore[return-value]


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def tensor(x: np.ndarray, dtype: str, device: str, layout: str, grad: bool) -> Any:
    """A torch tensor holding ``x`` (exact in ``dtype``) in the memory ``layout``.

    ``transposed``: stored with the last two leading/sequence axes swapped (a ``(B, n, H,
    d)`` buffer seen as ``(B, H, n, d)``); ``strided``: rows padded and offset inside a wider
    buffer (as a slice of a packed QKV projection). With ``grad`` the buffer requires grad
    and gradients are taken with respect to the view returned, the tensor the target gets.
    """
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x)).to(torch_dtype(dtype)).to(device)
    if layout == "transposed" and t.ndim >= 3:
        return t.transpose(-2, -3).contiguous().requires_grad_(grad).transpose(-2, -3)
    if layout == "strided":
        base = torch.zeros((*t.shape[:-1], 2 * t.shape[-1] + 1), dtype=t.dtype, device=device)
        base[..., 1 : t.shape[-1] + 1] = t
        return base.requires_grad_(grad)[..., 1 : t.shape[-1] + 1]
    return t.contiguous().requires_grad_(grad)


def to_numpy(name: str, x: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A returned tensor as float64 NumPy, after checking it is a tensor of ``shape``."""
    if not hasattr(x, "detach") or not hasattr(x, "shape"):
        raise TargetError(f"{name} is a {type(x).__name__}; expected a tensor of shape {shape}")
    if tuple(x.shape) != tuple(shape):
        raise TargetError(f"{name} has shape {tuple(x.shape)}; expected {tuple(shape)}")
    return x.detach().to("cpu").double().numpy()


def dtype_name(x: Any) -> str:
    return str(getattr(x, "dtype", type(x).__name__)).removeprefix("torch.")


DETACHED = "y does not require grad: the target's output is detached"


def autograd(y: Any, views: list[Any], g: np.ndarray, dtype: str, device: str) -> list[Any]:
    """``(dq, dk, dv)`` of ``Σ G∘y`` with respect to the tensors the target received (a
    :class:`TargetError` :data:`DETACHED` when ``y`` is outside autograd's graph)."""
    import torch

    if not getattr(y, "requires_grad", False):
        raise TargetError(DETACHED)
    upstream = torch.from_numpy(g).to(torch_dtype(dtype)).to(device)
    grads = torch.autograd.grad(y, views, upstream, allow_unused=True)
    return [torch.zeros_like(v) if d is None else d for d, v in zip(grads, views)]


def causal_top_left_only(spec: dict[str, Any], n_q: int, n_k: int) -> bool:
    """Whether the spec is exactly SDPA's ``is_causal`` (causal, top-left or square)."""
    align = mask_kinds.causal_alignment(spec)
    return align is not None and (align == "top-left" or n_q == n_k)


def lifted_allowed(case: Case) -> np.ndarray:
    n = case.sizes
    return case.allowed().reshape((*lift(case.batch), n["n_q"], n["n_k"]))


def float_mask(case: Case, held: dict[str, np.ndarray], dtype: str, device: str, low: float):
    """The mask and the held bias as one additive float tensor ``(B, H, n_q, n_k)``: the
    bias where the mask allows (0 without a bias), ``low`` elsewhere."""
    import torch

    allowed = torch.from_numpy(lifted_allowed(case).copy()).to(device)
    values = torch.zeros((), dtype=torch_dtype(dtype), device=device)
    if "bias" in held:
        values = torch.from_numpy(case.lifted_bias(held["bias"]).copy())
        values = values.to(torch_dtype(dtype)).to(device)
    return torch.where(allowed, values, torch.full((), low, dtype=values.dtype, device=device))


# --- conventions ---------------------------------------------------------------------------
class Convention:
    """Base: the case's layout in, ``{y, lse?, dq?, dk?, dv?}`` and their dtypes out.

    ``ragged``: the convention passes per-sequence query lengths (the ``query_padding``
    mask kind), so the check draws ragged query batches for it
    (:func:`exactattn.cases.paths.check_draws`). ``kvcache``: a KV-cache decode call, so
    the check draws how the cache holds the keys (the ``kvcache`` interface field).
    ``reads``: the interface fields the convention lays the case out by
    (:data:`exactattn.cases.interface_fields.FIELDS`): the coverage table counts those.
    ``expresses``: mask kinds the convention
    passes through the interface itself (a varlen call's ``cu_seqlens_q`` is the
    ``query_padding`` of a varlen batch), so the target's ``masks`` capability need not
    name them; :meth:`unsupported` still says where the case is beyond the interface."""

    name = ""
    ragged = False
    kvcache = False
    reads: tuple[str, ...] = ()
    expresses: tuple[str, ...] = ()

    def unsupported(self, target: Any, case: Case, device: str, grads: bool) -> str | None:
        """Why this convention cannot express the case (None: it can)."""
        return None

    def passes_empty_rows(self, case: Case) -> bool:
        """Whether the call hands the target a row with no allowed key (the case's
        ``empty_rows``): a convention that passes only each sequence's real queries (it
        ``expresses`` ``query_padding``) hands it only the real rows without a key, and
        fills the padded ones itself."""
        if case.empty_rows != "zero":
            return False
        if "query_padding" not in self.expresses or case.q_seqlens is None:
            return True
        n = case.sizes
        B, H = lift(case.batch)
        keyless = ~case.attended().reshape(B, H, n["n_q"], n["n_k"]).any(axis=-1)
        real = np.arange(n["n_q"]) < np.asarray(case.q_seqlens)[:, None, None]
        return bool((keyless & real).any())

    def run(self, target: Any, case: Case, held: dict[str, np.ndarray], device: str, grads: bool):
        raise NotImplementedError


class Sdpa(Convention):
    """SDPA's signature; a user's function is given only the keywords it takes
    (``Options.takes``, :mod:`.signature`): GQA without ``enable_gqa`` as ``K, V`` expanded
    over each group, a causal mask without ``is_causal`` as a boolean ``attn_mask``."""

    name = "sdpa"

    def unsupported(self, target, case, device, grads):
        takes = target.options.takes
        if takes is None:
            return None
        n = case.sizes
        if case.scale is not None and "scale" not in takes:
            return f"scale {case.scale:.6g}: the function takes no scale (its signature)"
        top_left = causal_top_left_only(case.mask, n["n_q"], n["n_k"]) and "is_causal" in takes
        if case.masked and not top_left and "attn_mask" not in takes:
            return "this mask needs attn_mask, which the function does not take (its signature)"
        return None

    def run(self, target, case, held, device, grads):
        import torch

        fn = target.load()
        dtype = case.dtype
        takes = target.options.takes
        B, H = lift(case.batch)
        n = case.sizes
        expand = case.group > 1 and takes is not None and "enable_gqa" not in takes
        given = expand_heads(held, case.group) if expand else held
        four, views = four_views(case, given, B, device, grads)
        kwargs: dict[str, Any] = {}
        if case.scale is not None or takes is None:
            kwargs["scale"] = case.scale
        is_causal = causal_top_left_only(case.mask, n["n_q"], n["n_k"])
        if "bias" in held:  # SDPA's float attn_mask: added to the scores
            kwargs["attn_mask"] = float_mask(case, held, dtype, device, -math.inf)
        elif is_causal and (takes is None or "is_causal" in takes):
            kwargs["is_causal"] = True
        elif case.masked:
            kwargs["attn_mask"] = torch.from_numpy(lifted_allowed(case).copy()).to(device)
        if case.group > 1 and not expand:
            kwargs["enable_gqa"] = True
        if case.dropout_p:
            kwargs["dropout_p"] = case.dropout_p
        context = _sdpa_backend(target.options.sdpa_backend)
        with context:
            y = fn(*views, **kwargs)
            out = {"y": to_numpy("y", y, (B, H, n["n_q"], n["v"])), "_dtype": dtype_name(y)}
            if grads:
                dq, dk, dv = autograd(y, views, four_g(held, B), dtype, device)
                grads_out(out, (dq, dk, dv), four, given)
        for name in ("dk", "dv") if expand and grads else ():
            out[name] = group_sum(out[name], case.group)
        out["y"] = out["y"].reshape(held["g"].shape)
        return out


def expand_heads(held: dict[str, np.ndarray], group: int) -> dict[str, np.ndarray]:
    """``held`` with ``k, v`` repeated to one head per query head (head ``h`` reads key/value
    head ``h // group``, SDPA's ``enable_gqa``)."""
    out = dict(held)
    for x in "kv":
        out[x] = np.repeat(held[x], group, axis=-3)
    return out


def group_sum(grad: np.ndarray, group: int) -> np.ndarray:
    """The expanded heads' gradient summed over each group of ``group`` heads (float64)."""
    shape = grad.shape
    split = grad.reshape((*shape[:-3], shape[-3] // group, group, *shape[-2:]))
    return split.sum(axis=-3)


def four_views(
    case: Case, held: dict[str, np.ndarray], B: int, device: str, grads: bool
) -> tuple[dict[str, np.ndarray], list[Any]]:
    """``q, k, v`` as ``(B, H, n, ·)`` arrays and the tensors a target is called with (in
    the case's dtype and layout, requiring grad when the gradients are judged)."""
    four = {x: held[x].reshape((B, -1, *held[x].shape[-2:])) for x in "qkv"}
    return four, [tensor(four[x], case.dtype, device, case.layout, grads) for x in "qkv"]


def four_g(held: dict[str, np.ndarray], B: int) -> np.ndarray:
    return held["g"].reshape((B, -1, *held["g"].shape[-2:]))


def grads_out(out: Outputs, grads: Any, four: dict[str, np.ndarray], held: dict) -> None:
    for name, grad, x in zip(("dq", "dk", "dv"), grads, "qkv"):
        out[name] = to_numpy(name, grad, four[x].shape).reshape(held[x].shape)


def _sdpa_backend(name: str | None) -> Any:
    import contextlib

    if name is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "math": SDPBackend.MATH,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
    }[name]
    return sdpa_kernel(backend)


class Hf(Convention):
    """transformers' attention interface (see the module docstring)."""

    name = "hf"

    def run(self, target, case, held, device, grads):
        import torch

        fn = target.load()
        dtype = case.dtype
        B, H = lift(case.batch)
        n = case.sizes
        four, views = four_views(case, held, B, device, grads)
        module = _HfModule(case.group, case.c(), training=bool(case.dropout_p))
        mask = None
        additive = target.options.mask == "additive"
        # transformers reads is_causal only for square problems: with one query it attends
        # every key (a decode step), with n_k > n_q it crops the keys; its mask builders
        # materialise every other case, and so does this convention
        square = n["n_q"] == n["n_k"]
        if "bias" in held:
            low = torch.finfo(torch_dtype(dtype)).min if additive else -math.inf
            mask = float_mask(case, held, dtype, device, low)
        elif causal_top_left_only(case.mask, n["n_q"], n["n_k"]) and square and not additive:
            module.is_causal = True
        elif case.masked:
            allowed = torch.from_numpy(lifted_allowed(case).copy()).to(device)
            mask = allowed
            if additive:
                low = torch.finfo(torch_dtype(dtype)).min
                zero = torch.zeros((), dtype=torch_dtype(dtype), device=device)
                mask = torch.where(allowed, zero, torch.full_like(zero, low))
        result = fn(
            module,
            *views,
            mask,
            dropout=case.dropout_p,
            scaling=case.c(),
            is_causal=module.is_causal,
        )
        if not isinstance(result, tuple) or len(result) != 2:
            raise TargetError(
                f"returned a {type(result).__name__}; the hf convention returns (output, weights)"
            )
        y = result[0]
        expected = (B, n["n_q"], H, n["v"])
        out = {"y": to_numpy("y", y, expected), "_dtype": dtype_name(y)}
        out["y"] = out["y"].transpose(0, 2, 1, 3).reshape(held["g"].shape)
        if grads:
            g = four_g(held, B).transpose(0, 2, 1, 3).copy()
            grads_ = autograd(y, views, g, dtype, device)
            grads_out(out, grads_, four, held)
        return out


class _HfModule:
    """The attributes transformers' attention functions read from their module."""

    def __init__(self, group: int, scaling: float, training: bool):
        self.num_key_value_groups = group
        self.is_causal = False
        self.scaling = scaling
        self.training = training


class Flash(Convention):
    """flash-attn's ``flash_attn_func`` (see the module docstring)."""

    name = "flash"

    def unsupported(self, target, case, device, grads):
        window = flash_window(case)
        if isinstance(window, str):
            return window
        if case.bias is not None:
            return flash_alibi(case)
        return None

    def run(self, target, case, held, device, grads):
        fn = target.load()
        dtype = case.dtype
        B, H = lift(case.batch)
        n = case.sizes
        bnhd = {
            x: held[x].reshape((B, -1, *held[x].shape[-2:])).transpose(0, 2, 1, 3) for x in "qkv"
        }
        views = [tensor(bnhd[x], dtype, device, case.layout, grads) for x in "qkv"]
        left, right = flash_window(case)  # type: ignore[misc]
        kwargs: dict[str, Any] = {
            "softmax_scale": case.c(),
            "causal": right == 0 and left == -1,
            "window_size": (left, right),
        }
        if case.dropout_p:
            kwargs["dropout_p"] = case.dropout_p
        if case.softcap is not None:
            kwargs["softcap"] = case.softcap
        if case.bias is not None:
            import torch

            slopes = np.asarray(case.score["slopes"], dtype=np.float32)
            kwargs["alibi_slopes"] = torch.from_numpy(slopes).to(device)
        want_lse = target.caps.lse is True
        if want_lse:
            kwargs["return_attn_probs"] = True
        result = fn(*views, **kwargs)
        y = result[0] if isinstance(result, (tuple, list)) else result
        out = {
            "y": to_numpy("y", y, (B, n["n_q"], H, n["v"])).transpose(0, 2, 1, 3),
            "_dtype": dtype_name(y),
        }
        out["y"] = out["y"].reshape(held["g"].shape)
        if want_lse:
            lse = to_numpy("lse", result[1], (B, H, n["n_q"]))
            out["lse"] = lse.reshape(held["g"].shape[:-1])
        if grads:
            g = four_g(held, B).transpose(0, 2, 1, 3).copy()
            grads_ = autograd(y, views, g, dtype, device)
            for name, grad, x in zip(("dq", "dk", "dv"), grads_, "qkv"):
                back = to_numpy(name, grad, bnhd[x].shape).transpose(0, 2, 1, 3)
                out[name] = back.reshape(held[x].shape)
        return out


def flash_window(case: Case) -> tuple[int, int] | str:
    """flash-attn's ``window_size`` (−1 = unbounded) for a conjunction of causal / window
    leaves aligned bottom-right, or the reason the mask is not expressible."""
    n = case.sizes
    left, right = math.inf, math.inf
    for part in mask_kinds.conjuncts(case.mask):
        window = mask_kinds.window(part)
        if window is None:
            return "the flash convention expresses causal / sliding-window masks only"
        part_left, part_right, align = window
        if align not in (None, "bottom-right") and n["n_q"] != n["n_k"]:
            return "the flash convention aligns masks bottom-right (top-left with n_q != n_k)"
        left = min(left, math.inf if part_left is None else part_left)
        right = min(right, math.inf if part_right is None else part_right)
    as_int = lambda x: -1 if x == math.inf else int(x)  # noqa: E731
    return as_int(left), as_int(right)


def flash_alibi(case: Case) -> str | None:
    """Why the case's bias is not flash-attn's ``alibi_slopes`` (None when it is): flash-attn
    adds ``−slope_h·|i + n_k − n_q − j|``, formed in float32 from the slopes; that must be
    the case's bias, exactly in the input format, at every allowed pair."""
    from ..cases import hold

    if case.score["kind"] != "alibi":
        return "flash-attn takes a bias only as ALiBi slopes (alibi_slopes)"
    n = case.sizes
    i, j = np.arange(n["n_q"])[:, None], np.arange(n["n_k"])[None, :]
    slopes = np.asarray(case.score["slopes"], dtype=np.float32).astype(np.float64)
    flash = -slopes[:, None, None] * np.abs(i + n["n_k"] - n["n_q"] - j)
    flash = flash if len(case.batch) == 2 else flash[0]
    held = hold(case.bias, case.dtype or "float32")
    same = np.broadcast_to((flash == case.bias) & (held == case.bias), case.allowed().shape)
    if not same[case.allowed()].all():
        return "the ALiBi bias is not flash-attn's -slope·|i + n_k - n_q - j| in the input format"
    return None


class Exactattn(Convention):
    """A torch function with exactattn's keywords (e.g. ``exactattn.torch.attention``)."""

    name = "exactattn"

    def unsupported(self, target, case, device, grads):
        if case.score_mod is not None:
            return "exactattn.torch.attention takes no score_mod (bias and softcap only)"
        return None

    def run(self, target, case, held, device, grads):
        fn = target.load()
        dtype = case.dtype
        B, H = lift(case.batch)
        n = case.sizes
        four, views = four_views(case, held, B, device, grads)
        lifted = lifted_case(case)
        kwargs: dict[str, Any] = {
            "scale": case.scale,
            "mask": lifted.mask_object(like=views[0]),
            "block_size": case.block_size,
            **dict(target.options.keywords),
        }
        if case.softcap is not None:
            kwargs["softcap"] = case.softcap
        if "bias" in held:
            lifted_bias = case.lifted_bias(held["bias"])
            kwargs["bias"] = tensor(lifted_bias, dtype, device, "contiguous", grads)
            views.append(kwargs["bias"])
        if case.group > 1:
            kwargs["enable_gqa"] = True
        if case.dropout_p:
            kwargs.update(dropout_p=case.dropout_p, seed=case.seed)
        if case.empty_rows == "zero":
            kwargs["empty_rows"] = "zero"
        y = fn(*views[:3], **kwargs)
        out = {"y": to_numpy("y", y, (B, H, n["n_q"], n["v"])), "_dtype": dtype_name(y)}
        out["y"] = out["y"].reshape(held["g"].shape)
        if grads:
            grads_ = autograd(y, views, four_g(held, B), dtype, device)
            grads_out(out, grads_, four, held)
            if "bias" in held:
                dbias = to_numpy("dbias", grads_[3], tuple(views[3].shape))
                out["dbias"] = dbias.reshape(held["bias"].shape)
        return out


def lifted_case(case: Case) -> Case:
    """The case with its leading dims lifted to ``(B, H)``; the mask follows as its kind says
    (:func:`exactattn.cases.mask_kinds.lifted`: a dense table is reshaped)."""
    from dataclasses import replace

    if len(case.batch) == 2:
        return case
    B, _ = lift(case.batch)
    arrays = {x: getattr(case, x).reshape((B, -1, *getattr(case, x).shape[-2:])) for x in "qkvg"}
    n = case.sizes
    mask = mask_kinds.lifted(case.mask, case.batch, n["n_q"], n["n_k"])
    return replace(case, mask=mask, **arrays)


class Api(Convention):
    """exactattn's own number systems: ``exactattn.attention`` over ``options.ctx()``.

    The case's float64 arrays enter as the context takes them exactly
    (:meth:`~exactattn.backends.protocol.ArrayContext.exact_floats`, then ``asarray``) in the
    case's memory layout (:func:`laid_out`); the scale, the soft-cap and the bias as exact
    numbers of the context. Outputs come back as the context compares them
    (:meth:`~exactattn.backends.protocol.ArrayContext.comparable`): float64 (IEEE contexts),
    mpf object arrays (mpmath, sympy evaluated to 50 digits: ``fine``) or ``(midpoint,
    radius)`` pairs (flint balls: ``enclosure``).
    """

    name = "api"

    def run(self, target, case, held, device, grads):
        from .. import api

        options = target.options
        ctx = options.ctx()
        shapes = {x: held[x].shape for x in "qkvg"}
        reordered = None  # the allowed set in the order a kernel that reorders keys runs
        if options.holds is not None:  # a kernel that quantises (or reorders) what it is given
            given = {x: held[x] for x in "qkv"}
            if case.masked:
                given["allowed"] = case.allowed()
            got = options.holds(given)
            held = {**held, **{x: got[x] for x in "qkv"}}
            if got.get("allowed") is not None:
                from ..core.masks import dense

                reordered = dense(np.ascontiguousarray(got["allowed"]))

        def convert(x: np.ndarray) -> Any:
            return ctx.asarray(ctx.exact_floats(x))

        with ctx.scope():  # a conversion rounds (nothing, for held values) as the call does
            arrays = {x: laid_out(held[x], case.layout, convert) for x in "qkvg"}
        keywords = case.keywords()
        if "bias" in held:
            keywords["bias"] = ctx.exact_floats(held["bias"])
        if case.softcap is not None:
            keywords["softcap"] = ctx.exact_floats(case.softcap)
        if case.scale is not None:
            keywords["scale"] = ctx.exact_floats(case.scale)
        if case.score_mod is not None:
            from ..infra import loading

            keywords["score_mod"] = loading.load_callable(case.score_mod, "--score-mod")
        if case.group > 1:
            keywords["enable_gqa"] = True
        if options.path == "naive":
            keywords.pop("block_size")
            forward, backward = api.naive_attention, api.naive_attention_backward
        else:
            forward, backward = api.attention, api.attention_backward
        q, k, v, g = (arrays[x] for x in "qkvg")
        mask = case.mask_object(like=q if hasattr(q, "detach") else None)  # torch: on q's device
        if reordered is not None:
            mask = reordered
        y, stats = forward(q, k, v, mask=mask, backend=ctx, return_stats=True, **keywords)
        out: Outputs = {"y": y, "lse": stats.lse}
        if options.holds is not None and target.caps.lse is not True:
            del out["lse"]  # the lse of transformed inputs (K smoothing shifts the scores)
        if grads:
            bias_grad = {"bias_grad": True} if "bias" in held else {}
            found = backward(q, k, v, y, stats, g, mask=mask, backend=ctx, **keywords, **bias_grad)
            out.update(zip(("dq", "dk", "dv", "dbias"), found))
        result: Outputs = {"_dtype": options.storage or ""}
        expected = {"y": shapes["g"], "lse": shapes["g"][:-1], "dq": shapes["q"]}
        expected.update(dk=shapes["k"], dv=shapes["v"])
        if "bias" in held:
            expected["dbias"] = held["bias"].shape
        for name, x in out.items():
            result[name] = ctx.comparable(x.reshape(expected[name]))
        return result


def laid_out(x: np.ndarray, layout: str, convert: Any) -> Any:
    """``convert(x)`` in the memory ``layout`` (see :func:`tensor`), for any array type with
    NumPy's views (``swapaxes``, slicing): the float64 buffer is laid out and converted
    whole, and the result is the same view of the converted buffer."""
    if layout == "transposed" and x.ndim >= 3:
        return convert(np.ascontiguousarray(np.swapaxes(x, -2, -3))).swapaxes(-2, -3)
    if layout == "strided":
        base = np.zeros((*x.shape[:-1], 2 * x.shape[-1] + 1))
        base[..., 1 : x.shape[-1] + 1] = x
        return convert(base)[..., 1 : x.shape[-1] + 1]
    return convert(x)


class Xformers(Convention):
    """``xformers.ops.memory_efficient_attention``: ``(B, n, H, d)``; causal masks as its
    ``LowerTriangularMask`` (top-left) / ``LowerTriangularFromBottomRightMask``, any other
    mask as an additive ``−∞`` bias tensor ``(B, H, n_q, n_k)``; ``p`` for dropout."""

    name = "xformers"

    def run(self, target, case, held, device, grads):
        import torch

        fn = target.load()
        dtype = case.dtype
        B, H = lift(case.batch)
        n = case.sizes
        bnhd = {
            x: held[x].reshape((B, -1, *held[x].shape[-2:])).transpose(0, 2, 1, 3) for x in "qkv"
        }
        views = [tensor(bnhd[x], dtype, device, case.layout, grads) for x in "qkv"]
        bias: Any = None
        if "bias" in held:
            bias = float_mask(case, held, dtype, device, -math.inf)
        elif (align := mask_kinds.causal_alignment(case.mask)) is not None:
            from xformers.ops import fmha

            bottom = align == "bottom-right"
            bias = (
                fmha.attn_bias.LowerTriangularFromBottomRightMask()
                if bottom
                else fmha.attn_bias.LowerTriangularMask()
            )
        elif case.masked:
            allowed = torch.from_numpy(lifted_allowed(case).copy()).to(device)
            zero = torch.zeros((), dtype=torch_dtype(dtype), device=device)
            bias = torch.where(allowed, zero, torch.full_like(zero, -math.inf))
        y = fn(*views, attn_bias=bias, p=case.dropout_p, scale=case.c())
        out = {
            "y": to_numpy("y", y, (B, n["n_q"], H, n["v"])).transpose(0, 2, 1, 3),
            "_dtype": dtype_name(y),
        }
        out["y"] = out["y"].reshape(held["g"].shape)
        if grads:
            g = four_g(held, B).transpose(0, 2, 1, 3).copy()
            grads_ = autograd(y, views, g, dtype, device)
            for name, grad, x in zip(("dq", "dk", "dv"), grads_, "qkv"):
                back = to_numpy(name, grad, bnhd[x].shape).transpose(0, 2, 1, 3)
                out[name] = back.reshape(held[x].shape)
        return out


USER_CONVENTIONS = ("sdpa", "flash", "exactattn", "hf")
