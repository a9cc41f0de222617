"""The torch path hands bias and softcap to the Triton kernels (interpreter on the CPU).

``impl="triton"`` (the kernels) and ``impl="generic"`` (the one algorithm over torch
tensors) are two implementations of the same maths: both are compared with the float64
definitions of ``score_spec`` and with each other, forward and every gradient, the bias's
included, with a causal mask and grouped heads so the dispatch passes all of it.
"""

from __future__ import annotations

import pytest
import torch

import exactattn.torch as eat
from exactattn.core import masks
from tests.torch_path.helpers import count_lowerings

from .score_spec import U_ACC, UNIT_ROUNDOFF, allowed_pairs, expected
from .test_score_mod import make_bias, make_inputs

B, H, H_KV, NQ, NK, D = 2, 4, 2, 19, 23, 16


@pytest.mark.parametrize(("bias", "softcap"), [(True, None), (False, 3.0), (True, 3.0)])
def test_bias_and_softcap_reach_the_kernels_and_agree_with_the_definition(bias, softcap):
    q, k, v, g = make_inputs((B, H, NQ, D), (B, H_KV, NK, D), D, torch.float32, "cpu")
    b = make_bias((H, NQ, NK), torch.float32, "cpu") if bias else None
    ref = expected(
        q, torch.repeat_interleave(k, H // H_KV, 1), torch.repeat_interleave(v, H // H_KV, 1),
        g, scale=D**-0.5, bias=b, softcap=softcap,
        allowed=allowed_pairs(B, NQ, NK, causal="bottom-right"),
    )  # fmt: skip
    runs = {}
    for impl in ("triton", "generic"):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        b_leaf = None if b is None else b.clone().requires_grad_()
        y = eat.attention(
            *leaves, is_causal=True, alignment="bottom-right", enable_gqa=True,
            bias=b_leaf, softcap=softcap, impl=impl,
        )  # fmt: skip
        y.backward(g)
        grads = [x.grad for x in leaves] + ([] if b_leaf is None else [b_leaf.grad])
        runs[impl] = (y.detach(), *grads)
    fold = (B, H_KV, H // H_KV, NK, D)
    wants = [ref.o, ref.dq, ref.dk.reshape(fold).sum(2), ref.dv.reshape(fold).sum(2)]
    if b is not None:
        wants.append(ref.dbias)
    scale = 64 * (UNIT_ROUNDOFF[torch.float32] + (NQ + NK) * U_ACC)
    for impl, got in runs.items():
        for name, x, want in zip(("y", "dq", "dk", "dv", "dbias"), got, wants):
            finite = torch.isfinite(want)
            err = (x.double() - want.double())[finite].abs().max().item()
            bound = scale * max(1.0, want[finite].abs().max().item())
            assert err <= bound, f"{impl} {name}: error {err:.3g} > {bound:.3g}"


def test_the_kernel_dispatch_reads_the_one_lowered_band(monkeypatch):
    """Choosing the kernels takes the call's one lowering of its mask, forward and reverse."""
    q, k, v, g = make_inputs((B, H, NQ, D), (B, H_KV, NK, D), D, torch.float32, "cpu")
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    lowerings = count_lowerings(monkeypatch)
    mask = masks.sliding_window(5, 0, "bottom-right")
    y = eat.attention(*leaves, mask=mask, enable_gqa=True, impl="triton")
    y.backward(g)
    assert lowerings == [1]
