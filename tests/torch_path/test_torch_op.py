"""exactattn::attention as a real torch op: opcheck, torch.compile, torch.func, torch.export.

The references are torch's SDPA (float64, CPU) and the same function run eagerly.
"""

from __future__ import annotations

import pytest

from tests.optional import requires

torch = requires("torch")

import torch.nn.functional as F

import exactattn.torch as et
from exactattn.core import masks
from exactattn.torch import op

from .helpers import assert_close, qkv, randn

SHAPES = ((2, 4, 6, 8), (2, 2, 7, 8), (2, 2, 7, 5))  # GQA, cross attention, v != d


def _inputs(grad=True):
    q, k, v = qkv(*SHAPES, seed=1, grad=grad)
    bias = randn(6, 7, seed=4, grad=grad)
    return q, k, v, bias


def _sdpa(q, k, v, bias):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)


def _ours(q, k, v, bias):
    return et.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)


OPCHECK_CASES = {
    "plain": {},
    "bias-window-lengths": {
        "bias": randn(6, 7, seed=5),
        "kv_lengths": torch.tensor([7, 3]),  # one per batch element
        "band": masks.Band("bottom-right", 2, 0),
    },
    "dense-softcap-dropout": {
        "allowed": torch.rand(2, 4, 6, 7, generator=torch.Generator().manual_seed(0)) < 0.7,
        "softcap": 2.0,
        "seed": torch.tensor(17),
        "dropout_p": 0.3,
    },
}


@pytest.mark.parametrize("case", sorted(OPCHECK_CASES))
def test_opcheck(case):
    """torch.library.opcheck: schema, fake implementation, autograd registration, AOT dispatch."""
    options = dict(OPCHECK_CASES[case])
    band = options.pop("band", masks.Band())
    q, k, v = qkv(*SHAPES, seed=2, grad=True)
    args = (
        q, k, v, options.get("allowed"), options.get("bias"), options.get("kv_lengths"),
        options.get("seed"), None, band.left, band.right, band.alignment,
        options.get("dropout_p", 0.0), options.get("softcap"), True, 3, "auto",
    )  # fmt: skip
    torch.library.opcheck(torch.ops.exactattn.attention.default, args)


def test_the_op_itself_is_differentiable():
    """register_autograd: a caller of torch.ops.exactattn.attention gets SDPA's gradients."""
    q, k, v, bias = _inputs()
    y, lse = torch.ops.exactattn.attention(
        q, k, v, None, bias, None, None, None, None, None, "top-left", 0.0, None, True, None,
        "auto",
    )  # fmt: skip
    want = _sdpa(q, k, v, bias)
    assert_close(y, want, atol=1e-12, what="y")
    got = torch.autograd.grad(y.sum(), (q, k, v, bias))
    ref = torch.autograd.grad(want.sum(), (q, k, v, bias))
    for name, a, b in zip(("dq", "dk", "dv", "dbias"), got, ref):
        assert_close(a, b, atol=1e-12, what=name)
    assert not lse.requires_grad


def _grads(fn, *inputs):
    y = fn(*inputs)
    return (y, *torch.autograd.grad(y, inputs, torch.ones_like(y)))


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_forward_and_backward(dynamic):
    """No graph break (fullgraph=True raises on one); the op is opaque to AOT autograd."""
    torch._dynamo.reset()
    compiled = torch.compile(_ours, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    for seed in (1, 2):  # a second call reuses the graph
        q, k, v, bias = _inputs()
        q.data += seed
        got, want = _grads(compiled, q, k, v, bias), _grads(_sdpa, q, k, v, bias)
        for name, a, b in zip(("y", "dq", "dk", "dv", "dbias"), got, want):
            assert_close(a, b, atol=1e-12, what=name)


def test_compile_fullgraph_with_dropout_draws_the_seed_in_the_graph():
    torch._dynamo.reset()

    def dropped(q, k, v):
        return et.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)

    compiled = torch.compile(dropped, fullgraph=True, backend="aot_eager")
    q, k, v = qkv((1, 2, 5, 4), (1, 2, 5, 4), seed=3)
    torch.manual_seed(9)
    first = compiled(q, k, v)
    torch.manual_seed(9)
    assert torch.equal(compiled(q, k, v), first)  # torch's generator reproduces it
    assert not torch.equal(compiled(q, k, v), first)  # and advances


def test_compile_fullgraph_strict_api_without_value_checks():
    """attention()'s value checks are opt-out: with them off it traces as one graph."""
    torch._dynamo.reset()

    def strict(q, k, v):
        return et.attention(
            q, k, v, is_causal=True, alignment="bottom-right", check_finite=False,
            empty_rows="zero", enable_gqa=True,
        )  # fmt: skip

    compiled = torch.compile(strict, fullgraph=True, backend="aot_eager")
    q, k, v, _ = _inputs()
    got, want = _grads(compiled, q, k, v), _grads(strict, q, k, v)
    for name, a, b in zip(("y", "dq", "dk", "dv"), got, want):
        assert_close(a, b, atol=1e-13, what=name)


def test_func_grad_and_vjp():
    q, k, v, bias = _inputs(grad=False)
    dq = torch.func.grad(lambda q: _ours(q, k, v, bias).sum())(q)
    want = torch.autograd.grad(_sdpa(q.requires_grad_(), k, v, bias).sum(), q)[0]
    assert_close(dq, want, atol=1e-12, what="func.grad dq")
    g = randn(2, 4, 6, 5, seed=7)
    _, vjp = torch.func.vjp(_ours, q.detach(), k, v, bias)
    _, ref = torch.func.vjp(_sdpa, q.detach(), k, v, bias)
    for name, a, b in zip(("dq", "dk", "dv", "dbias"), vjp(g), ref(g)):
        assert_close(a, b, atol=1e-12, what=f"vjp {name}")


def test_func_grad_through_the_non_op_path():
    q, k, v, _ = _inputs(grad=False)
    mask = masks.predicate(lambda i, j: j <= i + 1)
    dq = torch.func.grad(lambda q: et.attention(q, k, v, mask=mask, enable_gqa=True).sum())(q)
    dense = masks.create_mask(mask, masks.Geometry(6, 7)).copy()
    want = torch.autograd.grad(
        F.scaled_dot_product_attention(
            q.requires_grad_(), k, v, attn_mask=torch.from_numpy(dense), enable_gqa=True
        ).sum(),
        q,
    )[0]
    assert_close(dq, want, atol=1e-12, what="dq")


@pytest.mark.parametrize("mapped", ["q", "all", "mask"])
def test_vmap(mapped):
    """vmap over a new leading axis equals SDPA in a loop, values and per-example gradients."""
    q, k, v, bias = _inputs(grad=False)
    qs = torch.stack([q, q + 1, 2 * q])
    ks, vs, bs = (torch.stack([x, x.flip(-2), x + 0.5]) for x in (k, v, bias))
    if mapped == "q":
        args, dims = (qs,), (0,)
        ours, theirs = (lambda q: _ours(q, k, v, bias)), (lambda q: _sdpa(q, k, v, bias))
    elif mapped == "all":
        args, dims, ours, theirs = (qs, ks, vs, bs), (0, 0, 0, 0), _ours, _sdpa
    else:  # the mask alone, mapped along its axis 1
        args, dims = (bs.transpose(0, 1),), (1,)
        ours, theirs = (lambda b: _ours(q, k, v, b)), (lambda b: _sdpa(q, k, v, b))
    slices = [[a.select(d, i) for a, d in zip(args, dims)] for i in range(3)]
    want = torch.stack([theirs(*xs) for xs in slices])
    assert_close(torch.vmap(ours, in_dims=dims)(*args), want, atol=1e-12, what="y")
    per_example = torch.vmap(torch.func.grad(lambda *xs: ours(*xs).sum()), in_dims=dims)(*args)
    for i, xs in enumerate(slices):
        leaf = xs[0].clone().requires_grad_(True)
        ref = torch.autograd.grad(theirs(leaf, *xs[1:]).sum(), leaf)[0]
        assert_close(per_example[i], ref, atol=1e-12, what=f"grad {i}")


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 3 * 8, dtype=torch.float64)

    def forward(self, x):
        q, k, v = self.proj(x).unflatten(-1, (3, 2, 4)).permute(2, 0, 3, 1, 4)
        return et.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_export_captures_the_op():
    torch.manual_seed(0)
    block, x = _Block(), randn(2, 5, 8, seed=8)
    exported = torch.export.export(block, (x,))
    targets = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert torch.ops.exactattn.attention.default in targets
    assert_close(exported.module()(x), block(x), atol=0, what="exported vs eager")
    y = exported.module()(x)
    assert y.shape == (2, 2, 5, 4)


def test_fake_shapes_match_the_real_ones():
    """The fake implementation's outputs have the real outputs' shapes, dtypes and strides."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for dtype in (torch.float64, torch.bfloat16):
        q, k, v = qkv((2, 1, 5, 4), (1, 3, 6, 4), (1, 3, 6, 2), dtype=dtype)
        args = (None,) * 4 + (None, None, None, "top-left", 0.0, None, False, None, "auto")
        real = op.attention_op(q, k, v, *args)
        with FakeTensorMode() as mode:
            fake = op.attention_op(*(mode.from_tensor(x) for x in (q, k, v)), *args)
        for a, b in zip(real, fake):
            assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride())
