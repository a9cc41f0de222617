"""A user's FP8 attention kernel, written as a kernel author would (torch, SDPA's signature),
and its broken twin: the check must pass the one under its one-line claim
(:data:`CLAIM`, which states its quantiser) and fail the other.

What it does (FlashAttention-3's FP8 forward, §3.3, in plain torch): Q, K and V quantised
to e4m3 with one fp32 scale per block of :data:`BLOCK` rows (``amax/448``, clamped to ±448
before the cast); the online softmax over key blocks of :data:`BLOCK` in fp32
(``m``, ``ℓ``, ``acc``); ``p`` cast to e4m3 (no scale: ``p ≤ 1``) before ``p·V``, the
product accumulated in fp32. ``bug="wrong-block-scale"``: each block of rows is divided by
the *next* block's scale (an off-by-one in the scale index), the classic bug of a
block-quantised kernel.
"""

from __future__ import annotations

import torch

BLOCK = 64
E4M3_MAX = 448.0
# its quantiser stated (amax/448 per block, to nearest): judged at its quantised inputs
CLAIM = (
    "q=e4m3:block64,k=e4m3:block64,v=e4m3:block64,p=e4m3,scores=fp32,stats=fp32,acc=fp32,"
    "block=64,quantiser=nearest"
)
CLAIM_ANY = CLAIM.removesuffix(",quantiser=nearest")  # any quantiser within e4m3's error
SUPPORTS = "dropout=no,gqa=no,empty_rows=no,grads=no"


def _to_e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def quantize_blocks(x: torch.Tensor, rows: int, bug: str | None = None) -> torch.Tensor:
    """``s·e4m3(x/s)`` with one scale ``s = amax/448`` per block of ``rows`` rows."""
    n = x.shape[-2]
    starts = list(range(0, n, rows))
    scales = []
    for start in starts:
        amax = x[..., start : start + rows, :].abs().amax(dim=(-2, -1), keepdim=True)
        scales.append(torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)))
    out = torch.empty_like(x)
    for i, start in enumerate(starts):
        s = scales[(i + 1) % len(starts)] if bug == "wrong-block-scale" else scales[i]
        out[..., start : start + rows, :] = _to_e4m3(x[..., start : start + rows, :] / s) * s
    return out


def fp8_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, bug=None
):
    """FP8 attention (module docstring) in SDPA's signature; float32 in and out."""
    if dropout_p:
        raise NotImplementedError("no dropout")
    q, k, v = (x.to(torch.float32) for x in (query, key, value))
    n_q, n_k = q.shape[-2], k.shape[-2]
    c = q.shape[-1] ** -0.5 if scale is None else scale
    q8, k8, v8 = (quantize_blocks(x, BLOCK, bug) for x in (q, k, v))
    if is_causal:
        attn_mask = torch.ones(n_q, n_k, dtype=torch.bool).tril()
    m = torch.full(q.shape[:-1], -torch.inf)
    l = torch.zeros(q.shape[:-1])
    acc = torch.zeros(*q.shape[:-1], v.shape[-1])
    for start in range(0, n_k, BLOCK):
        keys = slice(start, start + BLOCK)
        s = (q8 @ k8[..., keys, :].transpose(-1, -2)) * c
        if attn_mask is not None:
            allowed = attn_mask[..., keys]
            s = s.masked_fill(~allowed, -torch.inf) if allowed.dtype == torch.bool else s + allowed
        m_new = torch.maximum(m, s.amax(dim=-1))
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - shift)
        p = torch.exp(s - shift[..., None])
        l = l * alpha + p.sum(dim=-1)
        acc = acc * alpha[..., None] + _to_e4m3(p) @ v8[..., keys, :]
        m = m_new
    return (acc / l[..., None]).to(query.dtype)
