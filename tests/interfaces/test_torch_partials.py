"""torch: split/compute/merge and sinks under autograd (y and lse both differentiable)."""

from __future__ import annotations

import numpy as np

from tests.optional import requires

torch = requires("torch")

import exactattn.torch as et
from exactattn.core import masks

from .spec import softmax_rows


def _inputs(seed=0, batch=2, heads=3, n_q=5, n_k=9):
    g = torch.Generator().manual_seed(seed)
    shapes = [(batch, heads, n_q, 4), (batch, heads, n_k, 4), (batch, heads, n_k, 2), (heads,)]
    return [torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True) for s in shapes]


def test_split_merge_with_sinks_passes_gradcheck():
    q, k, v, sinks = _inputs(batch=1, heads=2, n_q=3)
    mask = masks.causal("bottom-right")

    def split(q, k, v, sinks):
        parts = [
            et.attention_with_lse(
                q, k, v, mask=mask, key_range=r, block_size=2, sinks=sinks if r[0] == 0 else None
            )
            for r in [(0, 4), (4, 5), (5, 9)]
        ]
        y, lse = et.merge_partials(parts)
        return y, lse

    assert torch.autograd.gradcheck(split, (q, k, v, sinks))
    y, lse = split(q, k, v, sinks)
    allowed = np.arange(9)[None, :] <= np.arange(3)[:, None] + 6
    qn, kn, vn, sn = (x.detach().numpy() for x in (q, k, v, sinks))
    for b in range(1):
        for h in range(2):
            s = np.where(allowed, qn[b, h] @ kn[b, h].T / 2, -np.inf)
            y_ref, lse_ref = softmax_rows(s, vn[b, h], sn[h])
            np.testing.assert_allclose(y[b, h].detach().numpy(), y_ref, atol=1e-14)
            np.testing.assert_allclose(lse[b, h].detach().numpy(), lse_ref, atol=1e-14)


def test_lse_gradient_alone():
    q, k, v, sinks = _inputs(1)

    def lse_only(q, k, sinks):
        return et.attention_with_lse(q, k, v.detach(), sinks=sinks, block_size=4)[1]

    assert torch.autograd.gradcheck(lse_only, (q, k, sinks))


def test_half_inputs_give_float32_lse():
    q, k, v, _ = (x.detach().to(torch.float16) for x in _inputs(2))
    y, lse = et.attention_with_lse(q, k, v)
    assert y.dtype == torch.float16 and lse.dtype == torch.float32


def test_torch_attention_with_sinks_matches_the_definition_and_has_dsinks():
    q, k, v, sinks = _inputs(3)
    y = et.attention(q, k, v, sinks=sinks, is_causal=True, alignment="bottom-right")
    allowed = np.arange(9)[None, :] <= np.arange(5)[:, None] + 4
    qn, kn, vn, sn = (x.detach().numpy() for x in (q, k, v, sinks))
    for b in range(2):
        for h in range(3):
            s = np.where(allowed, qn[b, h] @ kn[b, h].T / 2, -np.inf)
            y_ref, _ = softmax_rows(s, vn[b, h], sn[h])
            np.testing.assert_allclose(y[b, h].detach().numpy(), y_ref, atol=1e-14)

    def run(q, k, v, sinks):
        return et.attention(q, k, v, sinks=sinks, is_causal=True, alignment="bottom-right")

    small = [x.detach()[:1, :2, :3].clone().requires_grad_() for x in (q, k, v)]
    assert torch.autograd.gradcheck(run, (*small, sinks.detach()[:2].clone().requires_grad_()))
