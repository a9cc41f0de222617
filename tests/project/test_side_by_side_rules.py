"""The peers' rules of ``docs/side_by_side_rules.py`` fail a wrong output and pass a right one.

The right output is softmax attention computed in float64 and rounded once to the input
dtype (the best a kernel can return); the wrong one scales the scores by ``1/d`` instead of
``1/√d``. Each rule must tell them apart, so none of the side-by-side columns can be vacuous.
"""

from __future__ import annotations

import math

import pytest

from tests.optional import requires

requires("torch")

import torch

from docs import side_by_side_rules as rules


def _attention(q, k, v, scale):
    """``softmax(scale·q kᵀ) v`` in float64, from the definition."""
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    return torch.softmax(s, dim=-1) @ v.double()


@pytest.fixture
def inputs():
    torch.manual_seed(0)
    return tuple(torch.randn(1, 2, 37, 16, dtype=torch.float16) for _ in range(3))


def _right_and_wrong(q, k, v):
    d = q.shape[-1]
    right = _attention(q, k, v, 1 / math.sqrt(d)).to(q.dtype)
    wrong = _attention(q, k, v, 1 / d).to(q.dtype)
    return right, wrong


def test_flash_attn_rule(inputs):
    q, k, v = (x.transpose(1, 2) for x in inputs)  # (B, n, H, d)
    allowed = torch.ones(37, 37, dtype=torch.bool)
    ref = rules.flash_attn_ref(q, k, v, allowed)
    pt = rules.flash_attn_ref(q, k, v, allowed, upcast=False, reorder_ops=True)
    right, wrong = (y.transpose(1, 2) for y in _right_and_wrong(*inputs))
    assert rules.flash_attn_rule(right, ref, pt)
    assert not rules.flash_attn_rule(wrong, ref, pt)
    assert not rules.flash_attn_rule(torch.full_like(right, math.nan), ref, pt)


def test_pytorch_rule(inputs):
    q, k, v = (x.abs() for x in inputs)  # the test draws torch.rand
    hp = rules.torch_higher_precision(q.dtype)
    ref = rules.torch_math_ref(q.to(hp), k.to(hp), v.to(hp))
    lp = rules.torch_math_ref(q, k, v)
    right, wrong = _right_and_wrong(q, k, v)
    assert rules.torch_rule(right, ref, lp)
    assert not rules.torch_rule(wrong, ref, lp)


def test_flex_rule(inputs):
    q, k, v = inputs
    allowed = torch.ones(37, 37, dtype=torch.bool)
    golden = rules.flex_math_ref(*(x.double() for x in inputs), allowed)
    ref = rules.flex_math_ref(q, k, v, allowed)
    right, wrong = _right_and_wrong(q, k, v)
    fudge = rules.flex_fudge(q.dtype)
    assert fudge == 1.1
    assert rules.flex_rule(right, golden, ref, fudge)
    assert not rules.flex_rule(wrong, golden, ref, fudge)
    assert not rules.flex_rule(torch.full_like(right, math.nan), golden, ref, fudge)


def test_references_agree_with_the_definition(inputs):
    """Each peer's reference, in float64, is the softmax attention of its definition."""
    q, k, v = (x.double() for x in inputs)
    exact = _attention(q, k, v, 1 / 4)
    allowed = torch.ones(37, 37, dtype=torch.bool)
    t = (x.transpose(1, 2) for x in (q, k, v))
    flash = rules.flash_attn_ref(*t, allowed, upcast=False)  # upcast: .float() of fp64
    torch.testing.assert_close(flash.transpose(1, 2), exact)
    torch.testing.assert_close(rules.flex_math_ref(q, k, v, allowed), exact)
    torch.testing.assert_close(rules.torch_math_ref(q, k, v), exact)
