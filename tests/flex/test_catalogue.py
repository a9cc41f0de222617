"""The catalogue of FlexAttention's documented programs, run unchanged on exactattn.

Each program (:mod:`.catalogue`) is compared with torch's FlexAttention (eager, float64:
output and lse), and with its specification (:mod:`.spec`, the materialised formula and, for
a mask plus an additive bias, torch's SDPA) for the output and every gradient; the same
program then runs on NumPy float64 (tiled, several key-block sizes) and on mpmath (small
n), and agrees. A BlockMask of 8×8 blocks over n = 37 gives EMPTY, FULL and PARTIAL tiles
and a partial last block.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tests.optional import requires

torch = requires("torch")
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask
from torch.nn.attention.flex_attention import flex_attention as torch_flex_attention

import exactattn as ea
from exactattn.torch import flex_attention

from . import catalogue, spec

B, H, N, D, BLOCK = 2, 4, 37, 8, 8
PROGRAMS = catalogue.programs(B, H, N)
SMALL = catalogue.programs(2, 2, 6, seed=1)


def _inputs(batch, heads, n, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v, g = (torch.from_numpy(rng.standard_normal((batch, heads, n, D))) for _ in range(4))
    return 2 * q, k, v, g  # scores up to ~10: the soft-cap's curved part


def _block_mask(program, n=N, batch=B, heads=H):
    if program.mask_mod is None:
        return None
    return create_block_mask(program.mask_mod, batch, heads, n, n, device="cpu", BLOCK_SIZE=BLOCK)


def _spec(program, q, k, v, g):
    """The specification's ``(Y, lse)`` and ``(dq, dk, dv[, dtable])``."""
    table = () if program.table is None else (program.table,)

    def run(q, k, v, table=None):
        bias = None if program.bias is None else program.bias(table)
        return spec.naive(q, k, v, program.allowed, bias, program.softcap)

    y, lse = run(q, k, v, *table)
    return y, lse, spec.value_and_grads(run, q, k, v, g, *table)[1:]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_forward_and_lse_equal_torch_flex_attention(name):
    program = PROGRAMS[name]
    q, k, v, _ = _inputs(B, H, N)
    block_mask = _block_mask(program)
    with warnings.catch_warnings():  # eager FlexAttention warns that it is not compiled
        warnings.simplefilter("ignore", UserWarning)
        want, aux = torch_flex_attention(
            q, k, v, program.score_mod, block_mask, return_aux=AuxRequest(lse=True)
        )
    got, got_aux = flex_attention(
        q, k, v, program.score_mod, block_mask, return_aux=AuxRequest(lse=True)
    )
    torch.testing.assert_close(got, want, atol=1e-13, rtol=0)
    torch.testing.assert_close(got_aux.lse, aux.lse, atol=1e-13, rtol=0)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_output_and_gradients_equal_the_specification(name):
    """exactattn.torch.flex_attention's backward (on the CPU) against autograd of the formula."""
    program = PROGRAMS[name]
    q, k, v, g = _inputs(B, H, N, seed=1)
    y_s, lse_s, grads_s = _spec(program, q, k, v, g)
    block_mask = _block_mask(program)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    table = program.table
    if table is not None:
        table.requires_grad_(True)  # the mod reads this very tensor: its gradient is checked
        table.grad = None
    try:
        y, aux = flex_attention(
            *leaves, program.score_mod, block_mask, return_aux=AuxRequest(lse=True)
        )
        y.backward(g)
    finally:
        if table is not None:
            table.requires_grad_(False)
    torch.testing.assert_close(y.detach(), y_s, atol=1e-13, rtol=0)
    torch.testing.assert_close(aux.lse, lse_s, atol=1e-13, rtol=0)
    got = [x.grad for x in leaves] + ([] if table is None else [table.grad])
    assert len(got) == len(grads_s)
    for a, want in zip(got, grads_s):
        torch.testing.assert_close(a, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", [n for n in sorted(PROGRAMS) if PROGRAMS[n].sdpa_expressible])
def test_specification_is_sdpa_with_the_materialised_mask_and_bias(name):
    """The formula the other tests use agrees with torch's SDPA where SDPA can say it."""
    program = PROGRAMS[name]
    q, k, v, _ = _inputs(B, H, N, seed=2)
    bias = None if program.bias is None else program.bias(program.table)
    want = spec.sdpa(q, k, v, program.allowed, bias)
    got = flex_attention(q, k, v, program.score_mod, _block_mask(program))
    torch.testing.assert_close(got, want, atol=1e-13, rtol=0)
    torch.testing.assert_close(
        spec.naive(q, k, v, program.allowed, bias)[0], want, atol=1e-13, rtol=0
    )


def _exact_mask(program, block_mask):
    return program.exact_mask if program.exact_mask is not None else block_mask


@pytest.mark.parametrize("block_size", [5, 64])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_numpy_float64_runs_the_same_program(name, block_size):
    program = PROGRAMS[name]
    q, k, v, g = _inputs(B, H, N, seed=3)
    y_s, lse_s, grads_s = _spec(program, q, k, v, g)
    arrays = [x.numpy() for x in (q, k, v, g)]
    kw = dict(
        mask=_exact_mask(program, _block_mask(program)),
        score_mod=program.score_mod,
        block_size=block_size,
    )
    y, stats = ea.attention(*arrays[:3], return_stats=True, **kw)
    grads = ea.attention_backward(*arrays[:3], y, stats, arrays[3], **kw)
    np.testing.assert_allclose(y, y_s.numpy(), atol=1e-13, rtol=0)
    np.testing.assert_allclose(stats.lse, lse_s.numpy(), atol=1e-13, rtol=0)
    for got, want in zip(grads, grads_s):
        np.testing.assert_allclose(got, want.numpy(), atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_mpmath_runs_the_same_program_and_agrees(name):
    """At 100 bits the tiled result is the exact one to ~1e-30: it meets the float64
    specification to float64's rounding, and its mask_mod is the same raw function."""
    program = SMALL[name]
    q, k, v, g = _inputs(2, 2, 6, seed=4)
    y_s, lse_s, grads_s = _spec(program, q, k, v, g)
    ctx = ea.MpmathContext(100)
    mask = program.exact_mask if program.exact_mask is not None else program.mask_mod
    kw = dict(mask=mask, score_mod=program.score_mod, block_size=4, backend=ctx)
    arrays = [x.numpy() for x in (q, k, v, g)]
    y, stats = ea.attention(*arrays[:3], return_stats=True, **kw)
    grads = ea.attention_backward(*arrays[:3], y, stats, arrays[3], **kw)
    as_float = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    np.testing.assert_allclose(as_float(y), y_s.numpy(), atol=1e-14, rtol=0)
    np.testing.assert_allclose(as_float(stats.lse), lse_s.numpy(), atol=1e-14, rtol=0)
    for got, want in zip(grads, grads_s):
        np.testing.assert_allclose(as_float(got), want.numpy(), atol=1e-13, rtol=0)
