"""The catalogue against torch's compiled FlexAttention (the fused CPU kernel, float32).

Slow: each program compiles its own kernel (~5–10 s each here). The compiled CPU kernel
supports float32 inference without the lse, so this compares the float32 output with
exactattn's float64 one; the kernel accumulates in float32 over ≤ 37 keys, so 2e-5 is a few
hundred float32 units on outputs of size ~1.

Two torch 2.13 defects this avoids (and found): a score_mod reading a float64 tensor with
float32 inputs gives NaN and wrong rows (so the programs here read float32 tensors), and
recompiling one compiled function for many programs eventually fails to build its C++
kernel (so each program gets a fresh compile).
"""

from __future__ import annotations

import pytest

from tests.optional import requires

torch = requires("torch")
from torch.nn.attention.flex_attention import flex_attention as torch_flex_attention

from exactattn.torch import flex_attention

from . import catalogue
from .test_catalogue import B, H, N, _block_mask, _inputs

pytestmark = pytest.mark.slow
PROGRAMS = catalogue.programs(B, H, N, dtype=torch.float32)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_compiled_flex_attention_agrees_with_the_exact_result(name):
    torch._dynamo.reset()
    compiled = torch.compile(torch_flex_attention)
    program = PROGRAMS[name]
    q, k, v, _ = _inputs(B, H, N, seed=5)
    block_mask = _block_mask(program)
    want = flex_attention(q, k, v, program.score_mod, block_mask)
    got = compiled(q.float(), k.float(), v.float(), program.score_mod, block_mask)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=0)
