"""Configurations, FP8 casts and the first-order forward bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

import exactattn
from exactattn.precision import fp8
from exactattn.precision.bound import bound_ratio, forward_bound
from exactattn.precision.configs import available, get_config, to_float64
from exactattn.precision.inputs import make_inputs
from tests.optional import requires

requires("flint")

from exactattn.precision.reference import certified_reference


def test_config_registry():
    mp = get_config("mp9")
    assert (mp.backend, mp.bits, mp.compute_format.u) == ("mpmath", 9, 2.0**-9)
    assert mp.make_ctx() == exactattn.MpmathContext(prec=9)
    fa2 = get_config("np-fa2-fp16")
    assert fa2.make_ctx() == exactattn.NumpyContext("float16", "float32", "float16")
    assert (fa2.input_format.p, fa2.compute_format.p, fa2.p_format.p) == (11, 24, 11)
    with pytest.raises(ValueError, match="unknown configuration"):
        get_config("np-fp12")
    with pytest.raises(ValueError, match="N >= 2"):
        get_config("mp1")


def test_torch_rows_plug_in_when_the_backend_imports():
    ok, why = available("torch-bf16")
    requires("torch")
    from exactattn.backends import torch_backend

    assert ok, why
    ctx = get_config("torch-fa2-bf16").make_ctx()
    assert isinstance(ctx, torch_backend.TorchContext)
    assert "compute=float32" in ctx.name and "p_cast=bfloat16" in ctx.name


def test_fp8_quantisation_is_per_tensor_and_on_the_grid():
    torch = requires("torch")
    x = make_inputs("fa3-outliers", 64, 16, seed=0)["q"]
    xq = fp8.quantize_per_tensor(x, "e4m3")
    scale = np.abs(x).max() / 448.0
    grid = torch.from_numpy(xq / scale).to(torch.float8_e4m3fn).double().numpy() * scale
    assert np.allclose(grid, xq, rtol=1e-12, atol=0)  # already on the scaled e4m3 grid
    normal = np.abs(x) > 2.0**-6 * scale
    assert np.all(np.abs(xq - x)[normal] <= 2.0**-4 * np.abs(x)[normal])
    assert np.abs(xq).max() == pytest.approx(np.abs(x).max())
    ctx = get_config("torch-fp8-e4m3").make_ctx()
    p = torch.tensor([0.3, 0.01, 1.0], dtype=torch.float32)
    assert ctx.round_p(p).tolist() == p.to(torch.float8_e4m3fn).float().tolist()


def _measured_ratio(config_name: str, bound_config: str, n: int = 48, block: int = 16) -> float:
    inputs = make_inputs("normal", n, 16, seed=3)
    scale = 1 / math.sqrt(16)
    ref = certified_reference(inputs, scale=scale, prec=120, grads=False)
    config = get_config(config_name)
    y = exactattn.attention(
        *(config.prepare(inputs[x]) for x in "qkv"),
        scale=scale,
        block_size=block,
        backend=config.make_ctx(),
    )
    error = (to_float64(y) - ref.hi["y"]) - ref.lo["y"]
    bound = forward_bound(get_config(bound_config), inputs, scale=scale, block_size=block)
    return bound_ratio(error, bound)


@pytest.mark.parametrize("name", ["np-fp16", "np-fa2-fp16", "np-fp32", "mp8"])
def test_measured_forward_error_stays_below_the_bound(name):
    assert 0 < _measured_ratio(name, name) <= 1


def test_the_bound_check_can_fail():
    """An fp16 run measured against the fp32 configuration's bound exceeds it."""
    assert _measured_ratio("np-fp16", "np-fp32") > 1
