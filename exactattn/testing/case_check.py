"""One case through every variant: skip with a reason, or run, judge, and compare side by side.

For each :class:`~exactattn.targets.Variant` of the case's dtype: a case it does not take is
a ``skip`` finding with the reason; otherwise the inputs (and a bias) are held in its
format, the reference is computed once per distinct rounding
(:func:`exactattn.cases.exact.certified`; with ``fast_reference`` the float64 one,
:func:`~exactattn.cases.exact.fast`, wherever its radius is below 2^-20 of the variant's
tolerance, arb where not, the finding naming which served), the variant runs (an exception,
a wrong shape or dtype is a failed case with its message, never a crash of the harness; but
a target that says it does not support the input — ``NotImplementedError``, or its library's
documented refusal, :meth:`~exactattn.targets.Target.refuses` — skips the case with that
reason), and :func:`.judge.judge` gives the verdict. Gradients a variant cannot give on this
device are left out and the reason recorded. Optionally it runs a second time on the same
inputs (bitwise determinism, reported, not judged), and the same case runs under two
baselines on the same held inputs: naive attention in the same dtype, and FlashAttention-2's
precision policy (fp32 statistics and accumulators, ``P`` cast to the input dtype, key
blocks of :data:`FA2_BLOCK`), for the side-by-side error ratios.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cases import Case
from ..cases.exact import Reference, certified, fast, serves
from ..error.metrics import relative_error
from ..targets import Variant, builtin
from ..targets.conventions import DETACHED, TargetError
from . import suspicion
from .judge import Finding, certain, judge
from .tolerance import Allowed, bounds

UNSUPPORTED = "the target does not support this input"  # a skip's reason, then the target's
FA2_BLOCK = 64  # FlashAttention-2's key-block size for head dims <= 128 (kBlockN)
GRADS = ("dq", "dk", "dv")


@dataclass(frozen=True)
class Options:
    grads: bool = True
    determinism: bool = False
    baselines: bool = False
    sampled: bool = True  # False: slow variants run every case (replays)
    fast_reference: bool = False  # the float64 reference where it serves (check's cases)


def wants(variant: Variant, case: Case, sampled: bool = True) -> bool:
    """Whether a sampled variant (``rate > 1``: slow interpreters) takes this case."""
    rate = variant.target.rate if variant.device == "cpu" and sampled else 1
    if rate == 1:
        return True
    key = (case.q.tobytes(), case.k.shape, case.block_size, repr(case.mask)[:200])
    return zlib.crc32(repr(key).encode()) % rate == 0


def check_case(case: Case, variants: list[Variant], options: Options = Options()) -> list[Finding]:
    """Every variant's finding on ``case`` (see the module docstring)."""
    references: dict[bytes, Reference] = {}
    baselines: dict[tuple[str, bool, bytes], dict[str, dict[str, float]]] = {}
    findings = []
    for variant in variants:
        if case.dtype is not None and case.dtype != variant.dtype:
            continue
        why = variant.unsupported(case)
        if why is None and not wants(variant, case, options.sampled):
            why = f"sampled: one case in {variant.target.rate} (slow interpreter)"
        if why is not None:
            findings.append(Finding(variant.name, "skip", why, dtype=variant.dtype))
            continue
        grads_skipped = variant.grads_unsupported() if options.grads else ""
        grads = options.grads and not grads_skipped
        held = variant.held(case)
        at = variant.reference_inputs(held)  # held, or a stated quantiser's quantised inputs
        key = b"".join(x.tobytes() for x in (*held.values(), *at.values()))
        if key not in references:
            served = fast(case, at) if options.fast_reference else None
            references[key] = answering(served or certified(case, at), held)
        ref, allowed = references[key], None
        if ref.served == "float64":  # it serves only below 2^-20 of this variant's tolerance
            allowed = bounds(variant, ref)
            if not serves(ref, allowed.bound):
                ref = references[key] = answering(certified(case, at), held)
        if ref.unbounded and not variant.target.options.enclosure:
            findings.append(Finding(variant.name, "skip", ref.unbounded, dtype=variant.dtype))
            continue
        finding, outputs = run_and_judge(variant, case, held, ref, grads, allowed)
        finding.reference, finding.quantised = ref.served, at is not held
        finding.grads_skipped = grads_skipped or finding.grads_skipped  # or a derived output's
        if finding.status == "ok" and options.determinism:
            finding.deterministic = _deterministic(variant, case, held, grads, outputs)
        if finding.status == "ok" and options.baselines:
            memo = (variant.dtype, grads, key)
            if memo not in baselines:  # on the inputs the reference answers (the same exact Y)
                baselines[memo] = baseline_errors(case, variant.dtype, at, ref, grads)
            finding.baseline = baselines[memo]
        findings.append(finding)
    return findings


def answering(ref: Reference, held: dict[str, np.ndarray]) -> Reference:
    """``ref`` as the reference of a variant that received ``held`` (its tolerance is derived
    from what the variant received, :func:`.tolerance.bounds`), where ``ref`` was taken at the
    quantised inputs a stated quantiser asks for (:meth:`Variant.reference_inputs`)."""
    return ref if ref.held is held else dataclasses.replace(ref, held=held)


def run_and_judge(
    variant: Variant,
    case: Case,
    held: dict[str, np.ndarray],
    ref: Reference,
    grads: bool,
    allowed: Allowed | None = None,
) -> tuple[Finding, dict]:
    """Run ``variant`` on the held inputs and judge it within ``allowed`` (default: its
    tolerance on ``ref``); errors become failed findings."""
    allowed = allowed if allowed is not None and ref.served == "float64" else bounds(variant, ref)
    failed = None
    try:
        outputs = variant.run(case, held, grads)
    except FloatingPointError as error:
        status = "refused" if allowed.overflow_risk else "fail"
        prefix = "" if allowed.overflow_risk else "FloatingPointError within range: "
        failed = Finding(variant.name, status, f"{prefix}{error}", dtype=variant.dtype)
    except TargetError as error:
        if grads and str(error) == DETACHED:
            return _judged_as_constant(variant, case, held, ref, allowed)
        failed = Finding(variant.name, "fail", str(error), dtype=variant.dtype)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as error:
        refused = variant.target.refuses(error)
        if refused is not None:  # unsupported is not wrong: skipped, with the library's reason
            why = f"{UNSUPPORTED}: {type(error).__name__}: {refused}"
            return Finding(variant.name, "skip", why, dtype=variant.dtype), {}
        text = (str(error).strip().splitlines() or [""])[0][:300]
        detail = f"raised {type(error).__name__}: {text}"
        failed = Finding(variant.name, "fail", detail, dtype=variant.dtype)
    if failed is not None:
        failed.overflow_risk = bool(allowed.overflow_risk)
        failed.block_size = variant.bound_block(case)
        failed.own_block = variant.target.options.exact_block
        return failed, {}
    finding = judge(variant, case, outputs, ref, allowed)
    suspicion.mark(variant, outputs, ref, finding)
    return finding, outputs


def _judged_as_constant(
    variant: Variant, case: Case, held: dict[str, np.ndarray], ref: Reference, allowed: Allowed
) -> tuple[Finding, dict]:
    """A detached output has zero gradients as autograd sees it (a constant of ``q, k, v``):
    its forward judged again without gradients and ``dQ = dK = dV = 0`` judged beside it, which
    passes exactly where the exact gradients are 0 (every row with no allowed key, say) and
    fails, saying the output is detached, where they are not."""
    finding, outputs = run_and_judge(variant, case, held, ref, False, allowed)
    if finding.status != "ok":
        return finding, outputs
    outputs = {**outputs, **{name: np.zeros(ref.near[name].shape) for name in GRADS}}
    finding = judge(variant, case, outputs, ref, allowed)
    if finding.status == "fail":
        finding.detail = f"{DETACHED} (its gradients read as 0): {finding.detail}"
    suspicion.mark(variant, outputs, ref, finding)
    return finding, outputs


def _deterministic(variant: Variant, case: Case, held: dict, grads: bool, first: dict) -> bool:
    """Whether a second run on the same inputs gives the same bits (reported, not judged)."""
    try:
        second = variant.run(case, held, grads)
    except Exception:
        return False
    for name, value in first.items():
        if name.startswith("_"):
            continue
        other = second.get(name)
        a, b = (value[0], other[0]) if isinstance(value, tuple) else (value, other)
        if not np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True):
            return False
    return True


def baseline_names(dtype: str) -> tuple[str, str] | None:
    """(naive in the same dtype, FA-2 policy) registry entries for ``dtype``: torch's when
    torch is already loaded (or for bfloat16), else NumPy's."""
    short = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}
    if dtype not in short:
        return None
    use_torch = "torch" in sys.modules or dtype == "bfloat16"
    if use_torch and importlib.util.find_spec("torch") is None:
        return None
    family = "torch" if use_torch else "np"
    naive = f"{family}-{short[dtype]}"
    fa2 = f"{family}-fa2-{short[dtype]}" if dtype in ("float16", "bfloat16") else naive
    return naive, fa2


def baseline_errors(
    case: Case, dtype: str, held: dict[str, np.ndarray], ref: Reference, grads: bool
) -> dict[str, dict[str, float]]:
    """Normwise errors of the two baselines on the same held inputs (those the reference
    answers: a stated quantiser's quantised inputs; empty when the dtype has none, e.g.
    bfloat16 without torch)."""
    names = baseline_names(dtype)
    if names is None:
        return {}
    out = {}
    for label, name, path, block in (
        ("naive", names[0], "naive", case.block_size),
        ("fa2", names[1], "tiled", FA2_BLOCK),
    ):
        target = builtin.config_target(name)
        target = dataclasses.replace(target, options=dataclasses.replace(target.options, path=path))
        variant = Variant(target, dtype)
        try:
            outputs = variant.run(dataclasses.replace(case, block_size=block), held, grads)
        except Exception:
            continue
        errors = {"y": _error(outputs, ref, "y", dtype)}
        if grads:
            errors["grads"] = _max(_error(outputs, ref, g, dtype) for g in GRADS)
        out[label] = errors
    return out


def _error(outputs: dict[str, Any], ref: Reference, name: str, dtype: str) -> float:
    """A baseline's normwise error in ``name``, as :func:`.judge.judge` measures it."""
    told = certain(ref.near[name], ref.rad[name])
    return relative_error(np.abs(outputs[name] - ref.near[name]), told, dtype)


def _max(values: Any) -> float:
    """The largest of ``values`` that is not NaN (NaN when none is)."""
    kept = [v for v in values if not math.isnan(v)]
    return max(kept) if kept else math.nan


def target_errors(finding: Finding) -> dict[str, float]:
    """The finding's errors in the baselines' terms: ``y`` and ``grads`` (the worst of dQ,
    dK, dV)."""
    out = {"y": finding.errors.get("y", math.nan)}
    if any(g in finding.errors for g in GRADS):
        out["grads"] = _max(finding.errors.get(g, math.nan) for g in GRADS)
    return out
