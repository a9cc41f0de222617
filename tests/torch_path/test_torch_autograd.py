"""exactattn.torch.attention as an autograd.Function: gradcheck, what it saves, no graph."""

from __future__ import annotations

import numpy as np
import pytest

from tests.optional import requires

torch = requires("torch")

from torch.utils._python_dispatch import TorchDispatchMode

import exactattn
import exactattn.torch as et
from exactattn.core import masks
from exactattn.torch import passes

from .helpers import assert_close, qkv, randn


@pytest.fixture
def small_tiles(monkeypatch):
    """Split rows into blocks of 2 so the row-block path is exercised at tiny sizes."""
    monkeypatch.setattr(passes, "MIN_ROW_BLOCK", 2)
    monkeypatch.setitem(passes.TILE_ELEMENTS, "cpu", 1)


PADDING = masks.key_padding(torch.tensor([6, 2]))
CAUSAL_EMPTY = masks.and_masks(masks.causal(), masks.key_padding(torch.tensor([5, 0])))


GRADCHECK_CASES = {
    "plain": ((2, 2, 5, 3), (2, 2, 5, 3), (2, 2, 5, 3), {}),
    "is_causal": ((1, 2, 6, 3), (1, 2, 6, 3), (1, 2, 6, 3), {"is_causal": True}),
    "causal-bottom-right-cross": (
        (1, 2, 4, 3),
        (1, 2, 7, 3),
        (1, 2, 7, 2),
        {"mask": masks.causal("bottom-right")},
    ),
    "sliding-window": (
        (1, 1, 7, 2),
        (1, 1, 7, 2),
        (1, 1, 7, 3),
        {"mask": masks.sliding_window(2, 1)},
    ),
    "dense": ((2, 2, 5, 3), (2, 2, 6, 3), (2, 2, 6, 3), {"mask": "dense"}),
    "key-padding": (
        (2, 2, 5, 3),
        (2, 2, 6, 3),
        (2, 2, 6, 3),
        {"mask": PADDING},
    ),
    "gqa": ((1, 4, 5, 3), (1, 2, 5, 3), (1, 2, 5, 3), {"enable_gqa": True, "is_causal": True}),
    "broadcast-kv": ((2, 3, 5, 3), (1, 1, 5, 3), (1, 1, 5, 3), {"scale": 0.7}),
    "dropout": ((1, 2, 5, 3), (1, 2, 5, 3), (1, 2, 5, 3), {"dropout_p": 0.3, "seed": 11}),
    "empty-rows-zero": (
        (2, 1, 5, 3),
        (2, 1, 5, 3),
        (2, 1, 5, 3),
        {
            "mask": CAUSAL_EMPTY,
            "empty_rows": "zero",
        },
    ),
}


def _resolve(keywords, q_shape, k_shape):
    keywords = dict(keywords)
    if keywords.get("mask") == "dense":
        allowed = np.random.default_rng(4).random((*q_shape[:-1], k_shape[-2])) < 0.6
        allowed[..., 0] = True
        keywords["mask"] = torch.from_numpy(allowed)
    return keywords


@pytest.mark.parametrize("case", sorted(GRADCHECK_CASES))
def test_gradcheck_float64(case, small_tiles):
    q_shape, k_shape, v_shape, keywords = GRADCHECK_CASES[case]
    keywords = _resolve(keywords, q_shape, k_shape)
    q, k, v = qkv(q_shape, k_shape, v_shape, seed=1, grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: et.attention(q, k, v, block_size=2, **keywords), (q, k, v)
    )


@pytest.mark.parametrize("case", sorted(GRADCHECK_CASES))
def test_agrees_with_the_numpy_float64_api(case):
    """Forward and reverse equal exactattn.attention / attention_backward on NumPy float64."""
    q_shape, k_shape, v_shape, keywords = GRADCHECK_CASES[case]
    keywords = _resolve(keywords, q_shape, k_shape)
    q, k, v = qkv(q_shape, k_shape, v_shape, seed=2)
    y = et.attention(q, k, v, block_size=3, **keywords)
    g = randn(*y.shape, seed=8)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    grads = torch.autograd.grad(et.attention(*leaves, block_size=3, **keywords), leaves, g)

    np_keywords = dict(keywords)
    a = [x.numpy() for x in (q, k, v)]
    if np_keywords.pop("enable_gqa", False):  # the NumPy API broadcasts: group explicitly
        group = q_shape[1] // k_shape[1]
        a = [a[0], np.repeat(a[1], group, axis=1), np.repeat(a[2], group, axis=1)]
    if np_keywords.pop("is_causal", False):
        np_keywords["mask"] = masks.causal()
    mask = np_keywords.get("mask")
    if isinstance(mask, torch.Tensor):
        np_keywords["mask"] = mask.numpy()
    elif mask is not None:
        np_keywords["mask"] = _to_numpy_mask(mask)
    ref_y, stats = exactattn.attention(*a, block_size=5, return_stats=True, **np_keywords)
    ref = exactattn.attention_backward(*a, ref_y, stats, g.numpy(), block_size=5, **np_keywords)
    assert_close(y, ref_y, atol=1e-13, what="y")
    for name, got, want, x in zip(("dq", "dk", "dv"), grads, ref, (q, k, v)):
        want = torch.from_numpy(np.asarray(want))
        if tuple(want.shape) != tuple(x.shape):  # GQA: sum the repeated heads
            want = want.unflatten(1, (x.shape[1], -1)).sum(2)
        assert_close(got, want, atol=1e-13, what=name)


def _to_numpy_mask(mask):
    if isinstance(mask, masks.KeyPadding):
        return masks.KeyPadding(np.asarray(mask.lengths))
    if isinstance(mask, masks.And):
        return masks.And(tuple(_to_numpy_mask(part) for part in mask.parts))
    return mask


def test_empty_rows_give_zero_output_and_gradients():
    q, k, v = qkv((2, 1, 4, 3), (2, 1, 4, 3), seed=3, grad=True)
    mask = masks.key_padding(torch.tensor([4, 0]))
    y = et.attention(q, k, v, mask=mask, empty_rows="zero")
    y.backward(torch.ones_like(y))
    assert torch.equal(y[1], torch.zeros_like(y[1]))
    assert torch.equal(q.grad[1], torch.zeros_like(q.grad[1]))
    assert torch.equal(k.grad[1], torch.zeros_like(k.grad[1]))
    assert torch.all(y[0] != 0) and torch.all(q.grad[0] != 0)
    with pytest.raises(ValueError, match="no allowed key"):
        et.attention(q, k, v, mask=mask)


def test_saves_only_q_k_v_y_and_lse():
    q, k, v = qkv((2, 3, 7, 4), (2, 3, 9, 4), (2, 3, 9, 5), seed=4, grad=True)
    y = et.attention(q, k, v)
    saved = [x for x in y.grad_fn.saved_tensors if x is not None]  # no mask, bias or seed
    assert [tuple(x.shape) for x in saved] == [
        (2, 3, 7, 4),
        (2, 3, 9, 4),
        (2, 3, 9, 5),
        (2, 3, 7, 5),
        (2, 3, 7),
    ]
    assert saved[3] is not None and torch.equal(saved[3], y.detach())
    lse = torch.logsumexp(q @ k.transpose(-1, -2) / 2, dim=-1)  # c = 1/sqrt(4)
    assert_close(saved[4], lse.detach(), atol=1e-13, what="lse")


def test_builds_no_graph_inside_the_block_loop():
    """The only autograd node between the inputs and y is the op's Function (or, for a
    predicate mask, the non-op Function) itself."""
    q, k, v = qkv((1, 2, 40, 4), (1, 2, 40, 4), seed=5, grad=True)
    for mask, node in (
        (None, "AttentionFunctionBackward"),
        (masks.predicate(lambda i, j: j <= i), "TiledAttentionBackward"),
    ):
        y = et.attention(q, k, v, block_size=4, is_causal=True, mask=mask)
        assert type(y.grad_fn).__name__ == node
        parents = [fn for fn, _ in y.grad_fn.next_functions if fn is not None]
        assert [type(fn).__name__ for fn in parents] == ["AccumulateGrad"] * 3


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any aten op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(x, torch.Tensor):
                self.largest = max(self.largest, x.numel())
        return out


@pytest.mark.parametrize("block_size", [16, 64])
def test_no_nq_by_nk_tensor_in_either_pass(block_size):
    batch, n = 4, 128
    q, k, v = qkv((1, batch, n, 8), (1, batch, n, 8), seed=6, grad=True)
    with _LargestTensor() as forward:
        y = et.attention(q, k, v, block_size=block_size)
    with _LargestTensor() as backward:
        y.backward(torch.ones_like(y))
    row_block = max(passes.MIN_ROW_BLOCK, passes.TILE_ELEMENTS["cpu"] // (batch * block_size))
    tile = batch * min(n, row_block) * block_size
    for name, mode in (("forward", forward), ("backward", backward)):
        assert mode.largest <= max(tile, batch * n * 8), f"{name}: {mode.largest} elements"
        assert mode.largest < batch * n * n, name


def test_block_size_does_not_change_the_result():
    q, k, v = qkv((2, 2, 13, 3), (2, 2, 13, 3), seed=7)
    ys = [et.attention(q, k, v, block_size=b, is_causal=True) for b in (1, 4, 13, 100)]
    for y in ys[1:]:
        assert_close(y, ys[0], atol=1e-14, what="y")


def test_half_precision_keeps_input_dtype_and_fp32_statistics():
    q, k, v = qkv((1, 2, 33, 16), (1, 2, 33, 16), seed=8, dtype=torch.bfloat16, grad=True)
    y = et.attention(q, k, v, is_causal=True)
    assert y.dtype == torch.bfloat16 and y.grad_fn.saved_tensors[4].dtype == torch.float32
    y.float().sum().backward()
    assert q.grad.dtype == k.grad.dtype == v.grad.dtype == torch.bfloat16
    ref = exactattn.attention(
        *(x.detach().double().numpy() for x in (q, k, v)), mask=masks.causal()
    )
    assert_close(y.detach(), ref, atol=2e-2, what="bf16 y vs float64")


def test_bad_arguments_are_named():
    q, k, v = qkv((1, 2, 4, 3), (1, 2, 4, 3), seed=9)
    with pytest.raises(TypeError, match=r"q must be a torch\.Tensor"):
        et.attention(q.numpy(), k, v)
    with pytest.raises(TypeError, match="dtype"):
        et.attention(q, k.float(), v)
    with pytest.raises(ValueError, match="enable_gqa"):
        et.attention(q, k[:, :1].expand(1, 3, 4, 3).contiguous()[:, :3], v, enable_gqa=True)
    with pytest.raises(ValueError, match="dropout_p"):
        et.attention(q, k, v, dropout_p=1.0, seed=0)
    with pytest.raises(ValueError, match="seed"):
        et.attention(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match="impl"):
        et.attention(q, k, v, impl="cuda")
    with pytest.raises(ValueError, match="mask has shape"):
        et.attention(q, k, v, mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="NaN or inf"):
        et.attention(q.clone().fill_(float("nan")), k, v)
