"""A small tiled attention kernel in torch with switchable bugs, in SDPA's and flash's conventions.

The kernel is the FlashAttention-2 forward written with torch ops (key blocks of
:data:`BLOCK`, running ``m, ℓ, acc``, rescale ``α = e^{m_old − m_new}``, fp32 statistics and
accumulator, ``P`` rounded to the input dtype before an fp32-accumulated ``P·V``, as a
tensor-core MMA does); autograd differentiates it (in fp32, the inputs' casts aside).
Each entry of :data:`BUGS` breaks one step the way real kernels get it wrong; ``bug=None``
is the correct kernel, which ``exactattn check`` must pass under the claim :data:`CLAIM`.
"""

from __future__ import annotations

import math

import torch

BLOCK = 4
CLAIM = f"scores=fp32,stats=fp32,acc=fp32,block={BLOCK}"  # p: the input dtype (default)

BUGS = {
    "causal-off-by-one": "the causal mask lets query i see key i + 1",
    "dropped-tail-block": "the last, partial key block is skipped",
    "no-max-subtraction": "exp(s) instead of exp(s - m): overflows at large logits",
    "wrong-scale": "scores scaled by 1/d instead of 1/sqrt(d)",
    "gqa-head-mapping": "query head h reads key/value head h % H_kv instead of h // g",
    "mask-ignored-on-partial-blocks": "a partially allowed key block is not masked",
    "rescale-skipped": "acc and l are not multiplied by alpha when the max grows",
    "fp16-accumulation": "acc and l accumulate in float16, not the claimed fp32",
    "dq-scale-in-backward": "the backward scales dQ by c twice",
    "lse-without-max": "the returned log-sum-exp is log l, without m",
}
# bugs that live at block boundaries and on the calling paths real code uses: caught by
# `exactattn check` with only --claim/--supports (tests/check/test_reach_kernels.py)
REACH_BUGS = {
    "causal-bottom-right": "is_causal aligned bottom-right (j <= i + n_k - n_q), not top-left",
    "diagonal-dropped-after-first": "blocks after the first mask the diagonal (j < i, not <=)",
    "keys-beyond-1024-ignored": "keys j >= 1024 are never read (a 32-bit tile offset cap)",
    "tail-block-short": "the partial tail block (n_k % b != 0) stops one key early",
    "rescale-acc-only-l": "between blocks l is rescaled by alpha but acc is not",
}


def _allowed(q, k, attn_mask, is_causal, bug):
    n_q, n_k = q.shape[-2], k.shape[-2]
    i = torch.arange(n_q)[:, None]
    j = torch.arange(n_k)[None, :]
    allowed = torch.ones(n_q, n_k, dtype=torch.bool)
    if is_causal:
        offset = n_k - n_q if bug == "causal-bottom-right" else 0
        allowed = j <= i + offset + (1 if bug == "causal-off-by-one" else 0)
    if attn_mask is not None:
        allowed = allowed & attn_mask
    return torch.broadcast_to(allowed, (*q.shape[:-1], n_k))


def _expand(x, heads, bug):
    h_kv = x.shape[-3]
    if h_kv == heads:
        return x
    group = heads // h_kv
    index = (
        torch.arange(heads) % h_kv if bug == "gqa-head-mapping" else torch.arange(heads) // group
    )
    return x[..., index, :, :]


def forward(
    q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, bug=None, block=BLOCK
):
    """``(y, lse)`` of the tiled kernel with key blocks of ``block`` (lse in float32)."""
    dtype = q.dtype
    n_k, d = k.shape[-2], q.shape[-1]
    c = (1 / d if bug == "wrong-scale" else 1 / math.sqrt(d)) if scale is None else scale
    wide = torch.float16 if bug == "fp16-accumulation" else torch.float32
    if bug == "dq-scale-in-backward":
        q = _ScaleGrad.apply(q, c)
    # one cast each, so the gradients of q, k, v accumulate over the key blocks (and a GQA
    # group's heads) in fp32, as FlashAttention-2's do, and round to the dtype once
    q, k = q.to(torch.float32), k.to(torch.float32)
    v = v.to(wide)
    k, v = _expand(k, q.shape[-3], bug), _expand(v, q.shape[-3], bug)
    allowed = _allowed(q, k, attn_mask, is_causal, bug)
    m = torch.full(q.shape[:-1], -math.inf, dtype=torch.float32)
    l = torch.zeros(q.shape[:-1], dtype=wide)
    acc = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=wide)
    starts = range(0, n_k, block)
    if bug == "dropped-tail-block" and n_k % block:
        starts = starts[:-1]
    if bug == "keys-beyond-1024-ignored":
        starts = [a for a in starts if a < 1024]
    for a in starts:
        stop = min(a + block, n_k)
        if bug == "keys-beyond-1024-ignored":
            stop = min(stop, 1024)
        if bug == "tail-block-short" and stop == n_k and n_k % block and stop - a > 1:
            stop -= 1
        cols = slice(a, stop)
        s = (q @ k[..., cols, :].transpose(-1, -2)) * c
        ok = allowed[..., cols]
        if bug == "diagonal-dropped-after-first" and a > 0:
            i = torch.arange(q.shape[-2])[:, None]
            ok = ok & (torch.arange(a, stop)[None, :] != i)
        partial = bool(ok.any()) and not bool(ok.all())
        if not (bug == "mask-ignored-on-partial-blocks" and partial):
            s = torch.where(ok, s, -math.inf)
        m_new = torch.maximum(m, s.amax(dim=-1))
        shift = torch.where(torch.isinf(m_new), 0.0, m_new)
        alpha = torch.exp(torch.where(torch.isinf(m), -math.inf, m - shift))
        if bug == "no-max-subtraction":  # raw exponentials, never rescaled
            shift = torch.zeros_like(shift)
            alpha = torch.where(torch.isinf(m), 0.0, torch.ones_like(alpha))
        if bug == "rescale-skipped":
            alpha = torch.where(torch.isinf(m), 0.0, torch.ones_like(alpha))
        p = torch.exp(s - shift[..., None])
        l = alpha.to(wide) * l + p.sum(dim=-1).to(wide)
        # P rounded to the input dtype in the forward only: the reverse keeps dP in fp32, as
        # FlashAttention-2's does (autograd through the cast would round dP to the dtype)
        p_cast = p.to(wide) + (p.to(dtype).to(wide) - p.to(wide)).detach()
        keep = torch.ones_like(alpha) if bug == "rescale-acc-only-l" else alpha
        acc = keep[..., None].to(wide) * acc + p_cast @ v[..., cols, :]
        m = m_new
    y = torch.where(l[..., None] > 0, acc / torch.where(l > 0, l, 1)[..., None], 0.0)
    lse = torch.where(l > 0, torch.log(l.float()) + m, -math.inf)
    if bug == "lse-without-max":
        lse = torch.where(l > 0, torch.log(l.float()), -math.inf)
    return y.to(dtype), lse


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by ``c``: dQ scaled twice."""

    @staticmethod
    def forward(ctx, q, c):
        ctx.c = c
        return q.clone()

    @staticmethod
    def backward(ctx, g):
        return g * ctx.c, None


def sdpa(bug=None, block=BLOCK):
    """The kernel with SDPA's signature, key blocks of ``block``."""

    def attention(
        q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
    ):
        assert dropout_p == 0.0
        y, _ = forward(q, k, v, attn_mask, is_causal, scale, enable_gqa, bug, block)
        return y

    return attention


def flash(bug=None):
    """The kernel with ``flash_attn_func``'s signature, returning ``(out, lse, None)``."""

    def attention(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                  return_attn_probs=False):  # fmt: skip
        assert dropout_p == 0.0
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        n_q, n_k = qt.shape[-2], kt.shape[-2]
        i = torch.arange(n_q)[:, None] + (n_k - n_q)
        j = torch.arange(n_k)[None, :]
        left, right = window_size
        allowed = torch.ones(n_q, n_k, dtype=torch.bool)
        if causal or right >= 0:
            allowed &= j <= i + (0 if causal else right)
        if left >= 0:
            allowed &= j >= i - left
        y, lse = forward(qt, kt, vt, allowed, False, softmax_scale, kt.shape[1] != qt.shape[1], bug)
        out = y.transpose(1, 2)
        return (out, lse, None) if return_attn_probs else out

    return attention
