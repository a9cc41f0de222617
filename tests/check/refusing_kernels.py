"""Kernels that refuse some inputs the way libraries do, for the unsupported-is-not-wrong tests.

Each is torch's SDPA (math backend) behind a guard: :func:`no_dropout` raises
``NotImplementedError`` for dropout and for bfloat16, :func:`no_negative_scale` raises a
``ValueError`` with a library-style message for a negative scale (a refusal only where the
target's claim names it), :func:`wrong_on_negative_scale` returns wrong numbers there, and
:func:`detached` gives no gradients; :func:`ignores_scale` is simply wrong (it always uses
``1/√d``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

NEGATIVE = "scale must be greater than 0 if specified"  # ONNX Runtime's CPU Attention text


def _math(q, k, v, **kwargs):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def no_dropout(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    if dropout_p:
        raise NotImplementedError("this kernel has no dropout")
    if q.dtype == torch.bfloat16:
        raise NotImplementedError("no bfloat16 kernel on this device")
    return _math(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


def no_negative_scale(q, k, v, attn_mask=None, is_causal=False, scale=None):
    if scale is not None and scale <= 0:
        raise ValueError(NEGATIVE)
    return _math(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


def wrong_on_negative_scale(q, k, v, attn_mask=None, is_causal=False, scale=None):
    if scale is not None and scale <= 0:
        scale = -scale
    return _math(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


def detached(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """A forward-only kernel: its output leaves autograd's graph (numpy round trip)."""
    y = _math(
        q.detach(), k.detach(), v.detach(), attn_mask=attn_mask, is_causal=is_causal, scale=scale
    )
    return torch.from_numpy(y.numpy().copy())


def ignores_scale(q, k, v, attn_mask=None, is_causal=False, scale=None):
    return _math(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def nan_on_empty_rows(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """A plain softmax: exp(s − max) / ℓ over the allowed keys, so a row with none is 0/0."""
    c = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * c
    allowed = torch.ones(s.shape[-2:], dtype=torch.bool)
    if is_causal:
        allowed = torch.ones_like(allowed).tril()
    if attn_mask is not None:
        allowed = allowed & attn_mask if attn_mask.dtype == torch.bool else allowed
        s = s if attn_mask.dtype == torch.bool else s + attn_mask
    s = s.masked_fill(~allowed, -torch.inf)
    return torch.softmax(s, dim=-1) @ v
