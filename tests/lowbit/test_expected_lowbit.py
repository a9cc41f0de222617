"""The expected error of Y for low-bit arithmetic: the separate p·V accumulator's term, and
no estimate where score errors may reorder the keys (each shown needed by its twin)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from exactattn import api
from exactattn.backends.formats import get_format
from exactattn.backends.lowbit_backend import LowbitContext
from exactattn.cases.inputs import make_inputs
from exactattn.error.bounds import Arith
from exactattn.error.expected_bounds import expected_bounds
from exactattn.error.lowbit import SCHEMES
from exactattn.testing.suspicion import FAR


def _attention(q, k, v, c):
    s = c * (q @ k.T)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)) @ v


def test_the_pv_accumulator_term_is_needed():
    """p·V summed in fp16 over blocks of 512 keys (fp32 everything else): within FAR times
    the expected error that charges it, far beyond the one that does not."""
    inputs = make_inputs("normal", 512, 32, 7)
    q, k, v = (inputs[x] for x in "qkv")
    c = 1 / math.sqrt(32)
    y = np.asarray(
        api.attention(q, k, v, scale=c, block_size=512, backend=LowbitContext(pv_acc="fp16"))
    )
    err = np.abs(y - _attention(q, k, v, c))
    fp32 = get_format("float32")
    honest = Arith(fp32, fp32, fp32, fp32, block=512, pv_acc=get_format("float16"))
    with_term = expected_bounds(honest, q, k, v, scale=c, input_rounding=True)["y"]
    without = expected_bounds(replace(honest, pv_acc=None), q, k, v, scale=c, input_rounding=True)[
        "y"
    ]
    assert (err / with_term).max() <= FAR
    assert (err / without).max() > FAR


def test_rows_whose_keys_may_reorder_have_no_estimate():
    """FP8 per-tensor inputs with logits of hundreds, quantised by any quantiser within
    e4m3's error: a score may err by more than its gap, so no first-order variance holds
    there (inf); N(0, 1) inputs keep a finite estimate. With the quantiser stated
    (``nearest``) the estimate is of the arithmetic after it, at the quantised inputs: finite
    at either scale."""
    stated = SCHEMES["fa3-fp8-tensor"]
    unstated = replace(stated, quantiser="any")
    for dist, scale, finite in (("normal", 1.0, True), ("normal", 200.0, False)):
        inputs = make_inputs(dist, 64, 32, 8)
        c = scale / math.sqrt(32)
        for scheme, at, finite_here in (
            (unstated, unstated.exact(inputs)[0], finite),
            (stated, stated.reference_inputs(inputs), True),
        ):
            arith = scheme.arith(64, inputs)
            got = expected_bounds(arith, *(at[x] for x in "qkv"), scale=c, input_rounding=True)
            assert bool(np.isfinite(got["y"]).all()) is finite_here, scheme.quantiser
