"""The one list of known bugs: a failure a reported, still-open bug explains is ``known``.

A ``known`` finding is reported with the bug it matches (the run goes on), not counted as a
failure. Each entry names the bug and where it is reported; :func:`reclassify` is the one
place a failure is matched against the list.

Two kinds: exactattn's own (:data:`KNOWN_BUGS`, status ``known``), and upstream ones
(:data:`UPSTREAM`, status ``known-upstream``): a deviation of a foreign implementation that
no claim can express (a NaN is no rounding), reported as ``KNOWN-UPSTREAM`` with its replay
file and its upstream report, never as a failure. A target inherits an upstream bug only by
naming it (``Options.known``): a user's function is never excused by torch's bugs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cases import mask_kinds
from ..targets.conventions import causal_top_left_only
from .judge import Finding

KNOWN_BUGS = {
    "overflow-as-masked": (
        "scores that overflow to -inf in a narrow compute type are taken for masked keys: "
        "a misleading 'no allowed key' ValueError, or y = 0 silently with empty_rows='zero' "
        "(tests/regressions/overflow_as_masked.py, .json)"
    ),
}
UPSTREAM_STATUS = "known-upstream"


@dataclass(frozen=True)
class Upstream:
    """A foreign implementation's open bug: what it is, its replay file, where it is
    reported, and which failures it explains (``matches(case, finding)``)."""

    name: str
    summary: str
    replay: str
    report: str
    matches: Callable[[Any, Finding], bool]

    def line(self) -> str:
        return f"{self.name}: {self.summary}; replay {self.replay}; upstream report: {self.report}"


def _causal_negative_scale(case: Any, finding: Finding) -> bool:
    n_q, n_k = case.q.shape[-2], case.k.shape[-2]
    causal = causal_top_left_only(case.mask, n_q, n_k) and case.bias is None
    # the +inf of the masked scores gives NaN rows; in float16 / bfloat16 with more keys
    # than one CPU block, rows of zeros (measured, torch 2.13.0: n_k = 700, 1025)
    wrong = " nan" in finding.detail or "(got 0," in finding.detail
    return causal and (case.scale or 1.0) < 0 and wrong


def _onnx_empty_row_float64(case: Any, finding: Finding) -> bool:
    # a row with no allowed key (the mask's, or a bias of -inf on every key) in float64
    if finding.dtype != "float64" or " is nan for finite inputs" not in finding.detail:
        return False
    allowed = np.broadcast_to(case.allowed(), (*case.batch, case.sizes["n_q"], case.sizes["n_k"]))
    if case.bias is not None:
        allowed = allowed & ~np.isneginf(case.bias)
    return bool((~allowed.any(axis=-1)).any())


def _onnx_negative_scale(case: Any, finding: Finding) -> bool:
    # the specification's sqrt(scale) is NaN for any negative scale, whatever the mask
    return (case.scale or 1.0) < 0 and " nan" in finding.detail


def _raised(dtype: str, message: str) -> Callable[[Any, Finding], bool]:
    """A matcher for a target that raises ``message`` on inputs of ``dtype``."""
    return lambda case, finding: finding.dtype == dtype and message in finding.detail


SAGE_KEY_TILE = 64  # attn_qk_int8_per_block.py: BLOCK_N


def _sage_unmasked_tail(case: Any, finding: Finding) -> bool:
    # no causal mask (the causal kernel's diagonal tile masks the tail) and a partial last
    # key tile: its padded keys count in the row sum, so Y comes back too small
    n_k = case.sizes["n_k"]
    causal = mask_kinds.causal_alignment(case.mask) is not None
    return not causal and n_k % SAGE_KEY_TILE != 0 and finding.detail.startswith("y[")


JAX_FP16_JIT = "The precision 'F16_F16_F32' is not supported by dot_general on CPU"
JAX_BF16_ELEMENTAL = "Algorithm not supported by the ElementalIrEmitter: ALG_DOT_BF16_BF16_F32"

UPSTREAM = {
    u.name: u
    for u in (
        Upstream(
            "sageattention-unmasked-tail",
            "SageAttention 1.0.6's non-causal kernel does not mask the padded keys of its last "
            "64-key tile (sageattention/attn_qk_int8_per_block.py, _attn_fwd_inner: the tail "
            "tile's K is loaded as 0 past n_k, its scores get no key bound): each padded key "
            "(score 0) adds e^(0 - m) to the row sum l while its V adds 0, so for n_k not a "
            "multiple of 64 every Y is scaled down (n_k = 3: by about 3/64); the causal kernel "
            "masks it",
            "tests/regressions/sageattention_unmasked_tail.json",
            "docs/zoo/sageattention_unmasked_tail.py (reproducer; sageattention 1.0.6, found by "
            "exactattn's sageattention target under the Triton interpreter; not yet filed at "
            "github.com/thu-ml/SageAttention/issues)",
            _sage_unmasked_tail,
        ),
        Upstream(
            "sdpa-causal-negative-scale",
            "torch SDPA's CPU flash kernel returns NaN for is_causal=True with a negative "
            "scale (masked scores are filled with -inf before the scale: -inf·(-1) = +inf), "
            "or rows of zeros in float16/bfloat16 past one key block; the math backend is "
            "right",
            "tests/regressions/torch_sdpa_negative_scale_causal.json",
            "docs/check.md § Findings 1 (reproducer; torch 2.13.0, not yet filed at "
            "github.com/pytorch/pytorch/issues)",
            _causal_negative_scale,
        ),
        Upstream(
            "onnx-attention-negative-scale",
            "ONNX's Attention returns NaN for a negative scale: the specification applies "
            "sqrt(scale) to Q and K (onnx/defs/nn/old.cc, the Attention-23/24 function body's "
            "ScaleFactorSqrt = Sqrt(ScaleFactor); onnx/reference/ops/op_attention.py:207 "
            "scale = np.sqrt(scale)): onnx.reference in every dtype, ONNX Runtime in float64 "
            "(no kernel: it runs the function body; its float32/float16 kernel refuses the "
            "scale)",
            "tests/regressions/onnx_attention_negative_scale.json",
            "docs/zoo/onnx_negative_scale.py (reproducer; onnx 1.23.2, onnxruntime 1.31.1, not "
            "yet filed at github.com/onnx/onnx/issues)",
            _onnx_negative_scale,
        ),
        Upstream(
            "onnx-attention-empty-row-float64",
            "ONNX Runtime's float64 Attention returns NaN for a row with no allowed key (every "
            "key masked or biased by -inf), where its float32/float16 kernel and torch SDPA "
            "return 0: float64 has no kernel, so it runs the operator's function body "
            "(onnx/defs/nn/old.cc, Attention-23), whose Softmax of an all -inf row is 0/0",
            "tests/regressions/onnx_attention_empty_row_float64.json",
            "docs/zoo/onnx_empty_row_float64.py (reproducer; onnx 1.23.2, onnxruntime 1.31.1, "
            "found by exactattn zoo; not yet filed at github.com/microsoft/onnxruntime/issues)",
            _onnx_empty_row_float64,
        ),
        Upstream(
            "jax-cpu-fp16-jit",
            "jax.nn.dot_product_attention raises ValueError for float16 under jax.jit on the "
            "CPU: _dot_product_attention_core asks for DotAlgorithmPreset.F16_F16_F32, which "
            "dot_general's lowering refuses on the CPU (jax/_src/lax/lax.py "
            "_handle_dot_precision, l. 6124-6131 at jax-v0.10.2), and its fallback to "
            "precision=None (jax/_src/nn/functions.py l. 941-959) catches errors while "
            "tracing only: under jit the error comes at lowering (op by op it works)",
            "tests/regressions/jax_fp16_jit_precision.json",
            "docs/zoo/jax_fp16_jit_precision.py (reproducer; jax 0.10.2; no report found at "
            "github.com/jax-ml/jax/issues; keras-team/keras-hub#2354 works around it)",
            _raised("float16", JAX_FP16_JIT),
        ),
        Upstream(
            "jax-cpu-bf16-elemental-dot",
            "jitted bfloat16 jax.nn.dot_product_attention fails to compile on the CPU where a "
            "dot is degenerate (two of n_q·G, n_k and d equal to 1, G query heads a key/value "
            "head; measured): XLA:CPU emits such dots elementally, and its elemental emitter "
            "rejects the "
            "ALG_DOT_BF16_BF16_F32 algorithm the attention asks for (xla/service/"
            "algorithm_util.cc IsSupportedByElementalIrEmitter, as bundled in jaxlib 0.10.2)",
            "tests/regressions/jax_bf16_elemental_dot.json",
            "docs/zoo/jax_bf16_elemental_dot.py (reproducer; jaxlib 0.10.2; not yet filed at "
            "github.com/openxla/xla/issues)",
            _raised("bfloat16", JAX_BF16_ELEMENTAL),
        ),
    )
}


def reclassify(variant: Any, case: Any, finding: Finding) -> Finding:
    """``finding`` as ``known`` (or ``known-upstream``) when a listed bug explains it, else
    unchanged."""
    if finding.status != "fail":
        return finding
    for name in variant.target.options.known:
        bug = UPSTREAM[name]
        if bug.matches(case, finding):
            return Finding(finding.target, UPSTREAM_STATUS, name, dtype=finding.dtype)
    misleading = "no allowed key" in finding.detail or case.empty_rows == "zero"
    narrow = variant.claim.scores in ("float16", "bfloat16", "float32", "float64")
    if finding.overflow_risk and narrow and misleading:
        return Finding(finding.target, "known", f"overflow-as-masked: {finding.detail}")
    return finding
