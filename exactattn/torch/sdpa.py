"""``exactattn.torch.scaled_dot_product_attention``: torch's SDPA signature and contract.

``scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
is_causal=False, *, scale=None, enable_gqa=False, sinks=None)`` computes what
``torch.nn.functional.scaled_dot_product_attention`` computes, with the library's exact
tiled algorithm, through the operator ``exactattn::attention``:

* ``attn_mask`` boolean: True = attend (``A_i = {j : mask_ij}``); floating (``query``'s
  dtype or float32): added to the scores as a bias ``B_ij`` (``−inf`` excludes the pair), with
  its gradient when ``attn_mask.requires_grad``; a ``torch.nn.attention.bias.CausalBias``
  (``causal_upper_left`` / ``causal_lower_right``): the causal band of that alignment.
  Broadcastable to ``(N, ..., Hq, L, S)``.
* ``is_causal``: ``j ≤ i`` (top-left); with an ``attn_mask`` an error, as SDPA's.
* rows with no allowed key give 0 and zero gradients (SDPA ≥ 2.5); NaN propagates along
  the pairs a row attends (no finiteness checks: none of the strict API's value checks run).
* ``dropout_p``: ``≤ 0`` none, ``1`` drops every weight (``Y = 0``), ``> 1`` an error; in
  between, the keep-bits' seed is drawn from torch's default CPU generator as the call
  starts, so ``torch.manual_seed`` reproduces a call and the backward replays its bits.
* ``scale``: a number or a 0-dim tensor (read as a number); default ``1/sqrt(E)``.
* ``sinks`` (exactattn's keyword, not SDPA's): one logit ``σ_h`` per query head, a floating
  tensor of shape ``(Hq,)``, one more term ``e^{σ_h}`` of every row's denominator only
  (gpt-oss's sink, FA4's ``learnable_sink``: :mod:`exactattn.core.sinks`); ``sinks.grad`` is
  ``∂L/∂σ``. A row with no allowed key then gives 0. Such a call runs the generic pass
  (:func:`exactattn.torch.partials.attention_with_lse`), so a floating ``attn_mask`` that
  requires grad is refused with it.

Bad input is refused as SDPA refuses it, with :class:`SDPAInputError` (a ``ValueError``
and a ``RuntimeError``, so code written against SDPA's ``RuntimeError`` still catches it)
naming the argument and the shapes; a wrong type is a ``TypeError``. The checks read only
shapes, dtypes and devices, so ``torch.compile(fullgraph=True)`` traces the call whole.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from ..core.masks import Band, Dense, causal
from . import op, partials

SEED_HIGH = 1 << 62  # keep-bit seeds are drawn uniformly from [0, 2^62)


class SDPAInputError(ValueError, RuntimeError):
    """Input SDPA refuses (it raises RuntimeError; the library's checks raise ValueError)."""


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact ``softmax(Q Kᵀ·scale + mask) V`` with SDPA's signature, shapes and semantics.

    ``query (N, ..., Hq, L, E)``, ``key (N, ..., H, S, E)``, ``value (N, ..., H, S, Ev)``
    -> ``(N, ..., Hq, L, Ev)``; ``sinks (Hq,)`` adds ``e^{σ_h}`` to each row's denominator.
    See the module docstring for each argument.
    """
    return sdpa_call(
        query, key, value, attn_mask, dropout_p, is_causal,
        scale=scale, enable_gqa=enable_gqa, sinks=sinks,
    )  # fmt: skip


def sdpa_call(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: Any = None,
    enable_gqa: bool = False,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`scaled_dot_product_attention` plus ``softcap`` (``cap·tanh(s/cap)``, Gemma 2)."""
    check_inputs(query, key, value, enable_gqa)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__} {is_causal!r}")
    scale = _scale(scale)
    if query.shape[-1] == 0:  # an empty dot product is 0 whatever c (SDPA: the mean of V)
        scale = 0.0
    p = _dropout_p(dropout_p)
    allowed = bias = None
    band = Band("top-left", None, 0) if is_causal else None
    if _is_causal_bias(attn_mask):
        band = _causal_bias_band(attn_mask, query, key, is_causal)
    elif attn_mask is not None:
        if is_causal:
            raise SDPAInputError(
                "attn_mask and is_causal=True were both given; SDPA refuses the pair "
                "(pass one: AND a causal mask into attn_mask, or use "
                "torch.nn.attention.bias.causal_lower_right for bottom-right alignment)"
            )
        check_mask(attn_mask, query, key, value, enable_gqa)
        allowed, bias = (attn_mask, None) if attn_mask.dtype == torch.bool else (None, attn_mask)
    seed = None
    if 0.0 < p < 1.0:  # the keep-bits' seed, from torch's default generator
        seed = torch.randint(0, SEED_HIGH, (), dtype=torch.int64)
    if sinks is not None:
        check_sinks(sinks, query)
        return _with_sinks(
            query, key, value, sinks, allowed, bias, band, seed, scale, p, softcap, enable_gqa
        )
    y, _ = op.attention(
        query, key, value, allowed=allowed, bias=bias, seed=seed, scale=scale, band=band,
        dropout_p=p, softcap=softcap, enable_gqa=enable_gqa,
    )  # fmt: skip
    return y


def _with_sinks(query, key, value, sinks, allowed, bias, band, seed, scale, p, softcap, gqa):
    """The call with the sink as each row's initial summary ``(σ_h, 1, 0)``, on the
    generic pass (its reverse gives ``dsinks``); SDPA's unchecked contract (empty rows 0)."""
    if bias is not None and bias.requires_grad:
        raise SDPAInputError(
            "sinks with a floating attn_mask that requires grad: the sink path computes no "
            "attn_mask gradient; detach attn_mask (or pass a boolean mask)"
        )
    mask = None if allowed is None else Dense(allowed)
    if band is not None:
        mask = causal(band.alignment) if mask is None else mask & causal(band.alignment)
    drop_all = p >= 1.0
    y, _ = partials.attention_with_lse(
        query, key, value, sinks=sinks, mask=mask, bias=bias, softcap=softcap, scale=scale,
        dropout_p=0.0 if drop_all else p, seed=None if seed is None else int(seed),
        enable_gqa=gqa, empty_rows="zero", check_finite=False,
    )  # fmt: skip
    if drop_all:  # every weight dropped: Y = 0 and every gradient 0 (masked_fill's reverse)
        y = y.masked_fill(torch.ones((), dtype=torch.bool, device=y.device), 0.0)
    return y


# --- SDPA's contract, checked on shapes, dtypes and devices only ---------------------------
def _shapes(query, key, value) -> str:
    return f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"


def check_inputs(query: Any, key: Any, value: Any, enable_gqa: bool) -> None:
    """What SDPA requires of ``query, key, value`` (and ``enable_gqa``)."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
        if x.is_nested:
            raise TypeError(f"{name} is a nested tensor; exactattn takes dense tensors")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool; got {type(enable_gqa).__name__}")
    shapes = _shapes(query, key, value)
    if not (query.dtype == key.dtype == value.dtype):
        raise SDPAInputError(
            f"query, key and value must share one dtype; got {query.dtype}, {key.dtype}, "
            f"{value.dtype}"
        )
    if not query.dtype.is_floating_point:
        raise SDPAInputError(f"query, key and value must be floating point; got {query.dtype}")
    if not (query.device == key.device == value.device):
        raise SDPAInputError(
            f"query, key and value must be on one device; got {query.device}, {key.device}, "
            f"{value.device}"
        )
    if min(query.dim(), key.dim(), value.dim()) < 2:
        raise SDPAInputError(f"query, key and value need at least 2 dims (n, E); got {shapes}")
    if query.shape[-1] != key.shape[-1]:
        raise SDPAInputError(f"query and key must share the head dim E (last axis); got {shapes}")
    if key.shape[-2] != value.shape[-2]:
        raise SDPAInputError(f"key and value must have the same length S (axis -2); got {shapes}")
    lead = 2
    if enable_gqa:
        lead = 3
        if min(query.dim(), key.dim(), value.dim()) < 3:
            raise SDPAInputError(f"enable_gqa needs a head axis (..., H, n, E); got {shapes}")
        hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
        if hk != hv or hk == 0 or hq % hk:
            raise SDPAInputError(
                "enable_gqa needs key and value with the same number of heads H (axis -3), "
                f"dividing query's Hq; got {shapes}"
            )
    try:
        torch.broadcast_shapes(*(x.shape[:-lead] for x in (query, key, value)))
    except RuntimeError:
        raise SDPAInputError(
            f"the batch dims of query, key and value do not broadcast: {shapes}"
        ) from None


def check_sinks(sinks: Any, query: torch.Tensor) -> None:
    """A floating tensor of shape ``(Hq,)`` on query's device: one sink logit per query head."""
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a torch.Tensor or None; got {type(sinks).__name__}")
    if not sinks.dtype.is_floating_point:
        raise SDPAInputError(f"sinks must be floating point; got {sinks.dtype}")
    if sinks.device != query.device:
        raise SDPAInputError(f"sinks is on {sinks.device} but query is on {query.device}; move it")
    heads = query.shape[-3] if query.dim() >= 3 else 1
    if tuple(sinks.shape) != (heads,):
        raise SDPAInputError(
            f"sinks has shape {tuple(sinks.shape)}; give one logit per query head, shape "
            f"({heads},) for query {tuple(query.shape)} (Hq is axis -3)"
        )


def check_mask(attn_mask: Any, query, key, value, enable_gqa: bool) -> None:
    """A boolean or floating mask on the inputs' device, broadcastable to ``(…, Hq, L, S)``."""
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None; got {type(attn_mask).__name__}")
    dtype = attn_mask.dtype
    if dtype != torch.bool and dtype not in (query.dtype, torch.float32):
        raise SDPAInputError(
            f"attn_mask must be bool, float32 or query's dtype {query.dtype}; got {dtype}"
        )
    if attn_mask.device != query.device:
        raise SDPAInputError(
            f"attn_mask is on {attn_mask.device} but query is on {query.device}; move it"
        )
    batch = op.batch_shape(query, key, value, enable_gqa)
    target = (*batch, query.shape[-2], key.shape[-2])
    shape = tuple(attn_mask.shape)
    ok = 2 <= len(shape) <= len(target)
    if ok:
        try:
            ok = torch.broadcast_shapes(shape, target) == torch.Size(target)
        except RuntimeError:
            ok = False
    if not ok:
        raise SDPAInputError(
            f"attn_mask has shape {shape}, which does not broadcast to the attention weights' "
            f"shape (N, ..., Hq, L, S) = {target} ({_shapes(query, key, value)})"
        )


def _is_causal_bias(x: Any) -> bool:
    """Whether ``x`` is a ``torch.nn.attention.bias.CausalBias`` (recognised by name, so
    this module does not import that one, which imports ``torch._dynamo``)."""
    return any(
        cls.__name__ == "CausalBias" and cls.__module__ == "torch.nn.attention.bias"
        for cls in type(x).__mro__
    )


def _causal_bias_band(mask: Any, query, key, is_causal: bool) -> Band:
    """The band of ``causal_upper_left(L, S)`` / ``causal_lower_right(L, S)``."""
    if is_causal:
        raise ValueError("CausalBias should not be used with causal=True")  # SDPA's words
    sizes = (query.shape[-2], key.shape[-2])
    if (mask.seq_len_q, mask.seq_len_kv) != sizes:
        raise SDPAInputError(
            f"attn_mask is a CausalBias for (L, S) = ({mask.seq_len_q}, {mask.seq_len_kv}) "
            f"but query and key have (L, S) = {sizes}"
        )
    lower_right = mask.variant.name == "LOWER_RIGHT"  # CausalVariant.LOWER_RIGHT
    return Band("bottom-right" if lower_right else "top-left", None, 0)


def _scale(scale: Any) -> float | None:
    """SDPA's ``scale``: None, a real number, or a 0-dim tensor that does not need grad."""
    if scale is None:
        return None
    if isinstance(scale, torch.Tensor):
        if scale.dim() != 0 or scale.requires_grad or scale.is_complex():
            raise TypeError(
                f"scale must be a float (or a 0-dim tensor without grad); got a tensor of "
                f"shape {tuple(scale.shape)}{' that requires grad' if scale.requires_grad else ''}"
            )
        return float(scale)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float; got {type(scale).__name__} {scale!r}")
    return float(scale)


def _dropout_p(dropout_p: Any) -> float:
    """SDPA's ``dropout_p``: ``≤ 0`` is no dropout, ``> 1`` an error."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a float; got {type(dropout_p).__name__} {dropout_p!r}")
    p = float(dropout_p)
    if p > 1.0:
        raise SDPAInputError(f"dropout_p must be between 0 and 1; got {dropout_p!r}")
    return max(p, 0.0)
