"""A tiled kernel with bf16 statistics, correct or broken in ways only the expected error sees.

FlashAttention-2's forward (running ``m, ℓ, acc``, rescale ``α = e^{m_old − m_new}``) with
every score, ``m``, ``ℓ``, ``acc``, ``p`` and the output rounded to bfloat16 after each
operation (``r``), matmuls accumulated in fp32: the claim :data:`CLAIM`. With many key
blocks (``n/b = 256``) the rigorous bound's budget is ``(1 + u)^{2n/b}`` with bf16's
``u = 2^-8``: several times Y's scale, so it passes errors a correct kernel never makes.
:data:`BUGS` are two such kernels (:mod:`exactattn.testing.suspicion` flags both):

* ``rescale-l-skipped`` — ``ℓ`` is not multiplied by ``α`` when the running max grows
  (``acc`` is): a real kernel bug (tests/check/kernels.py kills its fp32 form outright);
* ``toward-zero`` — every ``r`` truncates (rounds toward zero: the low 16 bits of the fp32
  word cleared) while the claim says round to nearest: each error of one sign, so they add
  like ``n·u`` instead of ``sqrt(n)·u``.

:func:`sdpa_grad` is a second kernel, differentiable: FlashAttention-2's forward and its
tiled reverse (:class:`_Tiled`, a ``torch.autograd.Function``) in fp32 with ``p`` and ``γ``
cast to bf16 before the products, as :data:`GRAD_CLAIM` says (the input's format for ``p``
and outputs, fp32 scores, statistics and accumulators). Its reverse runs over query tiles of
:data:`GRAD_BLOCK` rows, each tile's ``pᵀG``, ``γᵀQ`` added into the running dV, dK and its
``γK`` forming that tile's dQ. :data:`GRAD_BUGS`:

* ``dv-bf16`` — the running dV is rounded to bf16 after each tile's addition while the
  claim says fp32 (no ``qsplit``): ``n/b`` roundings of the partial sums, which the rigorous
  bound (``ū_bf16·Σ_i p_ij|G_i|`` from the cast of ``p``) lets through and the expected
  error (``sqrt`` of the roundings) does not.
"""

from __future__ import annotations

import math

import torch

from .kernels import _allowed

BLOCK = 2
CLAIM = f"scores=bf16,stats=bf16,acc=fp32,block={BLOCK}"  # input and p: the dtype (bf16)
BUGS = {
    "rescale-l-skipped": "l is not multiplied by alpha when the max grows (acc is)",
    "toward-zero": "every bf16 rounding truncates, claimed round to nearest",
}


def _nearest(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(torch.float32)


def _toward_zero(x: torch.Tensor) -> torch.Tensor:
    """bf16 by truncation: the fp32 word with its 16 low bits cleared (finite inputs)."""
    bits = x.contiguous().view(torch.int32) & -65536  # 0xFFFF0000
    return bits.view(torch.float32)


def forward(q, k, v, attn_mask=None, is_causal=False, scale=None, bug=None, block=BLOCK):
    """Y in the input dtype, of the tiled forward with bf16 statistics (module docstring)."""
    r = _toward_zero if bug == "toward-zero" else _nearest
    dtype = q.dtype
    n_k, d = k.shape[-2], q.shape[-1]
    c = 1 / math.sqrt(d) if scale is None else scale
    allowed = _allowed(q, k, attn_mask, is_causal, None)
    q, k, v = (x.to(torch.float32) for x in (q, k, v))
    m = torch.full(q.shape[:-1], -math.inf)
    ell = torch.zeros(q.shape[:-1])
    acc = torch.zeros((*q.shape[:-1], v.shape[-1]))
    for start in range(0, n_k, block):
        j = slice(start, min(start + block, n_k))
        s = r(c * (q @ k[..., j, :].transpose(-1, -2)))
        s = torch.where(allowed[..., j], s, -math.inf)
        m_new = torch.maximum(m, s.amax(-1))
        safe = torch.where(torch.isinf(m_new), 0.0, m_new)
        alpha = torch.where(torch.isinf(m), 0.0, r(torch.exp(r(m - safe))))
        p = r(torch.exp(r(s - safe[..., None])))
        kept = ell if bug == "rescale-l-skipped" else r(alpha * ell)
        ell = r(kept + r(p.sum(-1)))
        acc = r(r(alpha[..., None] * acc) + r(p @ v[..., j, :]))
        m = m_new
    return (acc / ell[..., None]).to(dtype)


def sdpa(bug=None, block=BLOCK):
    """The kernel with SDPA's signature (forward only)."""

    def attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
        return forward(q, k, v, attn_mask, is_causal, scale, bug=bug, block=block)

    return attention


GRAD_BLOCK = 8
GRAD_CLAIM = f"scores=fp32,stats=fp32,acc=fp32,block={GRAD_BLOCK}"  # input, p: bf16
GRAD_BUGS = {"dv-bf16": "the running dV is rounded to bf16 after each query tile (claimed fp32)"}


class _Tiled(torch.autograd.Function):
    """FlashAttention-2 in fp32 with bf16 ``p`` and ``γ`` casts (module docstring)."""

    @staticmethod
    def forward(fn_ctx, q, k, v, allowed, c, bug, block):
        dtype = q.dtype
        q, k, v = (x.to(torch.float32) for x in (q, k, v))
        n_k = k.shape[-2]
        m = torch.full(q.shape[:-1], -math.inf)
        ell = torch.zeros(q.shape[:-1])
        acc = torch.zeros((*q.shape[:-1], v.shape[-1]))
        for start in range(0, n_k, block):
            j = slice(start, min(start + block, n_k))
            s = torch.where(allowed[..., j], c * (q @ k[..., j, :].transpose(-1, -2)), -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            safe = torch.where(torch.isinf(m_new), 0.0, m_new)
            alpha = torch.where(torch.isinf(m), 0.0, torch.exp(m - safe))
            p = torch.exp(s - safe[..., None])
            ell = alpha * ell + p.sum(-1)
            acc = alpha[..., None] * acc + _nearest(p) @ v[..., j, :]
            m = m_new
        y = (acc / ell[..., None]).to(dtype)
        fn_ctx.save_for_backward(q, k, v, y, m, ell, allowed)
        fn_ctx.c, fn_ctx.bug, fn_ctx.block = c, bug, block
        return y

    @staticmethod
    def backward(fn_ctx, gy):
        q, k, v, y, m, ell, allowed = fn_ctx.saved_tensors
        c, bug, block = fn_ctx.c, fn_ctx.bug, fn_ctx.block
        g = gy.to(torch.float32)
        delta = (g * y.to(torch.float32)).sum(-1)  # δ = G·Y from the stored Y
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for start in range(0, q.shape[-2], block):  # query tiles
            i = slice(start, min(start + block, q.shape[-2]))
            s = torch.where(allowed[..., i, :], c * (q[..., i, :] @ k.transpose(-1, -2)), -math.inf)
            p = torch.exp(s - m[..., i, None]) / ell[..., i, None]  # from the frozen m, ℓ
            dv = dv + _nearest(p).transpose(-1, -2) @ g[..., i, :]
            if bug == "dv-bf16":
                dv = _nearest(dv)
            gamma = _nearest(p * (g[..., i, :] @ v.transpose(-1, -2) - delta[..., i, None]))
            dk = dk + c * (gamma.transpose(-1, -2) @ q[..., i, :])
            dq[..., i, :] = c * (gamma @ k)
        dtype = gy.dtype
        return dq.to(dtype), dk.to(dtype), dv.to(dtype), None, None, None, None


def sdpa_grad(bug=None, block=GRAD_BLOCK):
    """The differentiable kernel with SDPA's signature (module docstring)."""

    def attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
        c = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        allowed = _allowed(q, k, attn_mask, is_causal, None)
        return _Tiled.apply(q, k, v, allowed, c, bug, block)

    return attention
