"""``sinks=`` in the SDPA drop-in against gpt-oss's reference, forward and gradients.

The spec is gpt-oss's ``sdpa`` (``gpt_oss/torch/model.py``): the sink logit of each head is
concatenated as one more column of the masked scores, the softmax taken over the row, and
the column dropped before the product with ``V``. Written here with torch operations on
float64 tensors (torch's autograd differentiates the spec); nothing here calls exactattn
but the function under test. ``n_k = 600`` is three key blocks of the generic pass
(``b = 256``); ``n_q ≠ n_k``; grouped heads; boolean, floating and causal masks.
"""

from __future__ import annotations

import pytest

from tests.optional import requires

torch = requires("torch")

from torch.nn.attention.bias import causal_lower_right

import exactattn.torch as et
from exactattn.torch.sdpa import SDPAInputError


def gpt_oss_sinks(q, k, v, sinks, add=None, scale=None):
    """``softmax([s | σ_h])[..., :-1] @ V`` with ``s = c·QKᵀ + add`` (−inf excludes)."""
    group = q.shape[-3] // k.shape[-3]
    k, v = (x.repeat_interleave(group, dim=-3) for x in (k, v))
    c = q.shape[-1] ** -0.5 if scale is None else scale
    s = c * q @ k.transpose(-1, -2)
    if add is not None:
        s = s + add
    column = sinks.reshape(-1, 1, 1).expand(*s.shape[:-1], 1)
    w = torch.softmax(torch.cat([s, column], dim=-1), dim=-1)[..., :-1]
    return w @ v


def _inputs(n_q=40, n_k=600, heads=4, kv_heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, n_q, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, kv_heads, n_k, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, kv_heads, n_k, 5, generator=g, dtype=torch.float64)
    sinks = 3 * torch.randn(heads, generator=g, dtype=torch.float64)
    return q, k, v, sinks


def _masks(n_q, n_k):
    """(SDPA keywords, the additive table the spec adds), each from its definition."""
    i, j = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
    allowed = (i * 7 + j * 3) % 5 != 0
    allowed[3] = False  # a row with no key: the sink takes all the weight, Y = 0
    g = torch.Generator().manual_seed(5)
    bias = torch.randn(n_q, n_k, generator=g, dtype=torch.float64)
    ninf = torch.tensor(-torch.inf, dtype=torch.float64)
    zero = torch.tensor(0.0, dtype=torch.float64)
    return {
        "none": ({}, None),
        "causal": ({"is_causal": True}, torch.where(j <= i, zero, ninf)),
        "bool": ({"attn_mask": allowed}, torch.where(allowed, zero, ninf)),
        "float": ({"attn_mask": bias}, bias),
        "lower_right": (
            {"attn_mask": causal_lower_right(n_q, n_k)},
            torch.where(j <= i + n_k - n_q, zero, ninf),
        ),
    }


@pytest.mark.parametrize("kind", ["none", "causal", "bool", "float", "lower_right"])
def test_sdpa_sinks_forward_and_gradients_equal_gpt_oss(kind):
    q, k, v, sinks = _inputs()
    keywords, add = _masks(q.shape[-2], k.shape[-2])[kind]
    leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    y = et.scaled_dot_product_attention(*leaves[:3], **keywords, enable_gqa=True, sinks=leaves[3])
    ref_leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    y_ref = gpt_oss_sinks(*ref_leaves, add)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-13)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads = torch.autograd.grad(y, leaves, g)
    grads_ref = torch.autograd.grad(y_ref, ref_leaves, g)
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11, msg=name)


def test_sinks_matter_at_the_tolerance_used():
    """The comparison above can fail: the same call without the sink is far off gpt-oss's."""
    q, k, v, sinks = _inputs(n_q=8, n_k=30)
    y_ref = gpt_oss_sinks(q, k, v, sinks)
    y_without = gpt_oss_sinks(q, k, v, torch.full_like(sinks, -torch.inf))
    assert (y_ref - y_without).abs().max() > 1e-3
    y = et.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=sinks)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-13)


def test_sdpa_sinks_with_dropout_replays_and_scale_softcap():
    q, k, v, sinks = _inputs(n_q=6, n_k=20)
    torch.manual_seed(3)
    a = et.scaled_dot_product_attention(q, k, v, dropout_p=0.3, enable_gqa=True, sinks=sinks)
    torch.manual_seed(3)
    b = et.scaled_dot_product_attention(q, k, v, dropout_p=0.3, enable_gqa=True, sinks=sinks)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.allclose(a, gpt_oss_sinks(q, k, v, sinks))
    y = et.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True, sinks=sinks)
    torch.testing.assert_close(y, gpt_oss_sinks(q, k, v, sinks, scale=0.3), rtol=0, atol=1e-13)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    y = et.scaled_dot_product_attention(
        *leaves[:3], dropout_p=1.0, enable_gqa=True, sinks=leaves[3]
    )
    assert (y == 0).all()
    grads = torch.autograd.grad(y.sum(), leaves)
    assert all((g == 0).all() for g in grads)


@pytest.mark.parametrize(
    ("sinks", "error", "words"),
    [
        ([0.0, 1.0, 2.0, 3.0], TypeError, "sinks must be a torch.Tensor"),
        (torch.zeros(3, dtype=torch.float64), SDPAInputError, r"shape \(4,\)"),
        (torch.zeros(4, dtype=torch.int64), SDPAInputError, "floating point"),
    ],
)
def test_bad_sinks_are_refused_naming_the_argument(sinks, error, words):
    q, k, v, _ = _inputs(n_q=4, n_k=6)
    with pytest.raises(error, match=words):
        et.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=sinks)


def test_sinks_with_an_attn_mask_that_requires_grad_is_refused():
    q, k, v, sinks = _inputs(n_q=4, n_k=6)
    bias = torch.zeros(4, 6, dtype=torch.float64, requires_grad=True)
    with pytest.raises(SDPAInputError, match="attn_mask"):
        et.scaled_dot_product_attention(q, k, v, bias, enable_gqa=True, sinks=sinks)
