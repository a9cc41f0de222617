"""Shared inputs and comparisons for the torch tests."""

from __future__ import annotations

import numpy as np
import torch


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float64, grad: bool = False):
    """A reproducible standard-normal tensor (drawn in float64 by NumPy, then cast)."""
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal(shape)).to(dtype)
    return x.requires_grad_(grad)


def qkv(q_shape, k_shape, v_shape=None, *, seed=0, dtype=torch.float64, grad=False):
    v_shape = v_shape or k_shape
    return (
        randn(*q_shape, seed=seed, dtype=dtype, grad=grad),
        randn(*k_shape, seed=seed + 1, dtype=dtype, grad=grad),
        randn(*v_shape, seed=seed + 2, dtype=dtype, grad=grad),
    )


def value_and_grads(fn, q, k, v, g):
    """``(y, dq, dk, dv)`` of ``y = fn(q, k, v)`` at the upstream gradient ``g``."""
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    y = fn(*leaves)
    grads = torch.autograd.grad(y, leaves, g)
    return (y.detach(), *grads)


def assert_close(got, want, atol, rtol=0.0, what=""):
    got = torch.as_tensor(got, dtype=torch.float64)
    want = torch.as_tensor(want, dtype=torch.float64)
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got - want).abs().max().item() if got.numel() else 0.0
    bound = atol + rtol * want.abs().max().item() if want.numel() else atol
    assert err <= bound, f"{what}: max abs error {err:.3g} > {bound:.3g}"


def count_lowerings(monkeypatch) -> list[int]:
    """A one-item list counting the outermost ``Mask.lower`` calls from now on (a spy on
    every mask class's ``lower``; an AND lowering its parts is one lowering, not three)."""
    from exactattn.core import masks

    classes, todo = [], [masks.Mask]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo.extend(cls.__subclasses__())
    count, depth = [0], [0]
    for cls in (c for c in classes if "lower" in vars(c)):
        original = vars(cls)["lower"]

        def spy(self, geometry, _original=original):
            count[0] += depth[0] == 0
            depth[0] += 1
            try:
                return _original(self, geometry)
            finally:
                depth[0] -= 1

        monkeypatch.setattr(cls, "lower", spy)
    return count
