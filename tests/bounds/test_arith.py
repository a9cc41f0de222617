"""The arithmetic descriptions: formats, claims, contexts, and the facts they rely on."""

from __future__ import annotations

import numpy as np
import pytest

import exactattn
from exactattn.error.bounds import HALF_FUNCS, Arith, number_format
from tests.optional import requires


def test_formats_by_name_dtype_and_bits():
    assert number_format("fp16").u == 2.0**-11 and number_format("fp16").mu == 2.0**-25
    assert number_format("bf16").p == 8 and number_format("bf16").e_min == -126
    assert number_format(np.float32).u == 2.0**-24
    assert number_format("e4m3").mu == 2.0**-10
    assert number_format("p9").u == 2.0**-9 and number_format("p9").mu == 0.0
    torch = requires("torch")
    assert number_format(torch.bfloat16) == number_format("bfloat16")
    with pytest.raises(ValueError, match="unknown number format 'fp12'"):
        number_format("fp12")


def test_claim_parses_the_check_commands_syntax():
    a = Arith.claim("input=fp16,scores=fp32,stats=fp32,p=fp16,acc=fp32,block=128")
    got = (a.input.p, a.compute.p, a.acc.p, a.p.p, a.output.p, a.block)
    assert got == (11, 24, 24, 11, 11, 128)
    default = Arith.claim("input=bf16")
    assert default.compute == default.acc == default.output == number_format("bf16")
    assert default.block is None and default.p is None  # unstated block: the worst case
    coarse = Arith.claim("input=fp32,scores=fp32,stats=bf16")
    assert coarse.compute == number_format("bf16")  # the coarser of scores and stats
    for bad, message in (
        ("input=fp16,block=0", "positive integer"),
        ("input=fp16,foo=1", "key=value"),
        ("input", "key=value"),
        ("input=fp17", "unknown number format"),
    ):
        with pytest.raises(ValueError, match=message):
            Arith.claim(bad)


def test_contexts_describe_their_policy():
    fa2 = Arith.of_context(exactattn.NumpyContext("float16", "float32", "float16"), block=64)
    assert (fa2.input.p, fa2.compute.p, fa2.p.p, fa2.acc.p, fa2.block) == (11, 24, 11, 24, 64)
    half = Arith.of_context(exactattn.NumpyContext("float16"))
    assert (half.compute.p, half.acc.p, half.p) == (11, 24, None)
    mp = Arith.of_context(exactattn.MpmathContext(prec=9))
    assert mp == Arith.bits(9)
    with pytest.raises(TypeError, match="no arithmetic known"):
        Arith.of_context(object())
    with pytest.raises(ValueError, match="block must be >= 1"):
        Arith.bits(8, block=0)


def test_numpy_half_products_and_row_sums_accumulate_in_float32():
    """Arith.of_context claims acc = float32 for NumPy half: ``2048 + 1 + 1 + …`` (63 ones)
    stays at 2048 when every partial sum is rounded to half, and is fl16(2111) otherwise."""
    x = np.ones(64, dtype=np.float16)
    x[0] = 2048
    assert (x[None, :] @ np.ones((64, 1), dtype=np.float16)).item() == 2112.0  # fl16(2111)
    assert float(np.sum(x[None, :], axis=-1)[0]) == 2112.0
    y = np.ones((3, 64), dtype=np.float16)
    y[:, 0] = 2048
    assert float((y @ np.ones((64, 5), dtype=np.float16).T.copy().T)[1, 2]) == 2112.0


def test_torch_half_products_and_row_sums_accumulate_in_float32_on_the_cpu():
    torch = requires("torch")
    from exactattn.backends.torch_backend import TorchContext

    for dtype, big, want in ((torch.float16, 2048, 2112.0), (torch.bfloat16, 256, 320.0)):
        x = torch.ones(64, dtype=dtype)
        x[0] = big
        assert (x[None, :] @ torch.ones((64, 1), dtype=dtype)).item() == want
        assert float(x.sum()) == want
        assert Arith.of_context(TorchContext(dtype, compute=dtype)).acc.p == 24


def _worst_relative(x: np.ndarray, got: np.ndarray, fn, tiny: float, big: float) -> float:
    """Largest ``|got − fn(x)| / |fn(x)|`` over normal, finite results (float64 reference)."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        want = fn(x.astype(np.float64))
    keep = np.isfinite(want) & (np.abs(want) >= tiny) & (np.abs(want) <= big)
    return float(np.max(np.abs(got.astype(np.float64)[keep] - want[keep]) / np.abs(want[keep])))


@pytest.mark.parametrize("name", ["exp", "log", "tanh"])
def test_half_elementary_functions_err_by_at_most_half_funcs_units_on_every_input(name):
    """Arith.of_context's funcs for half compute, checked on all 2^16 inputs of each type."""
    fn = getattr(np, name)
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    x = x[np.isfinite(x) & ((x > 0) if name == "log" else True)]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        got = fn(x)
    assert _worst_relative(x, got, fn, 2.0**-14, 65504.0) <= HALF_FUNCS * 2.0**-11
    torch = requires("torch")
    types = ((torch.float16, 2.0**-11, 2.0**-14), (torch.bfloat16, 2.0**-8, 2.0**-126))
    for dtype, u, tiny in types:
        xt = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(dtype)
        xt = xt[torch.isfinite(xt) & ((xt > 0) if name == "log" else True)]
        got = getattr(torch, name)(xt).double().numpy()
        worst = _worst_relative(xt.double().numpy(), got, fn, tiny, float(torch.finfo(dtype).max))
        assert worst <= HALF_FUNCS * u, (dtype, worst / u)
