"""The stated quantiser (``quantiser=nearest``, :mod:`exactattn.error.nearest_quantiser`):
its ``x̃`` and error model hold for the emulated schemes' quantisation and for a kernel that
quantises in fp32, its window is needed where ``x/s`` sits at a rounding boundary, and the
bound it gives (at ``x̃``, plus ``Y(x̃)``'s distance to ``Y``) holds and informs where the
unstated quantiser's says nothing (FP8 at logits of hundreds)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from exactattn.cases.inputs import make_inputs
from exactattn.error import bounds
from exactattn.error import nearest_quantiser as nq
from exactattn.error.lowbit import SCHEMES
from exactattn.precision.grid import Point
from exactattn.precision.tasks import reference_task, run_task
from tests.optional import requires

STATED = sorted(name for name, s in SCHEMES.items() if s.exactly_quantised)
FP32_U = 2.0**-24


def _within(held: np.ndarray, model: nq.Held) -> bool:
    return bool(
        np.all(np.abs(held - model.values) <= model.rel * np.abs(model.values) + model.each)
    )


def test_the_built_in_schemes_that_quantise_state_their_quantiser():
    assert set(STATED) == {
        name for name, s in SCHEMES.items() if any(getattr(s, x).number for x in "qkv")
    }
    assert len(STATED) == 9


@pytest.mark.parametrize("dist", ["normal", "fa3-outliers"])
@pytest.mark.parametrize("name", STATED)
def test_the_emulated_quantisation_is_within_the_stated_model(name, dist):
    """What the emulated kernel holds (:meth:`Scheme.hold`, float64 quantisation after its
    transformations) against ``x̃`` and its model for an fp32 kernel; almost every entry is
    decided (9 in 10 at least; K smoothing's fp32 mean widens the windows most): its error
    model a relative one, the scale's (the kernel's amax, of its own
    rotated or smoothed values, and fp32 divisions) and the descale's rounding."""
    scheme = SCHEMES[name]
    inputs = make_inputs(dist, 256, 64, 3)
    held = scheme.hold(inputs)["inputs"]
    values, rels, each = scheme._nearest(inputs, FP32_U)
    for x in "qkv":
        model = nq.Held(values[x], rels[x], each[x])
        assert _within(held[x], model), x
        decided = each[x] <= 1e-3 * np.abs(values[x])
        assert decided.mean() > 0.9, (x, decided.mean())


def _fp32_kernel_int8(x: np.ndarray, rows: int, prescale: float = 1.0) -> np.ndarray:
    """INT8 per block of ``rows`` rows as an fp32 kernel computes it, SageAttention's way
    (``quant_per_block_int8_kernel``): ``x' = fl32(x·a)``, ``s = fl32(amax/127)``, ``t =
    fl32(x'/s)``, ``n = trunc(t ± ½)`` (ties away from zero), ``x̂ = s·n/a``."""
    x32 = x.astype(np.float32) * np.float32(prescale)
    out = np.empty_like(x)
    for start in range(0, x.shape[-2], rows):
        block = x32[..., start : start + rows, :]
        s = np.float32(np.abs(block).max()) / np.float32(127)
        t = block / s
        n = np.trunc(t + np.float32(0.5) * np.sign(t)).astype(np.float64)
        out[..., start : start + rows, :] = np.float64(s) * n / prescale
    return out


def _at_ties(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """Values whose ``x/s`` is (in float64) a half-integer: each block's amax 127·s, every
    other entry ``(m + ½)·s``; the fp32 division rounds some of them to the other side."""
    s = rng.uniform(0.01, 0.02, size=(n // 16, 1, 1))
    m = rng.integers(-100, 100, size=(n // 16, 16, d)) + 0.5
    m[:, 0, 0] = 127
    return (m * s).reshape(n, d)


@pytest.mark.parametrize("prescale", [1.0, 0.125 * 1.44269504])
def test_an_fp32_kernel_is_within_the_window_which_it_needs(prescale):
    """At ties an fp32 kernel may round either way (and this one rounds ties away from zero,
    prescaled by SageAttention's ``c·log₂e`` or not): within the model with its unit
    roundoff, outside it when the window is closed (``u = 0``: float64's exact rounding)."""
    x = _at_ties(np.random.default_rng(0), 256, 32)
    kernel = _fp32_kernel_int8(x, 16, prescale)
    assert _within(kernel, nq.hold("int8", "block", 16, "fp32", x, 0.0, FP32_U))
    assert not _within(kernel, nq.hold("int8", "block", 16, "fp32", x, 0.0, 0.0))


def test_a_scale_from_the_wrong_block_is_outside_the_model():
    """The second block of 64 rows (values 8 times larger) divided by the first's scale."""
    x = make_inputs("normal", 128, 32, 1)["k"]
    x[64:] *= 8
    right = _fp32_kernel_int8(x, 64)
    first = np.abs(x[:64]).max() / 127
    wrong = right.copy()
    wrong[64:] = first * np.clip(np.round(x[64:] / first), -127, 127)
    model = nq.hold("int8", "block", 64, "fp32", x, 0.0, FP32_U)
    assert _within(right, model) and not _within(wrong, model)


def test_the_groups_follow_their_definitions():
    """Entry (b, h, i, j)'s group per granularity, against the definitions spelled out."""
    shape = (2, 3, 10, 8)
    b, h, i, j = np.indices(shape)
    head = b * 3 + h
    want = {
        ("tensor", None): np.zeros(shape, int),
        ("head", None): head,
        ("token", None): head * 10 + i,
        ("channel", None): head * 8 + j,
        ("block", 4): head * 3 + i // 4,
        ("group", 4): (head * 10 + i) * 2 + j // 4,
    }
    for (granularity, block), labels in want.items():
        np.testing.assert_array_equal(nq.group_labels(shape, granularity, block), labels)


def test_round_nearest_from_the_formats_tables():
    """Every e2m1 number, e4m3's largest and least subnormal, INT4's saturation."""
    e2m1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    for a in e2m1:
        assert nq.round_nearest(np.array([a, -a]), "e2m1").tolist() == [a, -a]
    assert nq.round_nearest(np.array([2.4, 2.6, 5.1, 7.0]), "e2m1").tolist() == [2, 3, 6, 6]
    assert nq.round_nearest(np.array([448.0, 470.0, 2.0**-9, 2.0**-11]), "e4m3").tolist() == [
        448,
        448,
        2.0**-9,
        0,
    ]
    assert nq.round_nearest(np.array([7.4, -9.0, 2.5]), "int4").tolist() == [7, -7, 2]


def _softmax_attention(q, k, v, c):
    """Attention from its definition, in float64 (softmax of c·q·kᵀ times V)."""
    s = c * (q @ np.swapaxes(k, -1, -2))
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ v


@pytest.mark.parametrize("name", ["fa3-fp8-tensor", "fa3-fp8-block", "sage2-int8"])
def test_the_stated_bound_informs_at_logits_of_hundreds(name):
    """FP8/INT8 at scale 100 (the ``lowbit`` preset's large logits): the sweep's bound with
    the quantiser stated holds and is within 10^4 of the error; the unstated one (any
    quantiser within each group's error) holds but is not."""
    requires("flint")
    point = Point(name, 128, 64, 64, "normal", 100.0, "none", 0, False)
    stated = run_task(point, reference_task(point.problem, None, kind="fast"))[0]
    assert stated["status"] == "ok"
    assert 1e-4 <= stated["bound_ratio"] <= 1, stated["bound_ratio"]
    assert stated["arith_bound_ratio"] <= 1

    from exactattn import api

    unstated = replace(SCHEMES[name], quantiser="any")
    case = point.case()
    inputs = {x: getattr(case, x) for x in "qkv"}
    held = unstated.hold(inputs)["inputs"]
    y = np.asarray(
        api.attention(*(held[x] for x in "qkv"), scale=case.scale, block_size=64,
                      backend=unstated.ctx()),
        dtype=np.float64,
    )  # fmt: skip
    error = np.abs(y - _softmax_attention(*(inputs[x] for x in "qkv"), case.scale))
    exact = unstated.exact(inputs)[0]
    found = bounds.bounds(
        unstated.arith(64, inputs), *(exact[x] for x in "qkv"), scale=case.scale,
        input_rounding=True,
    )  # fmt: skip
    assert bounds.ratio(error, found["y"]) < 1e-4


def test_a_block_scale_at_its_own_rounding_boundary_may_be_either_neighbour():
    """NVFP4: the tensor scale ``s_t = 2^-10`` exactly, one group's ``amax/(6·s_t)`` at the
    e4m3 midpoint 1.0625 (ties to even: 1, an fp32 kernel a hair above: 1.125). A kernel
    that picks 1.125 is within the model, which charges that group per entry (the farther
    of both neighbours' values), not whole."""
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, size=(4, 32)) * 6 * 2.0**-10
    x[0, 0] = 6 * 448 * 2.0**-10  # the tensor's amax: s_t = 2^-10
    x[1, :16] = rng.uniform(-1, 1, size=16) * 6 * 2.0**-10 * 1.0625
    x[1, 3] = 6 * 2.0**-10 * 1.0625  # this group's amax: r = 1.0625
    model = nq.hold("e2m1", "group", 16, "e4m3", x, 0.0, FP32_U)
    s_b = 1.125 * 2.0**-10
    other = model.values.copy()
    other[1, :16] = s_b * nq.round_nearest(x[1, :16] / s_b, "e2m1")
    assert not np.array_equal(other[1, :16], model.values[1, :16])
    assert _within(other, model)
    whole = np.abs(model.values[1, :16]) + 2 * np.abs(x[1, :16]).max()
    assert np.all(model.each[1, :16] < whole)


def test_reverse_key_order_quantises_in_the_kernels_order_and_reads_in_the_cases():
    """A kernel that reverses its keys, then quantises them per block of 48 rows (96 keys:
    its blocks are the case's blocks reversed only where 48 divides n_k — here 80 keys, so
    its groups differ): x̃ and its model come back in the case's key order."""
    scheme = replace(SCHEMES["fa3-fp8-block"], reverse=True)
    scheme = replace(scheme, k=replace(scheme.k, block=48), v=replace(scheme.v, block=48))
    inputs = make_inputs("normal", 80, 32, 5)
    held = scheme.hold(inputs)["inputs"]  # the kernel's order
    values, rels, each = scheme._nearest(inputs, FP32_U)
    for x in "kv":
        model = nq.Held(values[x], rels[x], each[x])
        assert _within(held[x][..., ::-1, :], model), x
        forward = nq.hold("e4m3", "block", 48, "fp32", inputs[x], 0.0, FP32_U).values
        assert not np.array_equal(values[x], forward)  # not the case-order quantisation
