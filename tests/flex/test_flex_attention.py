"""exactattn.torch.flex_attention: FlexAttention's signature and semantics (fully masked
rows, lse, GQA, return_aux/return_lse, kernel_options), a backward on the CPU, gradients of
the tensors a score_mod reads, and FlexAttention's input errors."""

from __future__ import annotations

import functools
import inspect
import warnings

import numpy as np
import pytest

from tests.optional import requires

torch = requires("torch")
import torch.nn.attention.flex_attention as torch_flex
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask

from exactattn.torch import flex_attention
from exactattn.torch.flex import captured_tensors

from . import spec


def _qkv(batch=2, heads=4, n_q=9, n_k=11, heads_kv=None, d=4, seed=0, dtype=torch.float64):
    rng = np.random.default_rng(seed)
    heads_kv = heads_kv or heads
    return tuple(
        torch.from_numpy(rng.standard_normal(shape)).to(dtype)
        for shape in ((batch, heads, n_q, d), (batch, heads_kv, n_k, d), (batch, heads_kv, n_k, 3))
    )


def _torch_flex(*args, **kwargs):
    with warnings.catch_warnings():  # eager FlexAttention warns that it is not compiled
        warnings.simplefilter("ignore", UserWarning)
        return torch_flex.flex_attention(*args, **kwargs)


def test_the_signature_is_flex_attentions():
    ours = inspect.signature(flex_attention).parameters
    theirs = inspect.signature(torch_flex.flex_attention).parameters
    assert list(ours) == list(theirs)
    for name, p in theirs.items():
        assert (ours[name].kind, ours[name].default) == (p.kind, p.default), name


def test_fully_masked_rows_give_zero_output_minus_infinite_lse_and_zero_gradients():
    def later_keys_only(b, h, q_idx, kv_idx):
        return kv_idx > q_idx + 6  # rows 4.. of 11 keys see nothing

    q, k, v = _qkv(seed=1)
    bm = create_block_mask(later_keys_only, None, None, 9, 11, device="cpu", BLOCK_SIZE=4)
    want, aux = _torch_flex(q, k, v, block_mask=bm, return_aux=AuxRequest(lse=True))
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out, got = flex_attention(*leaves, block_mask=bm, return_aux=AuxRequest(lse=True))
    torch.testing.assert_close(out, want, atol=1e-13, rtol=0)
    torch.testing.assert_close(got.lse, aux.lse, atol=1e-13, rtol=0)
    assert not out[..., 4:, :].any() and torch.isneginf(got.lse[..., 4:]).all()
    out.sum().backward()
    assert not leaves[0].grad[..., 4:, :].any() and leaves[0].grad[..., :4, :].any()


def test_lse_is_the_natural_log_sum_exp_of_the_modified_scores():
    q, k, v = _qkv(seed=2)
    _out, aux = flex_attention(
        q, k, v, lambda s, b, h, i, j: s * 2, return_aux=AuxRequest(lse=True)
    )
    scores = 2 * q @ k.transpose(-1, -2) / 2.0  # scale 1/sqrt(4), then the mod's ×2
    torch.testing.assert_close(aux.lse, torch.logsumexp(scores, dim=-1), atol=1e-13, rtol=0)
    assert aux.max_scores is None and aux.lse.shape == (2, 4, 9)


def test_gqa_with_a_per_head_score_mod_equals_flex_attention():
    slopes = torch.tensor([1.0, 0.5, 0.25, 0.125], dtype=torch.float64)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    q, k, v = _qkv(heads=4, heads_kv=2, seed=3)
    want = _torch_flex(q, k, v, alibi, enable_gqa=True)
    got = flex_attention(q, k, v, alibi, enable_gqa=True, scale=0.3)
    assert not torch.allclose(got, want)  # scale matters
    torch.testing.assert_close(
        flex_attention(q, k, v, alibi, enable_gqa=True), want, atol=1e-13, rtol=0
    )


def test_float32_inputs_give_float32_results_close_to_float64():
    q, k, v = _qkv(seed=4)
    out, lse = flex_attention(*(x.float() for x in (q, k, v)), return_aux=AuxRequest(lse=True))
    want, _want_aux = flex_attention(q, k, v, return_aux=AuxRequest(lse=True))
    assert out.dtype == lse.lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=0)


def test_return_lse_is_deprecated_but_works():
    q, k, v = _qkv(seed=5)
    with pytest.warns(FutureWarning, match="return_lse is deprecated"):
        _out, lse = flex_attention(q, k, v, return_lse=True)
    torch.testing.assert_close(
        lse, torch.logsumexp(q @ k.transpose(-1, -2) / 2, -1), atol=1e-13, rtol=0
    )
    with pytest.raises(ValueError, match="Cannot specify both return_lse and return_aux"):
        flex_attention(q, k, v, return_lse=True, return_aux=AuxRequest(lse=True))
    with pytest.raises(TypeError, match="return_aux must be an AuxRequest"):
        flex_attention(q, k, v, return_aux=True)


def test_kernel_options_are_accepted_and_change_nothing():
    q, k, v = _qkv(seed=6)
    plain = flex_attention(q, k, v)
    tuned = flex_attention(q, k, v, kernel_options={"BLOCK_M": 16, "PRESCALE_QK": True})
    assert torch.equal(plain, tuned)
    with pytest.raises(TypeError, match="kernel_options must be a dict"):
        flex_attention(q, k, v, kernel_options=[("BLOCK_M", 16)])


def test_a_mask_mod_may_be_given_as_the_block_mask():
    q, k, v = _qkv(n_q=11, seed=7)
    causal = lambda b, h, i, j: i >= j  # noqa: E731
    bm = create_block_mask(causal, None, None, 11, 11, device="cpu", BLOCK_SIZE=4)
    torch.testing.assert_close(
        flex_attention(q, k, v, block_mask=causal), flex_attention(q, k, v, block_mask=bm),
        atol=1e-15, rtol=0,
    )  # fmt: skip


def test_a_torch_score_mod_runs_on_torch_and_its_gradient_is_autograds():
    """torch.tanh called directly: fine on torch (the derivative by autograd on the tile)."""

    def soft_cap(score, b, h, q_idx, kv_idx):
        return 2 * torch.tanh(score / 2)

    q, k, v = _qkv(seed=8)
    g = torch.randn(2, 4, 9, 3, dtype=torch.float64)
    leaves = [(3 * x).requires_grad_(True) for x in (q, k, v)]
    flex_attention(*leaves, soft_cap).backward(g)
    allowed = np.ones((1, 1, 9, 11), dtype=bool)
    want = spec.value_and_grads(
        lambda q, k, v: spec.naive(q, k, v, allowed, softcap=2.0), *(3 * x for x in (q, k, v)), g
    )
    for got, expected in zip((x.grad for x in leaves), want[1:]):
        torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)


# --- gradients of the tensors a score_mod reads --------------------------------------------------
TABLE = torch.zeros(4, 21, dtype=torch.float64)


class RelativeBias(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(4, 21, dtype=torch.float64))

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score + self.table[h, q_idx - kv_idx + 10]


def _read_through(kind: str, table: torch.Tensor):
    """A score_mod reading ``table`` the way ``kind`` says."""
    if kind == "closure":
        return lambda score, b, h, q_idx, kv_idx: score + table[h, q_idx - kv_idx + 10]
    if kind == "global":
        TABLE.data = table.data
        TABLE.requires_grad_(True)
        return _global_table_mod
    if kind == "partial":
        return functools.partial(_table_mod, table=table)
    module = RelativeBias()
    module.table.data = table.data
    if kind == "bound method":
        return module.score_mod
    return lambda score, b, h, q_idx, kv_idx: module.score_mod(score, b, h, q_idx, kv_idx)


def _global_table_mod(score, b, h, q_idx, kv_idx):
    return score + TABLE[h, q_idx - kv_idx + 10]


def _table_mod(score, b, h, q_idx, kv_idx, *, table):
    return score + table[h, q_idx - kv_idx + 10]


@pytest.mark.parametrize(
    "kind", ["closure", "global", "partial", "bound method", "object in closure"]
)
def test_a_table_the_score_mod_reads_gets_its_gradient(kind):
    table = torch.randn(4, 21, dtype=torch.float64).requires_grad_(True)
    mod = _read_through(kind, table)
    (leaf,) = captured_tensors(mod)
    q, k, v = _qkv(n_q=11, seed=9)
    g = torch.randn(2, 4, 11, 3, dtype=torch.float64)
    try:
        flex_attention(q, k, v, mod).backward(g)
    finally:
        TABLE.requires_grad_(False)
    i, j = np.arange(11)[:, None], np.arange(11)[None, :]
    index = torch.from_numpy(i - j + 10)

    def formula(q, k, v, t):
        return spec.naive(q, k, v, np.ones((1, 1, 11, 11), bool), bias=t[:, index][None])

    want = spec.value_and_grads(formula, q, k, v, g, leaf.detach())
    torch.testing.assert_close(leaf.grad, want[-1], atol=1e-12, rtol=0)


def test_captured_tensors_finds_only_tensors_requiring_grad():
    frozen = torch.ones(3)
    learned = torch.ones(3, requires_grad=True)
    helper = lambda h: learned[h]  # noqa: E731

    def mod(score, b, h, q_idx, kv_idx):
        return score + frozen[h] + helper(h)

    assert captured_tensors(mod) == (learned,)
    assert captured_tensors(lambda s, b, h, i, j: s) == ()


# --- FlexAttention's input errors ----------------------------------------------------------------
def test_inputs_that_flex_attention_refuses_are_refused():
    q, k, v = _qkv()
    with pytest.raises(
        ValueError, match=r"query must be 4-D \(B, H, L, E\); got shape \(4, 9, 4\)"
    ):
        flex_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match=r"Hq=4 and Hkv=2\. Try setting enable_gqa=True"):
        flex_attention(q, k[:, :2], v[:, :2])
    with pytest.raises(TypeError, match="must share one dtype"):
        flex_attention(q, k.float(), v)
    with pytest.raises(ValueError, match="key and value must agree"):
        flex_attention(q, k, v[:, :, :5])


def test_a_score_mod_that_changes_the_shape_is_refused_on_torch():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"returned shape \(2, 4, 9\) for a score tile"):
        flex_attention(q, k, v, lambda s, b, h, i, j: s.sum(-1))
