"""Dropout keep-bits: bit-identical on NumPy and torch, replayed in the reverse pass."""

from __future__ import annotations

import numpy as np
import pytest

from tests.optional import requires

torch = requires("torch")

import exactattn
import exactattn.torch as et
from exactattn.core.dropout import Dropout

from .helpers import assert_close, qkv, randn

SEEDS = [0, 1, 2**32 - 1, 2**32, 2**63 + 12345, 2**64 - 1]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_bits_are_bit_identical_on_numpy_and_torch(seed, p):
    dropout = Dropout(p, seed)
    batch_index = np.arange(6).reshape(2, 3, 1, 1) * 1_000_003  # large flat indices too
    i = np.arange(2**31 - 40, 2**31 + 40)[:, None]  # positions across the int32 boundary
    j = np.concatenate([np.arange(50), np.arange(2**32 - 25, 2**32 + 25)])[None, :]
    want = dropout.keep(batch_index, i, j)
    got = dropout.keep(*(torch.from_numpy(x) for x in (batch_index, i, j)))
    assert got.dtype == torch.bool
    assert np.array_equal(got.numpy(), want)
    assert 0 < want.mean() < 1  # a nontrivial draw, so the equality says something


def test_keep_rate_follows_p():
    keep = Dropout(0.3, 99).keep(
        np.arange(4).reshape(4, 1, 1), np.arange(200)[:, None], np.arange(200)[None, :]
    )
    assert abs(keep.mean() - 0.7) < 0.01


def _numpy_run(q, k, v, g, **keywords):
    a = [x.numpy() for x in (q, k, v)]
    y, stats = exactattn.attention(*a, block_size=4, return_stats=True, **keywords)
    grads = exactattn.attention_backward(*a, y, stats, g.numpy(), block_size=4, **keywords)
    return (y, *grads)


def _torch_run(q, k, v, g, **keywords):
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    y = et.attention(*leaves, block_size=3, **keywords)
    return (y.detach(), *torch.autograd.grad(y, leaves, g))


@pytest.mark.parametrize("seed", [5, 2**40 + 3])
def test_dropout_results_match_numpy_for_the_same_seed(seed):
    """Same seed, same keep-bits: forward and all three gradients agree with NumPy float64."""
    q, k, v = qkv((2, 3, 11, 4), (2, 3, 13, 4), (2, 3, 13, 5), seed=1)
    g = randn(2, 3, 11, 5, seed=2)
    keywords = dict(dropout_p=0.4, seed=seed, mask=exactattn.core.masks.causal("bottom-right"))
    got, want = _torch_run(q, k, v, g, **keywords), _numpy_run(q, k, v, g, **keywords)
    for name, a, b in zip(("y", "dq", "dk", "dv"), got, want):
        assert_close(a, b, atol=1e-13, what=name)
    other = _torch_run(q, k, v, g, dropout_p=0.4, seed=seed + 1, mask=keywords["mask"])
    assert (other[0] - got[0]).abs().max() > 1e-3  # another seed drops other weights


def test_dropout_replays_in_the_reverse_pass():
    """gradcheck passes only if the reverse uses the forward's realised keep-bits."""
    q, k, v = qkv((1, 2, 6, 3), (1, 2, 6, 3), seed=3, grad=True)
    fn = lambda q, k, v: et.attention(q, k, v, block_size=2, dropout_p=0.5, seed=7)  # noqa: E731
    assert torch.equal(fn(q, k, v), fn(q, k, v))
    assert torch.autograd.gradcheck(fn, (q, k, v))
