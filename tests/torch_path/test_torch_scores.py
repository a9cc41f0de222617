"""attention()'s score modifications on torch (bias tensor or function, softcap) and the
planner's key-block choice, against the definition written out here in torch."""

from __future__ import annotations

import math

import pytest

from tests.optional import requires

torch = requires("torch")

import exactattn.torch as et
from exactattn.core import masks
from exactattn.torch import passes

from .helpers import assert_close, qkv, randn


def _naive(q, k, v, bias=None, cap=None, allowed=None):
    """softmax(mod(c·q·kᵀ) on A_i) v with mod = softcap then bias, by the definition."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = s.masked_fill(~allowed, -math.inf)
    return torch.softmax(s, dim=-1) @ v


CASES = {
    "bias": {"bias": True},
    "softcap": {"softcap": 1.5},
    "both-causal": {"bias": True, "softcap": 0.8, "is_causal": True},
    "bias-fn-predicate": {"bias": "fn", "mask": "predicate"},
    "bias-predicate": {"bias": True, "mask": "predicate"},  # a bias tensor off the op path
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_score_modifications_match_the_definition(case):
    options = CASES[case]
    q, k, v = qkv((2, 2, 5, 4), (2, 2, 6, 4), (2, 2, 6, 3), seed=3)
    bias = randn(2, 1, 5, 6, seed=4, grad=True)
    allowed = torch.ones(5, 6, dtype=torch.bool)
    keywords = {"block_size": 2, "softcap": options.get("softcap")}
    if options.get("is_causal"):
        keywords["is_causal"] = True
        allowed = torch.ones(5, 6, dtype=torch.bool).tril()
    if options.get("mask") == "predicate":
        keywords["mask"] = masks.predicate(lambda i, j: (i + j) % 3 != 1)
        i, j = torch.arange(5)[:, None], torch.arange(6)[None, :]
        allowed = (i + j) % 3 != 1
    if options.get("bias") == "fn":
        table = bias.detach()
        keywords["bias"] = lambda b, h, i, j: table[b, 0, i, j]
    elif options.get("bias"):
        keywords["bias"] = bias
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    y = et.attention(*leaves, **keywords)
    want = _naive(*leaves, bias if options.get("bias") else None, options.get("softcap"), allowed)
    assert_close(y, want, atol=1e-12, what="y")
    g = randn(*y.shape, seed=5)
    inputs = leaves + ([bias] if options.get("bias") is True else [])
    for name, a, b in zip(
        ("dq", "dk", "dv", "dbias"),
        torch.autograd.grad(y, inputs, g),
        torch.autograd.grad(want, inputs, g),
    ):
        assert_close(a, b, atol=1e-12, what=name)


def test_key_block_grows_while_one_tile_fits():
    """b: the default 512, raised to n_k for a decode step; the caller's b is kept."""
    cpu = torch.device("cpu")
    decode = masks.Geometry(n_q=1, n_k=4096, batch=(1, 8))
    prefill = masks.Geometry(n_q=4096, n_k=4096, batch=(1, 8))
    assert passes.key_block_size(decode, None, cpu) == 4096
    assert passes.key_block_size(prefill, None, cpu) == passes.DEFAULT_BLOCK_SIZE
    assert passes.key_block_size(decode, 64, cpu) == 64
    # and it changes no result beyond rounding
    q, k, v = qkv((1, 8, 1, 16), (1, 8, 1500, 16), seed=6)
    assert_close(et.attention(q, k, v), et.attention(q, k, v, block_size=64), atol=1e-14)
