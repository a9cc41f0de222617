"""The Triton dispatch: which masks the kernels express, and the argument mapping."""

from __future__ import annotations

import pytest

from tests.optional import requires

torch = requires("torch")

import exactattn.torch as et
from exactattn import masks

from .helpers import qkv

N_Q, N_K, BATCH = 6, 9, (2, 3)


def _kernel_allowed(args: et.KernelArgs) -> torch.Tensor:
    """The kernels' documented predicate (triton_kernels module docstring), densely."""
    i = torch.arange(N_Q)[:, None]
    j = torch.arange(N_K)[None, :]
    alignment = args.causal or args.alignment or "top-left"
    centre = i + (N_K - N_Q if alignment == "bottom-right" else 0)
    allowed = torch.ones(BATCH[0], N_Q, N_K, dtype=torch.bool)
    if args.causal is not None:
        allowed = allowed & (j <= centre)
    if args.window is not None:
        left, right = args.window
        if left is not None:
            allowed = allowed & (j >= centre - left)
        if right is not None:
            allowed = allowed & (j <= centre + right)
    if args.kv_lengths is not None:
        allowed = allowed & (j < args.kv_lengths[:, None, None])
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
}


@pytest.mark.parametrize("name", sorted(EXPRESSIBLE))
def test_kernel_arguments_express_the_same_mask(name):
    mask = EXPRESSIBLE[name]
    args = et.kernel_args(mask, BATCH)
    assert args is not None
    geometry = masks.Geometry(n_q=N_Q, n_k=N_K, batch=BATCH)
    want = (
        torch.ones(*BATCH, N_Q, N_K, dtype=torch.bool)
        if mask is None
        else mask.tile(torch.arange(N_Q)[:, None], torch.arange(N_K)[None, :], geometry)
    )
    assert torch.equal(_kernel_allowed(args), want.expand(*BATCH, N_Q, N_K))


def test_causal_maps_to_the_causal_argument():
    assert et.kernel_args(masks.causal(), BATCH).causal == "top-left"
    assert et.kernel_args(masks.causal("bottom-right"), BATCH).causal == "bottom-right"
    assert et.kernel_args(masks.sliding_window(3, 0), BATCH).window == (3, 0)


INEXPRESSIBLE = {
    "dense": masks.dense(torch.ones(N_Q, N_K, dtype=torch.bool)),
    "predicate": masks.predicate(lambda i, j: j != i),
    "or": masks.or_masks(masks.causal(), masks.sliding_window(0, 1)),
    "two-windows": masks.and_masks(masks.causal(), masks.sliding_window(2, 2)),
    "padding-per-head": masks.key_padding(torch.tensor([[9, 4, 3], [1, 2, 3]])),
    "and-with-dense": masks.and_masks(
        masks.causal(), masks.dense(torch.ones(N_Q, N_K, dtype=torch.bool))
    ),
}


@pytest.mark.parametrize("name", sorted(INEXPRESSIBLE))
def test_other_masks_take_the_generic_path(name):
    assert et.kernel_args(INEXPRESSIBLE[name], BATCH) is None


def test_cpu_auto_never_touches_triton(monkeypatch):
    def fail():
        raise AssertionError("the CPU path imported the Triton kernels")

    monkeypatch.setattr(et, "_triton", fail)
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
