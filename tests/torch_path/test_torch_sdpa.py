"""Agreement with torch.nn.functional.scaled_dot_product_attention: forward and all grads."""

from __future__ import annotations

import numpy as np
import pytest

from tests.optional import requires

torch = requires("torch")

import torch.nn.functional as F

import exactattn.torch as et

from .helpers import assert_close, qkv, randn, value_and_grads

# (q shape, k shape, v shape): batch·heads, self and cross attention, v != d, ragged blocks
SHAPES = {
    "self": ((2, 3, 37, 16), (2, 3, 37, 16), (2, 3, 37, 16)),
    "cross": ((1, 4, 19, 8), (1, 4, 45, 8), (1, 4, 45, 12)),
    "3d": ((5, 33, 8), (5, 33, 8), (5, 33, 8)),
    "5d": ((2, 2, 2, 17, 4), (2, 2, 2, 21, 4), (2, 2, 2, 21, 4)),
}
GQA_SHAPES = {
    "gqa-4-2": ((2, 4, 23, 8), (2, 2, 23, 8), (2, 2, 23, 8)),
    "mqa-6-1": ((1, 6, 30, 16), (1, 1, 30, 16), (1, 1, 30, 16)),
}
TOL = {torch.float64: 1e-12, torch.float32: 3e-5}


def _bool_mask(q_shape, n_k, seed=3):
    allowed = np.random.default_rng(seed).random((*q_shape[:-1], n_k)) < 0.7
    allowed[..., 0] = True  # no empty rows: SDPA's convention for those differs
    return torch.from_numpy(allowed)


def _compare(shapes, dtype, ours, theirs, seed=0):
    q, k, v = qkv(*shapes, seed=seed, dtype=dtype)
    g = randn(*shapes[0][:-1], shapes[2][-1], seed=seed + 5, dtype=dtype)
    got = value_and_grads(ours, q, k, v, g)
    want = value_and_grads(theirs, q, k, v, g)
    for name, a, b in zip(("y", "dq", "dk", "dv"), got, want):
        assert a.dtype == b.dtype == dtype, name
        assert_close(a, b, atol=TOL[dtype], rtol=TOL[dtype], what=name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("option", ["plain", "is_causal", "attn_mask", "scale"])
def test_matches_sdpa(shape, option, dtype):
    shapes = SHAPES[shape]
    ours, theirs = {}, {}
    if option == "is_causal":
        ours = theirs = {"is_causal": True}
    elif option == "attn_mask":
        mask = _bool_mask(shapes[0], shapes[1][-2])
        ours, theirs = {"mask": mask}, {"attn_mask": mask}
    elif option == "scale":
        ours = theirs = {"scale": 0.37}
    _compare(
        shapes,
        dtype,
        lambda q, k, v: et.attention(q, k, v, block_size=8, **ours),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **theirs),
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", sorted(GQA_SHAPES))
@pytest.mark.parametrize("option", ["plain", "is_causal", "attn_mask"])
def test_matches_sdpa_with_enable_gqa(shape, option, dtype):
    shapes = GQA_SHAPES[shape]
    ours, theirs = {}, {}
    if option == "is_causal":
        ours = theirs = {"is_causal": True}
    elif option == "attn_mask":
        mask = _bool_mask(shapes[0], shapes[1][-2])
        ours, theirs = {"mask": mask}, {"attn_mask": mask}
    _compare(
        shapes,
        dtype,
        lambda q, k, v: et.attention(q, k, v, block_size=8, enable_gqa=True, **ours),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **theirs),
    )


def test_broadcast_mask_shapes_match_sdpa():
    """A (n_q, n_k) and a (B, 1, n_q, n_k) mask broadcast over heads as SDPA's do."""
    shapes = SHAPES["self"]
    for mask in (_bool_mask((37, 1), 37), _bool_mask((2, 1, 37, 1), 37)):
        _compare(
            shapes,
            torch.float64,
            lambda q, k, v, m=mask: et.attention(q, k, v, block_size=8, mask=m),
            lambda q, k, v, m=mask: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        )
