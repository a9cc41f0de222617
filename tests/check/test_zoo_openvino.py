"""OpenVINO's CPU ScaledDotProductAttention (:mod:`exactattn.targets.openvino_sdpa`): each hint
passes a short check under its measured claim, the probe agrees with a model run directly, a
broken wrapper and a claim finer than the kernel are caught, and each repro of
docs/zoo/openvino_*.py runs."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from exactattn import targets
from exactattn.error import bounds
from exactattn.targets import Claim
from exactattn.testing import assert_attention_close, session
from tests.optional import requires

ov, _ = requires("openvino", "torch")

from exactattn.targets import openvino_sdpa

ROOT = Path(__file__).resolve().parents[2]
REPROS = sorted((ROOT / "docs" / "zoo").glob("openvino_*.py"))
SHORT = session.Settings(
    examples=12, max_n=12, max_d=8, budget=1 << 10, determinism=False, baselines=False,
    probes=False,
)  # fmt: skip
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _computes_in(hint: str) -> str:
    """The format ``hint`` computes in here; the test is skipped where the plugin cannot
    compile it (a plugin whose CPU detection and oneDNN disagree, ONEDNN_MAX_CPU_ISA)."""
    why = openvino_sdpa.compile_error(hint)
    if why:
        pytest.skip(why)
    return openvino_sdpa.internal_format(hint)


def _needs_bf16_arithmetic() -> None:
    """Skips where the bf16 hint does not compute in bf16 (a CPU without native bf16 keeps
    f32): the findings below are bf16's."""
    found = _computes_in("bf16")
    if found != "bfloat16":
        pytest.skip(f"the bf16 hint computes in {found} on this CPU (no native bf16)")


def _failures(target: targets.Target, settings: session.Settings = SHORT) -> list[str]:
    result = session.run([target], settings)
    assert result.variants and not result.unavailable, result.unavailable
    judged = sum(c["ok"] + c["fail"] for c in result.report.counts.values())
    assert judged >= settings.examples // 2, result.report.counts
    return [text for _, text in result.report.failures]


@pytest.mark.parametrize("name", list(openvino_sdpa.HINTS))
def test_each_hint_passes_a_short_check(name):
    _computes_in(openvino_sdpa.HINTS[name])
    assert _failures(targets.get(name)) == []


@pytest.mark.parametrize("hint", ["f32", "f16", "bf16"])
def test_the_probe_agrees_with_a_model_run_directly(hint):
    """The probe's values and format against a model built here and the compiled model's own
    report of the precision it infers in."""
    _computes_in(hint)
    one = np.ones((1, 1, 1, 1), np.float32)
    v = np.array(openvino_sdpa.PROBE, np.float32).reshape(1, 1, 1, -1)
    p = [ov.opset13.parameter(x.shape, ov.Type.f32) for x in (one, one, v)]
    model = ov.Model([ov.opset13.scaled_dot_product_attention(*p)], p)
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint})
    assert openvino_sdpa.probe(hint) == tuple(float(x) for x in compiled([one, one, v])[0].ravel())
    infers = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()  # f32, bf16, f16
    assert openvino_sdpa.FORMATS[infers] == openvino_sdpa.internal_format(hint)
    claim = targets.claim_for(targets.get(f"openvino-{hint}"), "float32")
    assert claim == openvino_sdpa.measured_claim(hint).resolve("float32")
    assert (claim.input, claim.block) == ("float32", 0)


def test_a_wrapper_that_drops_the_scale_is_caught():
    """The same check passes the wrapper that passes the scale on."""

    def wrapper(drop):
        def attention(query, key, value, attn_mask=None, is_causal=False, scale=None):
            scale = None if drop else scale
            return openvino_sdpa.attention(
                query, key, value, attn_mask, is_causal, scale, hint="f32"
            )

        return attention

    def check(fn):
        claim = openvino_sdpa.measured_claim("f32")
        return assert_attention_close(
            fn, claim=claim, examples=30, dtypes=("float32",), grads=False, dropout_probe=False
        )

    check(wrapper(drop=False))
    with pytest.raises(AssertionError, match="allowed"):
        check(wrapper(drop=True))


def test_the_bf16_target_claiming_fp32_is_caught():
    _needs_bf16_arithmetic()
    target = targets.get("openvino-bf16")
    options = dataclasses.replace(target.options, claim_probe=None, isolated=False)
    finer = dataclasses.replace(target, claim=Claim(input="float32", block=0), options=options)
    assert _failures(finer)


def test_flushed_products_of_normalised_weights_are_within_the_bound():
    """40 equal keys and v = 2^-121 (a normal bf16 number): each p·v = 2^-121/40 is below
    2^-126 and bf16 flushes it, so Y = 0 for an exact 3.8e-37. Naive attention forms P before
    P·V, so a flushed product costs ℓ·μ in the bound's units (Arith.p_normalized); without that
    factor the bound fails."""
    _needs_bf16_arithmetic()
    if not openvino_sdpa.flushes("bf16"):
        pytest.skip("bf16 keeps subnormals on this CPU (no AVX512-BF16 flushing)")
    q, k = np.zeros((1, 1, 64, 8)), np.zeros((1, 1, 40, 8))  # a fused MHA (measured)
    v = np.full((1, 1, 40, 8), 2.0**-121)
    y = openvino_sdpa.run(q, k, v, "bf16").astype(np.float64)
    assert (y == 0).all()
    claim = openvino_sdpa.measured_claim("bf16").resolve("float32")
    arith = claim.arith(claim.bound_block(40))
    assert arith.p_normalized
    ratio = {}
    for normalized in (True, False):
        found = bounds.bounds(
            dataclasses.replace(arith, p_normalized=normalized), q, k, v, scale=1 / math.sqrt(8)
        )
        ratio[normalized] = bounds.ratio(y - v[..., :1, :], found["y"])
    assert ratio[True] <= 1 < ratio[False], ratio


@pytest.mark.parametrize("path", REPROS, ids=[p.name for p in REPROS])
def test_each_repro_runs(path):
    """Each runs and prints; those that compile a model need the plugin to compile the
    hints they name (the empty-row one compiles under f32)."""
    text = path.read_text()
    assert len(text.splitlines()) <= 20
    for hint in ("f16", "bf16"):
        if f'"{hint}"' in text:
            _computes_in(hint)
    out = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip(), out.stderr
