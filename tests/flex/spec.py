"""The specification side of the FlexAttention tests, written from the definitions alone.

Nothing here calls exactattn. Masks are inequalities on ``(b, h, i, j)`` written with NumPy
broadcasting over the whole grid; biases are formulas; attention is the materialised
textbook computation in torch float64, and its gradients are torch autograd's derivatives
of that formula::

    s_ij  = c·q_i·k_j,   s_ij ← cap·tanh(s_ij / cap) (softcap),   s_ij ← s_ij + B_ij (bias),
    s_ij  = −∞ where j ∉ A_i,   Y_i = softmax_i(s) V,   lse_i = log Σ_j e^{s_ij}

(rows with no allowed key: Y = 0, lse = −∞). For a mask plus an additive bias the same is
also torch's own SDPA with ``attn_mask = B`` set to −∞ off ``A_i``, materialised by hand.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def grid(batch: int, heads: int, n_q: int, n_k: int) -> tuple[np.ndarray, ...]:
    """``b, h, i, j`` broadcasting to ``(B, H, n_q, n_k)``."""
    return (
        np.arange(batch)[:, None, None, None],
        np.arange(heads)[None, :, None, None],
        np.arange(n_q)[None, None, :, None],
        np.arange(n_k)[None, None, None, :],
    )


def naive(q, k, v, allowed, bias=None, softcap=None, scale=None):
    """``(Y, lse)`` of the formula above; differentiable in q, k, v and a bias tensor.

    ``allowed`` (bool) and ``bias`` broadcast to ``(B, H, n_q, n_k)``; k, v may have fewer
    heads (grouped-query attention: head h reads key/value head h // (H / H_kv)).
    """
    group = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
    c = q.shape[-1] ** -0.5 if scale is None else scale
    s = c * q @ k.transpose(-1, -2)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    allowed = torch.from_numpy(np.array(allowed, dtype=bool)).expand(s.shape)
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    empty = torch.isneginf(lse)
    p = torch.exp(s - torch.where(empty, 0.0, lse)[..., None])
    return p @ v, lse


def sdpa(q, k, v, allowed, bias=None, scale=None):
    """torch's SDPA with the mask and the bias materialised as a float ``attn_mask``."""
    allowed = torch.from_numpy(np.array(allowed, dtype=bool))
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    zero = torch.zeros(shape, dtype=q.dtype)
    attn_mask = (zero if bias is None else zero + bias).masked_fill(~allowed, float("-inf"))
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )


def value_and_grads(fn, q, k, v, g, *extra):
    """``(Y, dq, dk, dv, *d extra)`` of ``Y = fn(q, k, v, *extra)`` at the upstream ``g``."""
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, *extra)]
    y = fn(*leaves)
    y = y[0] if isinstance(y, tuple) else y
    return (y.detach(), *torch.autograd.grad(y, leaves, g))
