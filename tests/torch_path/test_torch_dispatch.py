"""The Triton dispatch: which masks the kernels express, and the argument mapping."""

from __future__ import annotations

import pytest

from tests.optional import requires

torch = requires("torch")

import exactattn.torch as et
from exactattn.backends.torch_backend import TorchContext
from exactattn.core import masks
from exactattn.torch import dispatch

from .helpers import qkv

N_Q, N_K, BATCH = 6, 9, (2, 3)


GEOMETRY = masks.Geometry(n_q=N_Q, n_k=N_K, batch=BATCH)


def _band_allowed(band: masks.Band) -> torch.Tensor:
    """The kernels' documented predicate (``masks.Band``), densely: (*BATCH, n_q, n_k)."""
    i = torch.arange(N_Q)[:, None]
    j = torch.arange(N_K)[None, :]
    centre = i + (N_K - N_Q if band.alignment == "bottom-right" else 0)
    allowed = torch.ones(BATCH[0], N_Q, N_K, dtype=torch.bool)
    if band.left is not None:
        allowed = allowed & (j >= centre - band.left)
    if band.right is not None:
        allowed = allowed & (j <= centre + band.right)
    if band.kv_lengths is not None:
        lengths = torch.as_tensor(band.kv_lengths).expand(BATCH[0])
        allowed = allowed & (j < lengths[:, None, None])
    return allowed[:, None].expand(*BATCH, N_Q, N_K)


EXPRESSIBLE = {
    "none": None,
    "causal": masks.causal(),
    "causal-bottom-right": masks.causal("bottom-right"),
    "window": masks.sliding_window(2, 1),
    "window-bottom-right": masks.sliding_window(None, 2, "bottom-right"),
    "padding": masks.key_padding(torch.tensor([9, 4])),
    "padding-broadcast": masks.key_padding(torch.tensor([5])),
    "padding-per-batch-column": masks.key_padding(torch.tensor([[7], [3]])),
    "causal-and-padding": masks.and_masks(masks.causal(), masks.key_padding(torch.tensor([9, 2]))),
    "two-windows": masks.and_masks(masks.causal(), masks.sliding_window(2, 2)),
}


@pytest.mark.parametrize("name", sorted(EXPRESSIBLE))
def test_the_lowered_band_allows_what_the_mask_allows(name):
    mask = EXPRESSIBLE[name]
    band = masks.Band() if mask is None else mask.lower(GEOMETRY)
    assert band is not None
    want = masks.create_mask(mask, GEOMETRY, TorchContext(torch.float32))
    assert torch.equal(_band_allowed(band), want)


def test_causal_and_windows_lower_to_their_band_edges():
    assert masks.causal().lower(GEOMETRY) == masks.Band("top-left", None, 0)
    assert masks.causal("bottom-right").lower(GEOMETRY) == masks.Band("bottom-right", None, 0)
    both = masks.causal() & masks.sliding_window(3, 2)
    assert both.lower(GEOMETRY) == masks.Band("top-left", 3, 0)


INEXPRESSIBLE = {
    "dense": masks.dense(torch.ones(N_Q, N_K, dtype=torch.bool)),
    "predicate": masks.predicate(lambda i, j: j != i),
    "or": masks.or_masks(masks.causal(), masks.sliding_window(0, 1)),
    "windows-of-two-alignments": masks.and_masks(
        masks.causal(), masks.sliding_window(2, 2, "bottom-right")
    ),
    "padding-per-head": masks.key_padding(torch.tensor([[9, 4, 3], [1, 2, 3]])),
    "and-with-dense": masks.and_masks(
        masks.causal(), masks.dense(torch.ones(N_Q, N_K, dtype=torch.bool))
    ),
}


@pytest.mark.parametrize("name", sorted(INEXPRESSIBLE))
def test_other_masks_take_the_generic_path(name):
    assert INEXPRESSIBLE[name].lower(GEOMETRY) is None


def test_cpu_auto_never_touches_triton(monkeypatch):
    def fail():
        raise AssertionError("the CPU path imported the Triton kernels")

    monkeypatch.setattr(dispatch, "triton", fail)
    q, k, v = qkv((1, 2, 5, 4), (1, 2, 5, 4), seed=0)
    et.attention(q, k, v, is_causal=True)


@pytest.mark.parametrize(
    ("keywords", "reason"),
    [
        ({"dropout_p": 0.2, "seed": 1}, "dropout"),
        ({"mask": masks.predicate(lambda i, j: j <= i)}, "Predicate"),
        ({"mask": torch.ones(5, 5, dtype=torch.bool)}, "Dense"),
    ],
)
def test_forcing_triton_names_what_it_cannot_run(keywords, reason):
    q, k, v = qkv((1, 2, 5, 4), (1, 2, 5, 4), seed=0, dtype=torch.float32)
    with pytest.raises(ValueError, match=reason):
        et.attention(q, k, v, impl="triton", **keywords)


def test_forcing_triton_rejects_float64_and_broadcast_heads():
    q, k, v = qkv((1, 2, 5, 4), (1, 2, 5, 4), seed=0)
    with pytest.raises(ValueError, match="dtype"):
        et.attention(q, k, v, impl="triton")
    q, k, v = qkv((1, 2, 5, 4), (1, 1, 5, 4), seed=0, dtype=torch.float32)
    with pytest.raises(ValueError, match="broadcast"):
        et.attention(q, k, v, impl="triton")
