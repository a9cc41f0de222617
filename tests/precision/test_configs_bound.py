"""Configurations (IEEE, FP8, mpmath, emulated), and the sweep's bound columns on real runs."""

from __future__ import annotations

import numpy as np
import pytest

import exactattn
from exactattn.cases.inputs import make_inputs
from exactattn.error import bounds
from exactattn.precision.configs import available, get_config
from exactattn.precision.grid import Point
from tests.optional import requires

requires("flint")

from exactattn.precision.tasks import reference_task, run_task


def test_config_registry():
    mp = get_config("mp9")
    assert (mp.backend, mp.bits, mp.compute_format.u) == ("mpmath", 9, 2.0**-9)
    assert mp.make_ctx() == exactattn.MpmathContext(prec=9)
    assert (mp.rounding, mp.granularity) == ("nearest", "scalar")
    fa2 = get_config("np-fa2-fp16")
    assert fa2.make_ctx() == exactattn.NumpyContext("float16", "float32", "float16")
    assert (fa2.input_format.p, fa2.compute_format.p, fa2.p_format.p) == (11, 24, 11)
    with pytest.raises(ValueError, match="unknown configuration"):
        get_config("np-fp12")
    with pytest.raises(ValueError, match="N >= 2"):
        get_config("mp1")


def test_emulated_configurations_are_registry_entries():
    rz = get_config("emu8-rz")
    ctx = rz.make_ctx()
    assert (rz.backend, rz.bits, rz.rounding, rz.granularity) == (
        "emulated",
        8,
        "toward_zero",
        "op",
    )
    assert (ctx.format.mantissa_bits, ctx.format.emin, ctx.granularity) == (8, -1022, "op")
    arith = bounds.Arith.of_context(ctx, block=16)
    assert arith.compute.u == 2.0**-7  # truncation: one ulp, as 7 bits to nearest
    assert arith.acc.p == 53 and arith.compute.e_min == -1022
    rn = get_config("emu11-rn-fa2-scalar").make_ctx()
    assert (rn.format.mantissa_bits, rn.storage.mantissa_bits, rn.p_cast.mantissa_bits) == (
        24,
        11,
        11,
    )
    assert rn.granularity == "scalar" and bounds.Arith.of_context(rn).acc.p == 24
    for bad in ("emu27-rn", "emu1-rz"):
        with pytest.raises(ValueError, match="2 <= N <= 26"):
            get_config(bad)


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
    from exactattn.backends import quantize as fp8

    x = make_inputs("fa3-outliers", 64, 16, seed=0)["q"]
    xq = fp8.quantize_per_tensor(x, "e4m3")
    scale = np.abs(x).max() / 448.0
    assert fp8.tensor_scale(x, "e4m3") == scale
    grid = torch.from_numpy(xq / scale).to(torch.float8_e4m3fn).double().numpy() * scale
    assert np.allclose(grid, xq, rtol=1e-12, atol=0)  # already on the scaled e4m3 grid
    normal = np.abs(x) > 2.0**-6 * scale
    assert np.all(np.abs(xq - x)[normal] <= 2.0**-4 * np.abs(x)[normal])
    assert np.abs(xq).max() == pytest.approx(np.abs(x).max())
    ctx = get_config("torch-fp8-e4m3").make_ctx()
    p = torch.tensor([0.3, 0.01, 1.0], dtype=torch.float32)
    assert ctx.round_p(p).tolist() == p.to(torch.float8_e4m3fn).float().tolist()
    # the bound's input format covers s·μ_e4m3 for the largest scale
    inputs = make_inputs("fa3-outliers", 64, 16, seed=0)
    arith = get_config("torch-fp8-e4m3").arith(inputs, 16)
    largest = max(fp8.tensor_scale(inputs[x], "e4m3") for x in "qkv")
    assert arith.input.p == 4 and arith.input.mu >= largest * 2.0**-10


def _rows(config: str, n: int = 48, block: int = 16, dist: str = "normal", grads=True):
    point = Point(config, n, 16, block, dist, 1.0, "causal", 3, grads)
    ref = reference_task(point.problem, None)
    return {row["impl"]: row for row in run_task(point, ref)}


@pytest.mark.parametrize(
    "name",
    ["np-fp16", "np-fa2-fp16", "np-fp32", "np-fp64", "mp8", "emu8-rz", "emu8-rn", "emu8-rz-fa2"],
)
def test_every_run_stays_within_the_bound_forward_and_backward(name):
    for impl, row in _rows(name).items():
        assert row["status"] == "ok"
        assert 0 < row["bound_ratio"] <= 1, (impl, row["bound_ratio"])
        assert 0 < row["grad_bound_ratio"] <= 1, (impl, row["grad_bound_ratio"])
        assert row["bound_vacuous"] == 0


def test_the_bound_columns_can_fail(monkeypatch):
    """fp16 runs judged by float32's arithmetic exceed the bound, forward and backward."""
    from exactattn.precision import configs

    arith, fp32 = configs.Config.arith, get_config("np-fp32")
    monkeypatch.setattr(configs.Config, "arith", lambda self, i, b: arith(fp32, i, b))
    rows = _rows("np-fp16").values()
    assert max(r["bound_ratio"] for r in rows) > 1
    assert max(r["grad_bound_ratio"] for r in rows) > 1


@pytest.mark.parametrize("name", ["np-fp64", "np-fp32"])
def test_entries_far_below_the_others_are_measured_with_their_own_radius(name):
    """Large logits under a causal mask: gradient entries through weights near e^-700 have
    bounds far below the reference's largest radius (measured against that radius, float64
    read ~1e16 times its bound in the full preset); each entry's own radius is as small."""
    for impl, row in _rows(name, n=64, dist="large-logits").items():
        assert 0 < row["grad_bound_ratio"] <= 1, (impl, row["grad_bound_ratio"])
