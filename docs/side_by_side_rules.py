"""The three peers' tolerance rules and their references, written from their test files.

Each reference is the peer's own definition, in torch; none calls exactattn.

* flash-attn (``tests/test_flash_attn.py`` at v2.8.3, ``attention_ref``): ``ref`` in fp32
  from upcast inputs, ``pt`` in the input dtype with ``reorder_ops=True`` (``k/√d`` instead
  of ``q/√d``); the rule ``max|out − ref| ≤ mult·max|pt − ref| + atol``.
* PyTorch (``test/test_transformers.py`` at 00030eb8, ``get_tolerances``): ``ref`` the
  math SDPA in a higher precision (fp32 for fp16/bf16, fp64 for fp32), ``lp`` the math
  SDPA in the input dtype; ``atol = fudge·max(max|ref − lp|, default_atol)``, ``rtol =
  fudge·max(max|ref − lp|/|ref|, default_rtol)``; ``assertEqual(out, ref, atol, rtol)``.
* FlexAttention (``test/inductor/test_flex_attention.py`` at 00125ef3, ``_check_equal``):
  ``golden`` in fp64, ``ref`` the eager low-precision result; ``mean|golden − out| ≤
  fudge·mean|golden − ref|`` with fudge 1.1 (fp16/bf16) and 10 (fp32); NaN fails.
"""

from __future__ import annotations

import math

import torch

# --- flash-attn ------------------------------------------------------------------------------


def flash_attn_ref(q, k, v, allowed, scale=None, upcast=True, reorder_ops=False):
    """``attention_ref``: ``q (B, n_q, H, d)``, ``k, v (B, n_k, H_kv, d)``, ``allowed``
    broadcastable to ``(B, H, n_q, n_k)``; rows with no allowed key give 0."""
    dtype_og = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    g = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    c = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    if not reorder_ops:
        scores = torch.einsum("bthd,bshd->bhts", q * c, k)
    else:
        scores = torch.einsum("bthd,bshd->bhts", q, k * c)
    scores = scores.masked_fill(~allowed, float("-inf"))
    attention = torch.softmax(scores, dim=-1).to(v.dtype)
    attention = attention.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
    return torch.einsum("bhts,bshd->bthd", attention, v).to(dtype_og)


def flash_attn_rule(out, ref, pt, mult=2.0, atol=0.0) -> bool:
    """``(out - out_ref).abs().max().item() <= mult * (out_pt - out_ref).abs().max().item()
    + atol`` (a NaN on the left fails, as the comparison is False)."""
    return bool((out - ref).abs().max().item() <= mult * (pt - ref).abs().max().item() + atol)


# --- PyTorch test_transformers ---------------------------------------------------------------
DEFAULT_ATOL = {torch.float16: 1e-3, torch.bfloat16: 1e-3, torch.float32: 1e-5}
DEFAULT_RTOL = {torch.float16: 1e-3, torch.bfloat16: 1.6e-2, torch.float32: 1.3e-6}


def torch_higher_precision(dtype: torch.dtype) -> torch.dtype:
    """``torch.float64 if dtype == torch.float32 else torch.float32``."""
    return torch.float64 if dtype == torch.float32 else torch.float32


def torch_math_ref(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """The math SDPA (``SDPBackend.MATH``) on ``(B, H, n, d)``: the test's reference."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )


def torch_tolerances(ref, lp, fudge=1.0) -> tuple[float, float]:
    """``get_tolerances(true_value, computed_value, fudge_factor)``."""
    deviation = ref - lp
    atol = deviation.abs().max().item()
    relative = torch.nan_to_num(torch.abs(deviation / ref), nan=DEFAULT_RTOL[lp.dtype])
    rtol = relative.max().item()
    atol = fudge * max(atol, DEFAULT_ATOL[lp.dtype])
    rtol = fudge * max(rtol, DEFAULT_RTOL[lp.dtype])
    if rtol > 1e30:
        rtol = DEFAULT_RTOL[lp.dtype]
    return atol, rtol


def torch_rule(out, ref, lp, fudge=1.0) -> bool:
    """``self.assertEqual(out, out_ref.to(out.dtype), atol=..., rtol=...)``: every element
    within ``atol + rtol·|ref|`` (NaN only where the reference is NaN)."""
    atol, rtol = torch_tolerances(ref, lp, fudge)
    return bool(torch.isclose(out, ref.to(out.dtype), rtol=rtol, atol=atol, equal_nan=True).all())


# --- FlexAttention ---------------------------------------------------------------------------


def flex_math_ref(q, k, v, allowed, scale=None):
    """Eager flex attention on ``(B, H, n, d)`` (``math_attention``: scores in fp32, fp64 for
    fp64 inputs, ``P`` cast to the input dtype before ``P·V``); empty rows give 0."""
    working = torch.float64 if q.dtype == torch.float64 else torch.float32
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    c = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)).to(working) * c
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    p = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse))
    return p.to(q.dtype) @ v


def flex_fudge(dtype: torch.dtype) -> float:
    """``fudge_factor = 10.0`` for float32, else ``1.1`` (``_check_out_and_grad``)."""
    return 10.0 if dtype == torch.float32 else 1.1


def flex_rule(out, golden, ref, fudge) -> bool:
    """``_check_equal``: fails on NaN, or ``compiled_error > ref_error * fudge_factor``."""
    compiled_error = (golden - out).abs().mean()
    ref_error = (golden - ref).abs().mean()
    if torch.isnan(compiled_error) or torch.isnan(ref_error):
        return False
    return bool(compiled_error <= ref_error * fudge)
