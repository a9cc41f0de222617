"""The FP8 torch context (``backend="torch-fp8-e4m3"`` / ``"torch-fp8-e5m2"``): fp32 torch
arithmetic with ``p`` rounded to FP8 before ``p·V``.

The expected rounding is written from the formats' definitions, not from torch's float8
cast: e4m3 keeps 3 fraction bits with normal exponents down to −6 (subnormal spacing 2^−9),
e5m2 keeps 2 with exponents down to −14 (spacing 2^−16); ``p ∈ [0, 1]`` never reaches
either format's largest value, and ties go to the even significand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.optional import requires

torch = requires("torch")

import exactattn
from exactattn.backends import resolve_backend
from exactattn.backends.fp8_backend import Fp8Context
from exactattn.backends.torch_backend import TorchContext

FORMATS = {"e4m3": (3, -6), "e5m2": (2, -14)}  # fraction bits, smallest normal exponent


def rounded_to(fmt: str, p: np.ndarray) -> np.ndarray:
    """``p ≥ 0`` rounded to nearest (ties to even) on the format's grid near ``p``."""
    fraction, e_min = FORMATS[fmt]
    exponent = np.maximum(np.floor(np.log2(np.where(p > 0, p, 1.0))), e_min)
    spacing = np.exp2(exponent - fraction)
    return np.round(p / spacing) * spacing  # np.round: half to even


def probabilities() -> np.ndarray:
    """Weights in [0, 1]: random ones, every tie between two grid points of either format
    near 1/3, and the subnormal range."""
    rng = np.random.default_rng(0)
    ties = [k * 2.0**-5 + 2.0**-6 for k in range(8, 16)] + [k * 2.0**-4 for k in range(1, 9)]
    return np.concatenate(
        [rng.random(2000), ties, rng.random(200) * 2.0**-8, [0.0, 1.0, 2.0**-9, 2.0**-17]]
    )


def rounds_p_to(ctx, fmt: str) -> bool:
    p = probabilities()
    got = ctx.round_p(torch.from_numpy(p).float()).double().numpy()
    return np.array_equal(got, rounded_to(fmt, p.astype(np.float32).astype(np.float64)))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_the_named_context_rounds_p_to_its_format(fmt):
    ctx = resolve_backend(f"torch-fp8-{fmt}")
    assert isinstance(ctx, Fp8Context)
    assert ctx.name == f"torch[float32,cpu,p_cast={fmt}]"
    assert ctx.storage_dtype == ctx.compute_dtype == torch.float32
    assert rounds_p_to(ctx, fmt)


def test_the_check_refutes_contexts_that_round_p_otherwise():
    """The broken twins: no rounding of p, bfloat16's 7 fraction bits, the other format."""
    assert not rounds_p_to(TorchContext(torch.float32), "e4m3")
    assert not rounds_p_to(TorchContext(torch.float32, p_cast=torch.bfloat16), "e4m3")
    assert not rounds_p_to(Fp8Context("e5m2"), "e4m3")


def test_attention_on_the_fp8_context_rounds_the_weights_once():
    """Y from the tiled algorithm with one key block is ``Σ_j fp8(p_ij) V_j / ℓ_i`` (``p``
    rounded once, before the product; ℓ from the unrounded p) in float64 from the
    definition, within fp32's rounding."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((5, 4)) for _ in range(3))
    y = exactattn.attention(q, k, v, backend="torch-fp8-e4m3", block_size=8)
    q32, k32, v32 = (x.astype(np.float32).astype(np.float64) for x in (q, k, v))
    s = q32 @ k32.T / math.sqrt(4)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    want = rounded_to("e4m3", p) @ v32 / p.sum(axis=1, keepdims=True)
    assert np.allclose(y.double().numpy(), want, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="fmt must be one of"):
        Fp8Context("e3m4")
