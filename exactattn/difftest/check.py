"""Judge one case on every target: each output within the derived bound of the reference.

For a target ``t`` the inputs are first rounded to what ``t`` stores (``t.hold``); the
reference is computed once per distinct rounding. An output passes when it has the right
shape, is finite and ``|out − ref| ≤ bound + rad_ref`` entrywise (the bounds of
:mod:`exactattn.difftest.tolerance`; for float comparisons plus ``2^-53·|ref|`` for rounding
the reference to float64). Ball targets pass when ``|mid − ref| ≤ rad + rad_ref + 2^-150|ref|``:
the ball must enclose the exact value. A ``FloatingPointError`` (the API's overflow report)
is accepted only when the case's magnitudes reach the configuration's range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mpmath
import numpy as np

from . import reference
from .cases import Case
from .reference import REF_PREC, Values
from .targets import Target
from .tolerance import bounds

OUTPUTS = ("y", "dq", "dk", "dv")


@dataclass
class Finding:
    """One target's verdict on one case."""

    target: str
    status: str  # "ok", "refused" (expected overflow error), "known" (a listed bug), "fail"
    detail: str = ""
    worst: float = 0.0  # max over entries of |error| / allowed


def _mpf(e: Any) -> mpmath.mpf:
    if isinstance(e, mpmath.mpf):
        return e
    if isinstance(e, np.longdouble):
        num, den = e.as_integer_ratio()
        return mpmath.mpf(num) / den
    return mpmath.mpf(float(e))


_MPF = np.frompyfunc(_mpf, 1, 1)


def _errors(target: Target, out: Any, ref: Values, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(|out − ref| as float64, extra allowance: radii and reference rounding)."""
    mid, rad = ref.mid[name], ref.rad[name]
    radius = 0.0
    if isinstance(out, tuple):
        out, radius = out
    if target.fine or target.enclosure:
        with mpmath.workprec(REF_PREC + 20):
            diff = np.frompyfunc(lambda a, b: float(abs(a - b)), 2, 1)(_MPF(out), mid)
        diff = np.asarray(diff, dtype=np.float64)
        extra = rad + radius + 2.0**-150 * np.abs(getattr(ref, name))
    else:
        out = np.asarray(out, dtype=np.float64)
        diff = np.abs(out - getattr(ref, name))
        # rounding both values to float64 for the comparison: 2^-53 relative, 2^-1075 absolute
        extra = rad + 2.0**-53 * np.abs(getattr(ref, name)) + 2.0**-1074
    return diff, extra


def _finite(out: Any) -> bool:
    if isinstance(out, tuple):
        out = out[0]
    arr = np.asarray(out)
    if arr.dtype == object:
        return all(mpmath.isfinite(e) for e in arr.flat)
    return bool(np.all(np.isfinite(arr.astype(np.float64))))


KNOWN_BUGS = {
    "overflow-as-masked": (
        "scores that overflow to -inf in a narrow compute type are taken for masked keys: "
        "a misleading 'no allowed key' ValueError, or y = 0 silently with empty_rows='zero' "
        "(tests/regressions/overflow_as_masked.py, .json)"
    ),
}


def _known(target: Target, case: Case, finding: Finding, overflow_risk: bool) -> Finding:
    """Reclassify a failure explained by a listed, reported bug (the run goes on)."""
    misleading = "no allowed key" in finding.detail or case.empty_rows == "zero"
    if finding.status == "fail" and overflow_risk and target.arith.fmax < math.inf and misleading:
        return Finding(finding.target, "known", f"overflow-as-masked: {finding.detail}")
    return finding


def judge(target: Target, case: Case, inputs: dict[str, np.ndarray], ref: Values) -> Finding:
    b = bounds(_with_block(case, target.bound_block), inputs["q"], inputs["k"], ref, target.arith)
    return _known(target, case, _judge(target, case, inputs, ref, b), b.overflow_risk)


def _judge(target: Target, case: Case, inputs: dict, ref: Values, b: Any) -> Finding:
    try:
        outputs = target.run(case, inputs)
    except FloatingPointError as error:
        if b.overflow_risk:
            return Finding(target.name, "refused", str(error))
        return Finding(target.name, "fail", f"FloatingPointError within range: {error}")
    except Exception as error:
        return Finding(target.name, "fail", f"{type(error).__name__}: {error}")
    worst = 0.0
    for name in OUTPUTS:
        out = outputs[name]
        shape = np.shape(out[0] if isinstance(out, tuple) else out)
        expected = np.shape(getattr(ref, name))
        if shape != expected:
            return Finding(target.name, "fail", f"{name} has shape {shape}; expected {expected}")
        if not _finite(out):
            return Finding(target.name, "fail", f"{name} is not finite")
        diff, extra = _errors(target, out, ref, name)
        allowed = (0.0 if target.enclosure else getattr(b, name)) + extra
        over = diff > allowed
        ratio = float(np.max(diff / np.where(allowed > 0, allowed, math.inf), initial=0.0))
        worst = max(worst, ratio if math.isfinite(ratio) else 0.0)
        if np.any(over):
            at = tuple(int(i) for i in np.argwhere(over)[0])
            return Finding(
                target.name,
                "fail",
                f"{name}{list(at)}: |error| {diff[at]:.3e} > allowed {allowed[at]:.3e} "
                f"(reference {getattr(ref, name)[at]:.6e})",
                worst=float("inf") if allowed[at] == 0 else float(diff[at] / allowed[at]),
            )
    return Finding(target.name, "ok", worst=worst)


def _with_block(case: Case, block: int | None) -> Case:
    if block is None:
        return case
    import dataclasses

    return dataclasses.replace(case, block_size=block)


def check_case(case: Case, targets: list[Target]) -> list[Finding]:
    """Every wanted target's verdict on ``case`` (references cached per input rounding)."""
    cache: dict[bytes, Values] = {}
    findings = []
    for target in targets:
        if not target.wants(case):
            continue
        held = {n: target.hold(getattr(case, n)) for n in "qkvg"}
        key = b"".join(held[n].tobytes() for n in "qkvg")
        if key not in cache:
            cache[key] = reference.compute(case, held["q"], held["k"], held["v"], held["g"])
        findings.append(judge(target, case, held, cache[key]))
    return findings
