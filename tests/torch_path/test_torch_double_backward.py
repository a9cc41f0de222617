"""create_graph=True through exactattn.torch: exact second derivatives, tiled.

Judged two ways, both independent of exactattn's code: ``torch.autograd.gradgradcheck``
(the analytical double backward against finite differences of the first backward) in
float64, and parity with torch's math SDPA, whose double backward is autograd through the
materialised softmax. Sizes are chosen so that the block size changes the tiles that run
(n_k = 5 with b = 1, 2 and one block), masks leave a PARTIAL diagonal, n_q ≠ n_k, and
grouped heads share a key/value head.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.optional import requires

torch = requires("torch")

import torch.nn.functional as F
from torch.autograd import gradgradcheck
from torch.nn.attention import SDPBackend, sdpa_kernel

import exactattn.torch as et
from exactattn.core import calls, hvp, masks
from exactattn.torch import passes

from .helpers import assert_close, randn


def _leaves(q_shape, k_shape, seed=0, bias_shape=None):
    q = randn(*q_shape, seed=seed, grad=True)
    k = randn(*k_shape, seed=seed + 1, grad=True)
    v = randn(*k_shape[:-1], 2, seed=seed + 2, grad=True)
    if bias_shape is None:
        return q, k, v
    return q, k, v, randn(*bias_shape, seed=seed + 3, grad=True)


# --- gradgradcheck: small, each one a different path --------------------------------------
GRADGRAD = {
    "op: causal bottom-right, n_q ≠ n_k, GQA, b=2": (
        ((1, 2, 3, 2), (1, 1, 5, 2)),
        lambda q, k, v: et.attention(
            q, k, v, is_causal=True, alignment="bottom-right", enable_gqa=True, block_size=2
        ),
    ),
    "op: bias that requires grad, softcap, b=1": (
        ((1, 1, 3, 2), (1, 1, 4, 2), (3, 4)),
        lambda q, k, v, b: et.attention(q, k, v, bias=b, softcap=1.5, block_size=1),
    ),
    "Function: a predicate mask, b=2": (
        ((1, 1, 4, 2), (1, 1, 5, 2)),
        lambda q, k, v: et.attention(q, k, v, mask=lambda i, j: (i + j) % 3 != 1, block_size=2),
    ),
    "SDPA drop-in: a boolean attn_mask": (
        ((1, 1, 3, 2), (1, 1, 4, 2)),
        lambda q, k, v: et.scaled_dot_product_attention(
            q, k, v, attn_mask=torch.tensor([[1, 0, 1, 1], [0, 1, 1, 0], [1, 1, 0, 1]]).bool()
        ),
    ),
    "op: dropout replayed, b=2": (
        ((1, 2, 3, 2), (1, 2, 4, 2)),
        lambda q, k, v: et.attention(q, k, v, dropout_p=0.3, seed=5, block_size=2),
    ),
}


@pytest.mark.parametrize("case", list(GRADGRAD))
def test_gradgradcheck(case):
    shapes, fn = GRADGRAD[case]
    leaves = _leaves(shapes[0], shapes[1], bias_shape=shapes[2] if len(shapes) > 2 else None)
    assert gradgradcheck(fn, leaves)


SLOW_MASKS = {
    "none": {},
    "causal": dict(is_causal=True),
    "window": dict(mask=masks.sliding_window(left=1, right=1)),
    "key padding": dict(mask=masks.key_padding([3, 5])),
    "window bottom-right": dict(mask=masks.sliding_window(2, 0, alignment="bottom-right")),
}


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [1, 2, 5])
@pytest.mark.parametrize("mask", list(SLOW_MASKS))
@pytest.mark.parametrize("gqa", [False, True])
def test_gradgradcheck_grid(block_size, mask, gqa):
    q, k, v = _leaves((2, 2, 4, 2), (2, 1 if gqa else 2, 5, 2), seed=block_size)

    def fn(q, k, v):
        return et.attention(
            q, k, v, block_size=block_size, enable_gqa=gqa, empty_rows="zero", **SLOW_MASKS[mask]
        )

    assert gradgradcheck(fn, (q, k, v))


# --- parity with the math SDPA's double backward ------------------------------------------------
def _second_order(attend, q, k, v, bias=None, linear=False):
    """Gradients of ``Σ W∘(dQ, dK, dV[, dB])`` where the first loss is ``Σ C∘Y²`` (so that
    ``G = 2C∘Y`` depends on the inputs too and ``Ẏ`` is exercised), or ``Σ C∘Y`` when
    ``linear`` (``G = C`` a constant: the second order forms no ``Ẏ``)."""
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, bias) if x is not None]
    y = attend(*leaves)
    c = randn(*y.shape, seed=40)
    first = torch.autograd.grad((c * y * (1 if linear else y)).sum(), leaves, create_graph=True)
    weights = [randn(*x.shape, seed=50 + n) for n, x in enumerate(first)]
    total = sum((w * f).sum() for w, f in zip(weights, first)) + (first[0] ** 2).sum()
    return torch.autograd.grad(total, leaves)


def _math_sdpa(*args, **keywords):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(*args, **keywords)


PARITY = {
    "no mask, n_q ≠ n_k, b=2": (
        (2, 2, 5, 3),
        (2, 2, 7, 3),
        lambda q, k, v: et.attention(q, k, v, block_size=2),
        lambda q, k, v: _math_sdpa(q, k, v),
    ),
    "causal, b=3": (
        (1, 2, 7, 3),
        (1, 2, 7, 3),
        lambda q, k, v: et.attention(q, k, v, is_causal=True, block_size=3),
        lambda q, k, v: _math_sdpa(q, k, v, is_causal=True),
    ),
    "GQA, causal (the SDPA drop-in)": (
        (1, 4, 6, 3),
        (1, 2, 6, 3),
        lambda q, k, v: et.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        lambda q, k, v: _math_sdpa(q, k, v, is_causal=True, enable_gqa=True),
    ),
    "float bias that requires grad": (
        (2, 2, 5, 3),
        (2, 2, 6, 3),
        lambda q, k, v, b: et.scaled_dot_product_attention(q, k, v, attn_mask=b),
        lambda q, k, v, b: _math_sdpa(q, k, v, attn_mask=b),
    ),
    "predicate mask (the Function path), b=2": (
        (1, 1, 5, 3),
        (1, 1, 6, 3),
        lambda q, k, v: et.attention(q, k, v, mask=lambda i, j: j <= i + 1, block_size=2),
        lambda q, k, v: _math_sdpa(q, k, v, attn_mask=torch.ones(5, 6).bool().tril(1)),
    ),
}


@pytest.mark.parametrize("case", list(PARITY))
def test_parity_with_math_sdpa_double_backward(case):
    q_shape, k_shape, ours, theirs = PARITY[case]
    q, k, v = (randn(*s, seed=n) for n, s in enumerate((q_shape, k_shape, k_shape)))
    bias = randn(*q_shape[:-1], k_shape[-2], seed=9) if "bias" in case else None
    got, want = _second_order(ours, q, k, v, bias), _second_order(theirs, q, k, v, bias)
    for name, a, b in zip(("q", "k", "v", "bias"), got, want):
        assert_close(a, b, atol=1e-12, rtol=1e-12, what=f"{case}: d²/d{name}")


@pytest.mark.parametrize("case", ["causal, b=3", "GQA, causal (the SDPA drop-in)",
                                  "float bias that requires grad",
                                  "predicate mask (the Function path), b=2"])  # fmt: skip
def test_parity_when_g_is_a_constant(case):
    """``G`` that requires no grad: the op and the Function skip ``Ẏ`` (``output_tangent``)."""
    q_shape, k_shape, ours, theirs = PARITY[case]
    q, k, v = (randn(*s, seed=n) for n, s in enumerate((q_shape, k_shape, k_shape)))
    bias = randn(*q_shape[:-1], k_shape[-2], seed=9) if "bias" in case else None
    got = _second_order(ours, q, k, v, bias, linear=True)
    want = _second_order(theirs, q, k, v, bias, linear=True)
    for name, a, b in zip(("q", "k", "v", "bias"), got, want):
        assert_close(a, b, atol=1e-12, rtol=1e-12, what=f"{case}, G constant: d²/d{name}")


def test_a_broken_twin_fails_parity(monkeypatch):
    """γ̇ without its ``p(dṖ − δ̇)`` term: the parity check refutes it."""
    monkeypatch.setattr(
        hvp, "gamma_tangent", lambda ctx, p, p_dot, dp, dp_dot, delta, delta_dot: p_dot * dp
    )
    with pytest.raises(AssertionError, match="max abs error"):
        test_parity_with_math_sdpa_double_backward("causal, b=3")


# --- paths without a second derivative ------------------------------------------------------------
def test_impl_triton_refuses_the_double_backward():
    q, k, v = _leaves((1, 1, 3, 2), (1, 1, 3, 2))
    prepared = calls.prepare(
        passes.context(q.dtype, q.device), {"q": q, "k": k, "v": v}, scale=None,
        block_size=None, mask=None, score_mod=None, dropout=None, enable_gqa=False,
        checked=False,
    )  # fmt: skip
    plan = dataclasses.replace(passes.plan_for(prepared, None, impl="generic"), impl="triton")
    with pytest.raises(NotImplementedError, match="impl='triton' has no double backward"):
        passes.second_order(plan, q, k, v, q, q[..., 0], q, hvp.Tangents(q), False)


def test_first_order_paths_refuse_by_name():
    q, k, v = _leaves((1, 2, 3, 2), (1, 2, 4, 2))
    y = et.attention(q, k, v, sinks=torch.zeros(2, dtype=torch.float64))
    (dq,) = torch.autograd.grad(y.sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match=r"attention_with_lse .* has no double backward"):
        torch.autograd.grad(dq.sum(), q)
    table = torch.zeros(8, dtype=torch.float64, requires_grad=True)
    y = et.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s + table[(i - j) % 8])
    (dq, _) = torch.autograd.grad(y.sum(), (q, table), create_graph=True)
    with pytest.raises(NotImplementedError, match="flex_attention with score_mod parameters"):
        torch.autograd.grad(dq.sum(), q)


def test_flex_attention_differentiates_twice_without_parameter_grads():
    q, k, v = _leaves((1, 1, 3, 2), (1, 1, 4, 2))

    def fn(q, k, v):
        return et.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: torch.tanh(s) * 2)

    assert gradgradcheck(fn, (q, k, v))


def test_parity_when_the_heads_run_as_pieces(monkeypatch):
    """A call big enough to split into pieces of whole heads (passes.pieces) differentiates
    twice through them, and still equals the math SDPA's double backward."""
    ran = []
    original = passes.run_pieces
    monkeypatch.setattr(passes, "run_pieces", lambda work, parts, t: ran.append(len(parts))
                        or original(work, parts, t))  # fmt: skip
    q, k, v = (randn(1, 8, 512, 4, seed=n) for n in range(3))

    def ours(q, k, v):
        return et.attention(q, k, v, is_causal=True)

    got = _second_order(ours, q, k, v)
    want = _second_order(lambda q, k, v: _math_sdpa(q, k, v, is_causal=True), q, k, v)
    assert len(ran) >= 3 and min(ran) > 1, ran  # forward, reverse and second order in pieces
    for name, a, b in zip("qkv", got, want):
        assert_close(a, b, atol=1e-11, rtol=1e-11, what=f"pieces: d²/d{name}")
