"""The low-bit schemes (:mod:`exactattn.error.lowbit`) over the one algorithm, and the bound's
new terms (``Arith.quant_rel/quant_abs``, ``pv_acc``/``pv_chunk``), each shown necessary by
a run it must cover and a claim without it that the bound then refutes."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from exactattn import api
from exactattn.backends.formats import get_format
from exactattn.backends.lowbit_backend import LowbitContext
from exactattn.cases.inputs import make_inputs
from exactattn.error import bounds
from exactattn.error.lowbit import SCHEMES, Operand, rotation
from exactattn.precision.grid import Point
from exactattn.precision.lowbit_report import predicted_underflow
from exactattn.precision.tasks import reference_task, run_task
from tests.optional import requires


def _softmax_attention(q, k, v, c):
    """Attention from its definition, in float64 (softmax of c·q·kᵀ times V)."""
    s = c * (q @ k.T)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)) @ v


def _run(ctx, inputs, block, c):
    q, k, v = (inputs[x] for x in "qkv")
    return np.asarray(api.attention(q, k, v, scale=c, block_size=block, backend=ctx), float)


@pytest.mark.parametrize("dist", ["normal", "sink-8", "fa3-outliers"])
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_every_scheme_within_its_bound(name, dist):
    """n = 96 keys in blocks of 32 (three blocks, running max and merges exercised)."""
    requires("flint")  # the sweep's reference task: arb where the float64 one cannot serve
    point = Point(name, 96, 32, 32, dist, 1.0, "none", 0, False)
    rows = {r["impl"]: r for r in run_task(point, reference_task(point.problem, None))}
    for impl, row in rows.items():
        assert row["status"] == "ok", (impl, row["status"])
        assert row["bound_ratio"] <= 1, (impl, row["bound_ratio"])
        assert 0 < row["y_cossim"] <= 1 + 1e-12  # INT4 with outliers: 0.87


@pytest.mark.parametrize("name", ["fa3-fp8-block-hadamard", "sage1", "pcast-rev"])
def test_the_transformations_keep_exact_attention(name):
    """Rotation, K smoothing and reverse key order leave the exact answer unchanged."""
    inputs = make_inputs("fa3-outliers", 48, 32, 1)
    exact = SCHEMES[name].exact(inputs)[0]
    c = 1 / math.sqrt(32)
    want = _softmax_attention(inputs["q"], inputs["k"], inputs["v"], c)
    got = _softmax_attention(exact["q"], exact["k"], exact["v"], c)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    m = rotation(32)
    np.testing.assert_allclose(m @ m.T, np.eye(32), atol=1e-15)


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_held_inputs_within_the_error_model(name):
    inputs = make_inputs("fa3-outliers", 64, 32, 2)
    held = SCHEMES[name].hold(inputs)
    for x in "qkv":
        err = np.abs(held["inputs"][x] - held["exact"][x])
        assert np.all(err <= held["rel"] * np.abs(held["exact"][x]) + held["abs"]), x


def test_sink_inputs_score_a_against_every_row():
    inputs = make_inputs("sink-8", 40, 16, 0)
    scores = (inputs["q"] @ inputs["k"][0]) / math.sqrt(16)
    np.testing.assert_allclose(scores, 8.0, rtol=1e-15)


def test_running_max_changes_what_the_cast_sees():
    """The same summary either way without a cast; with the e4m3 cast behind a sink in the
    first block, p against the running max underflows, p against each block's max does not
    (beyond the first block), and reverse order meets the sink last."""
    inputs = make_inputs("sink-10", 128, 32, 0)
    c = 1 / math.sqrt(32)
    plain = [_run(LowbitContext(running_max=r), inputs, 32, c) for r in (True, False)]
    np.testing.assert_allclose(plain[0], plain[1], rtol=1e-5, atol=1e-6)
    counts = {}
    for running in (True, False):
        ctx = LowbitContext("e4m3", running_max=running)
        _run(ctx, inputs, 32, c)
        counts[running] = ctx.measures()["p_underflow"]
    assert counts[True] > 0.5 > 0.3 > counts[False]
    exact, _, _ = SCHEMES["pcast-rev"].exact(inputs)
    ctx = LowbitContext("e4m3")
    _run(ctx, exact, 32, c)
    assert ctx.measures()["p_underflow"] < counts[True] / 2


def test_closed_form_underflow_matches_a_run():
    inputs = make_inputs("sink-8", 512, 64, 3)
    ctx = LowbitContext("e4m3")
    _run(ctx, inputs, 64, 1 / 8)
    measured = ctx.measures()["p_underflow"]
    assert measured == pytest.approx(predicted_underflow("sink-8", 512, 64, 3, 1.0, 1.0), abs=0.03)


def _ratio(ctx, arith, inputs, block, c):
    y = _run(ctx, inputs, block, c)
    ref = _softmax_attention(*(inputs[x] for x in "qkv"), c)
    found = bounds.bounds(arith, *(inputs[x] for x in "qkv"), scale=c, input_rounding=True)
    return bounds.ratio(y - ref, found["y"])


def test_the_accumulator_term_is_needed():
    """fp16 accumulation of p·V on fp32 inputs: within the bound that charges it
    (``pv_acc = fp16``), outside the fp32 claim."""
    inputs = make_inputs("normal", 256, 32, 4)
    c = 1 / math.sqrt(32)
    fp32 = get_format("float32")
    honest = bounds.Arith(fp32, fp32, fp32, fp32, block=128, pv_acc=get_format("float16"))
    ctx = LowbitContext(pv_acc="fp16")
    assert _ratio(ctx, honest, inputs, 128, c) <= 1
    assert _ratio(ctx, replace(honest, pv_acc=None), inputs, 128, c) > 1
    chunked = replace(honest, pv_chunk=16)
    assert _ratio(LowbitContext(pv_acc="fp16", pv_chunk=16), chunked, inputs, 128, c) <= 1


def test_the_quantisation_term_is_needed():
    """SageAttention's INT8 per-block Q, K with K smoothing (P, V left in fp32, so the
    quantisation dominates), by any quantiser within INT8's error (the quantiser unstated):
    within the bound with its charges, outside it without."""
    scheme = replace(SCHEMES["sage1"], v=Operand(), p_cast=None, pv_acc="fp32", quantiser="any")
    inputs = make_inputs("normal", 128, 32, 5)
    exact = scheme.exact(inputs)[0]
    held = scheme.hold(inputs)["inputs"]
    c = 1 / math.sqrt(32)
    arith = scheme.arith(32, inputs)
    y = _run(scheme.ctx(), held, 32, c)
    ref = _softmax_attention(*(exact[x] for x in "qkv"), c)
    bare = replace(arith, quant_abs=0.0, quant_rel=0.0, quant_each=None)
    for claim, holds in ((arith, True), (bare, False)):
        found = bounds.bounds(claim, *(exact[x] for x in "qkv"), scale=c, input_rounding=True)
        assert (bounds.ratio(y - ref, found["y"]) <= 1) is holds


def test_pv_budget_from_its_definition():
    fp32, fp16 = get_format("float32"), get_format("float16")
    un = bounds.Units.of(bounds.Arith(fp32, fp32, fp32, fp32, pv_acc=fp16, pv_chunk=32), False)
    b = np.array([1, 32, 33, 128])
    u16, u32 = 2.0**-11 / (1 - 2.0**-11), 2.0**-24 / (1 - 2.0**-24)
    want = [1 * u16 + u32, 32 * u16 + u32, 32 * u16 + 2 * u32, 32 * u16 + 4 * u32]
    np.testing.assert_allclose(un.pv_terms(b), want, rtol=1e-15)
    with pytest.raises(ValueError, match="pv_chunk"):
        bounds.Arith(fp32, fp32, fp32, fp32, pv_chunk=0)
    with pytest.raises(ValueError, match="quant_rel"):
        bounds.Arith(fp32, fp32, fp32, fp32, quant_rel=1.5)


def test_bad_context_arguments():
    with pytest.raises(ValueError, match="p_cast"):
        LowbitContext("e3m4")
    with pytest.raises(ValueError, match="pv_acc"):
        LowbitContext(pv_acc="fp8")
    with pytest.raises(ValueError, match="p_scale"):
        LowbitContext("e4m3", p_scale=0.0)


def test_lowbit_tiny_sweep_reports_the_claims(tmp_path):
    """The preset's pipeline end to end at n = 64: rows, bound columns, the claims table."""
    requires("pandas")

    from exactattn.commands.sweep import main

    assert (
        main(["--preset", "lowbit-tiny", "--out", str(tmp_path), "--workers", "1", "--no-progress"])
        == 0
    )
    report = (tmp_path / "report.md").read_text()
    rows = (tmp_path / "results.csv").read_text().count("\n") - 1
    assert rows == 2 * 14 * 3
    assert "## Low-bit attention: the claims" in report
    for claim in ("FA3 §4.3", "closed-form fraction", "reverse key order", "two-level"):
        assert claim in report, claim
    assert "held in every low-bit run" in report


def test_naive_cast_of_normalised_p_needs_the_ell_factor():
    """Naive attention casts ``P = softmax(S)`` (weights ~1/n) to e4m3: its underflow is
    ``μ_p`` per normalised weight, ``ℓ·μ_p`` in the bound's units of ``e^{s−m}``. Without
    ``p_normalized`` the bound fails at n = 2048 (ratio 1.31 measured); with it, it holds."""
    n, d = 2048, 32
    inputs = make_inputs("normal", n, d, 0)
    q, k, v = (inputs[x] for x in "qkv")
    c = 1 / math.sqrt(d)
    y = np.asarray(api.naive_attention(q, k, v, scale=c, backend=LowbitContext("e4m3")), float)
    ref = _softmax_attention(q, k, v, c)
    arith = SCHEMES["pcast-fwd"].arith(n, inputs)
    ratios = {}
    for normalized in (False, True):
        claim = replace(arith, p_normalized=normalized)
        found = bounds.bounds(claim, q, k, v, scale=c, delta="rowsum", input_rounding=True)
        ratios[normalized] = bounds.ratio(y - ref, found["y"])
    assert ratios[True] <= 1 < ratios[False]
