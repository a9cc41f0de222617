"""``AuxRequest(max_scores=True)``: the row maximum of the modified, masked scores.

FlexAttention's definition (its eager reference ``math_attention`` in
``torch/_higher_order_ops/flex_attention.py``): ``post_mod_scores`` are ``scale·QKᵀ`` in
the working precision (float64 for float64 inputs, float32 otherwise), then ``score_mod``,
then ``−∞`` where the mask is False; ``max_scores = torch.max(post_mod_scores, -1)``, so a
row with no allowed key has ``−∞``; natural units (the kernel's base-2 value is scaled back
by ``ln 2``); not differentiable. The spec below is that definition on dense tensors.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.optional import requires

torch = requires("torch")
from torch.nn.attention.flex_attention import AuxRequest

from exactattn.core import masks
from exactattn.torch import flex_attention

SLOPES = torch.tensor([1.0, 0.5, 0.25, 0.125], dtype=torch.float64)


def alibi(score, b, h, q_idx, kv_idx):
    return score + SLOPES[h] * (kv_idx - q_idx)


def gappy(b, h, q_idx, kv_idx):
    """Every third key, and nothing for query row 5 (an empty row)."""
    return ((kv_idx + q_idx) % 3 != 0) & (q_idx != 5)


def spec_max(q, k, scale, mod=None, allowed=None):
    """``max_j`` of ``mod(scale·q·k)`` with ``−∞`` where not allowed; q (B, H, L, E)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = scale * (q.to(work) @ k.to(work).transpose(-1, -2))
    i = torch.arange(q.shape[2])[:, None]
    j = torch.arange(k.shape[2])[None, :]
    if mod == "alibi":
        s = s + SLOPES[: q.shape[1], None, None].to(work) * (j - i)
    if allowed is not None:
        s = torch.where(allowed(i, j), s, -torch.inf)
    return s.max(dim=-1).values


def _qkv(n_q, n_k, heads=4, heads_kv=2, dtype=torch.float64, seed=0):
    rng = np.random.default_rng(seed)
    shapes = ((1, heads, n_q, 8), (1, heads_kv, n_k, 8), (1, heads_kv, n_k, 3))
    return tuple(torch.from_numpy(2 * rng.standard_normal(x)).to(dtype) for x in shapes)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_max_scores_is_the_row_max_of_the_modified_masked_scores(dtype):
    # n_k = 700 with 1200 rows is two key blocks of 512; GQA; row 5 has no allowed key
    q, k, v = _qkv(300, 700, dtype=dtype)
    _out, aux = flex_attention(
        q, k, v, alibi, gappy, enable_gqa=True, return_aux=AuxRequest(lse=True, max_scores=True)
    )
    want = spec_max(q, k, 8**-0.5, "alibi", lambda i, j: ((j + i) % 3 != 0) & (i != 5))
    assert aux.max_scores.dtype == want.dtype and aux.max_scores.shape == (1, 4, 300)
    atol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(aux.max_scores, want, atol=atol, rtol=0)
    assert torch.isneginf(aux.max_scores[..., 5]).all()
    assert (aux.lse >= aux.max_scores).all()  # the lse is at least its largest term


def test_max_scores_alone_with_gradients_and_in_pieces():
    # 8 heads · 512 rows · 600 keys runs as independent pieces of heads (passes.pieces)
    q, k, v = _qkv(512, 600, heads=8, heads_kv=8, seed=1)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, aux = flex_attention(
        *leaves, block_mask=masks.causal(), return_aux=AuxRequest(max_scores=True)
    )
    assert aux.lse is None and not aux.max_scores.requires_grad
    want = spec_max(q, k, 8**-0.5, allowed=lambda i, j: j <= i)
    torch.testing.assert_close(aux.max_scores, want, atol=1e-12, rtol=0)
    plain = flex_attention(*leaves, block_mask=masks.causal())
    torch.testing.assert_close(out, plain, atol=0, rtol=0)
    grads = torch.autograd.grad(out.sum(), leaves)
    want_grads = torch.autograd.grad(plain.sum(), leaves)
    for got, exp in zip(grads, want_grads):
        torch.testing.assert_close(got, exp, atol=0, rtol=0)


def test_a_wrong_max_is_caught():
    """The comparison can fail: the max of the unmodified scores is off by the ALiBi term."""
    q, k, v = _qkv(12, 20)
    _out, aux = flex_attention(
        q, k, v, alibi, enable_gqa=True, return_aux=AuxRequest(max_scores=True)
    )
    unmodified = spec_max(q, k, 8**-0.5)
    assert (aux.max_scores - unmodified).abs().max() > 0.1
