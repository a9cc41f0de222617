"""A stand-in for ``sageattention`` (1.0.6): ``sageattn`` in plain torch, from the definition
of its scheme, and broken twins. Nothing here calls exactattn.

The scheme (``sageattention/core.py`` ``sageattn``, ``quant_per_block.py``,
``attn_qk_int8_per_block*.py``): K smoothed by its mean over tokens in the input dtype,
V cast to float16; Q (times ``sm_scale·log₂e``) and K quantised to int8 per block of 128 and
64 rows, ``scale = max|x|/127`` in float32, rounded half away from zero; scores
``(q_int8·k_int8)·q_scale·k_scale`` in float32 (base 2); an online softmax over key tiles
of 64 in float32, ``p`` in float16, each tile's ``P·V`` rounded to float16 and added to a
float32 accumulator; ``acc/ℓ`` in the input dtype. Causal: key ``j`` for query ``i ≤ j``
excluded, square only.
"""

from __future__ import annotations

import importlib.machinery
import math
import types

import torch

BLOCK_Q, BLOCK_K = 128, 64
LOG2E = 1.44269504  # the constant quant_per_block.py multiplies sm_scale by


def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, smooth_k=True, **kw):
    """SageAttention's scheme (module docstring), its refusals with its messages."""
    return _attention(q, k, v, tensor_layout, is_causal, sm_scale, smooth_k)


def _attention(
    q, k, v, layout, is_causal, sm_scale, smooth_k, *, k_blocks=None, ahead=0, v_mean=False
):
    dtype = q.dtype
    floats = (torch.float16, torch.bfloat16, torch.float32)
    assert dtype in floats, (
        "Input tensors must be in dtype of torch.float16, torch.bfloat16, or torch.float32."
    )
    d = q.size(-1)
    assert d in [64, 96, 128], "headdim should be in [64, 96, 128]."
    if layout == "NHD":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    n_q, n_k = q.shape[-2], k.shape[-2]
    if is_causal:
        assert n_q == n_k, "qo_len and kv_len must be equal for causal attention"
    if smooth_k:
        k = k - k.mean(dim=-2, keepdim=True)  # in the input dtype, as sageattn's k -= km
    if v_mean:  # broken: V "smoothed" too, its mean never added back
        v = v - v.mean(dim=-2, keepdim=True)
    v16 = v.to(torch.float16)
    scale = d**-0.5 if sm_scale is None else sm_scale
    qi, qs = _quantised(q.float() * (scale * LOG2E), BLOCK_Q)
    ki, ks = _quantised(k.float(), BLOCK_K, k_blocks)
    group = q.shape[1] // k.shape[1]
    ki, ks, v16 = (x.repeat_interleave(group, dim=1) for x in (ki, ks, v16))
    s = (qi.double() @ ki.double().transpose(-1, -2)).float() * qs * ks.transpose(-1, -2)
    if is_causal:
        keep = torch.ones(n_q, n_k, dtype=torch.bool).tril(ahead)
        s = s.masked_fill(~keep, -math.inf)
    m = torch.full((*s.shape[:-1], 1), -math.inf)
    l = torch.zeros_like(m)
    acc = torch.zeros((*s.shape[:-1], v.shape[-1]))
    for start in range(0, n_k, BLOCK_K):
        tile = s[..., start : start + BLOCK_K]
        m_new = torch.maximum(m, tile.amax(-1, keepdim=True))
        alpha = torch.exp2(m - m_new)
        p = torch.exp2(tile - m_new)
        l = l * alpha + p.sum(-1, keepdim=True)
        pv = p.half().float() @ v16[..., start : start + BLOCK_K, :].float()
        acc = acc * alpha + pv.half().float()
        m = m_new
    out = (acc / l).to(dtype)
    return out.transpose(1, 2) if layout == "NHD" else out


def _quantised(x, rows, boundaries=None):
    """``x`` (float32, ``(B, H, n, d)``) as int8 values (held in float32) per block of
    ``rows`` rows and each row's block scale ``max|x|/127``; ``boundaries`` (broken twin):
    the integers from blocks starting there, the scales from the aligned blocks."""
    n = x.shape[-2]
    ints, _ = _grid(x, _starts(n, rows) if boundaries is None else boundaries(n, rows))
    return ints, _grid(x, _starts(n, rows))[1]


def _grid(x, starts):
    ints, scales = torch.empty_like(x), torch.empty((*x.shape[:-1], 1))
    for lo, hi in zip(starts, [*starts[1:], x.shape[-2]]):
        block = x[..., lo:hi, :]
        scale = block.abs().amax(dim=(-2, -1), keepdim=True) / 127.0
        r = torch.where(scale > 0, block / scale, 0.0)
        ints[..., lo:hi, :] = torch.trunc(r + 0.5 * torch.where(r >= 0, 1.0, -1.0))
        scales[..., lo:hi, :] = scale
    return ints, scales


def _starts(n, rows):
    return list(range(0, n, rows))


def _shifted(n, rows):
    """Blocks one row late: ``[0, 1), [1, rows + 1), …``."""
    return [0, *range(1, n, rows)]


def _module(fn) -> types.ModuleType:
    """``fn`` as the ``sageattn`` of a module called ``sageattention``."""
    module = types.ModuleType("sageattention")
    module.__spec__ = importlib.machinery.ModuleSpec("sageattention", None)
    module.sageattn = fn
    return module


def _broken(**how):
    def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, smooth_k=True, **kw):
        return _attention(q, k, v, tensor_layout, is_causal, sm_scale, smooth_k, **how)

    return sageattn


GOOD = _module(sageattn)
BROKEN = {
    "k-blocks-off-by-one": _module(_broken(k_blocks=_shifted)),  # ints and scales misaligned
    "causal-one-ahead": _module(_broken(ahead=1)),  # key i + 1 allowed for query i
    "v-smoothed": _module(_broken(v_mean=True)),  # the smoothing applied to V, not restored
}
