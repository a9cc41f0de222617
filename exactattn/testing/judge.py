"""Judge one variant's outputs on one case against the reference, within the derived bound.

An output passes when it has the expected shape (and dtype: the input's), is finite where
the exact value is (``lse`` is ``−∞`` exactly on rows with no allowed key), and
``|out − ref| ≤ bound + rad_ref`` entrywise — the bound of the variant's claimed
arithmetic (:func:`exactattn.testing.tolerance.bounds`); float outputs are measured against
the reference's double-double midpoint, finer-than-float64 ones in mpmath. Ball outputs
(flint) pass when ``|mid − ref| ≤ rad + rad_ref``: the ball must enclose the exact value.
Outputs beyond the reference's (``_derived``: a sink's ``dσ``) come with a function of the
certified reference that gives their exact value and allowed error (their convention's
derivation from the reference's values and radii, never from the code judged), and pass
when ``|out − exact| ≤ allowed`` (NaN fails); where it says none can be derived, the
output is left unjudged and the reason recorded as a gradient skip. A non-finite
output is *refused* (acceptable) only when the case's magnitudes reach the claimed
formats' range.

Beside the verdict a :class:`Finding` carries the errors the report summarises: per
output the normwise relative error ``max|out − ref| / max|ref|`` and the same in ulps of
the dtype at ``max|ref|`` (over the values the reference tells from zero, :func:`certain`:
NaN for an output whose exact value may be zero), whether the bound
was vacuous (:func:`certain`: little beyond finiteness was checked), and where the
worst violation sits (the counterexample's coordinates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import mpmath
import numpy as np

from ..cases.exact import OUTPUTS, Reference
from ..error.metrics import relative_error, scale_of, ulps
from .tolerance import Allowed

COMPARE_PREC = 220


@dataclass
class Finding:
    """One variant's verdict on one case.

    ``status``: ``ok``, ``refused`` (an overflow the case's magnitudes explain), ``known``
    (a listed bug), ``fail``, or ``skip`` (the variant does not take the case; ``detail``
    says why).
    """

    target: str
    status: str
    detail: str = ""
    worst: float = 0.0  # max over entries of |error| / allowed
    dtype: str = ""
    errors: dict[str, float] = field(default_factory=dict)
    ulps: dict[str, float] = field(default_factory=dict)
    vacuous: bool = False
    grads_skipped: str = ""
    deterministic: bool | None = None
    baseline: dict[str, dict[str, float]] = field(default_factory=dict)
    where: dict[str, Any] = field(default_factory=dict)
    overflow_risk: bool = False  # the case's magnitudes reach the claimed formats' range
    block_size: int | None = None  # the key-block size the bound assumed
    own_block: bool = False  # the target tiles with the case's block size (exactattn's own)
    reference: str = ""  # which certified reference served: "arb" or "float64"
    quantised: bool = False  # judged at the quantised inputs its claim's stated quantiser defines
    expected: float = math.nan  # Y's largest |error| / expected error (.suspicion)
    suspicious: str = ""  # why an ok finding is SUSPICIOUS (never a failure)
    covered: tuple[str, ...] = ()  # what the case covered of the interfaces (.coverage)


def _mpf(e: Any) -> mpmath.mpf:
    if isinstance(e, mpmath.mpf):
        return e
    if isinstance(e, np.longdouble) and np.isfinite(e):
        num, den = e.as_integer_ratio()
        return mpmath.mpf(num) / den
    return mpmath.mpf(float(e))


_MPF = np.frompyfunc(_mpf, 1, 1)


def difference(out: Any, ref: Reference, name: str) -> tuple[np.ndarray, bool]:
    """``|out − ref|`` as float64 and whether the comparison was in mpmath (fine): float
    outputs against the double-double midpoint (:meth:`exactattn.oracle.certified.Ball.error`),
    finer ones (mpf, longdouble) in mpmath against the exact midpoints (made only then: an
    mpmath number per entry costs more than the whole case at n = 512)."""
    arr = np.asarray(out)
    ball = ref.balls[name]
    if arr.dtype == object or arr.dtype == np.longdouble:
        with mpmath.workprec(COMPARE_PREC):
            diff = np.frompyfunc(_distance, 2, 1)(_MPF(arr), ref.mid[name])
        return np.asarray(diff, dtype=np.float64), True
    return ball.error(arr.astype(np.float64)), False


def _distance(a: mpmath.mpf, b: mpmath.mpf) -> float:
    if mpmath.isinf(a) or mpmath.isinf(b):
        return 0.0 if a == b else math.inf
    return float(abs(a - b))


def _finite_where_expected(name: str, out: Any, near: np.ndarray) -> np.ndarray:
    """Entries that are non-finite although the exact value is finite."""
    arr = np.asarray(out)
    if arr.dtype == object:
        bad = np.frompyfunc(lambda e: not mpmath.isfinite(e), 1, 1)(arr).astype(bool)
    else:
        bad = ~np.isfinite(arr.astype(np.float64))
    return bad & np.isfinite(near)


def judge(
    variant: Any, case: Any, outputs: dict[str, Any], ref: Reference, allowed: Allowed
) -> Finding:
    """The verdict and error summary of ``outputs`` (see the module docstring)."""
    finding = Finding(
        variant.name, "ok", dtype=variant.dtype, overflow_risk=bool(allowed.overflow_risk)
    )
    finding.block_size = variant.bound_block(case)
    finding.own_block = variant.target.options.exact_block
    produced = outputs.get("_dtype")
    foreign = variant.target.convention != "api"
    if foreign and produced and produced != variant.dtype:
        return _fail(finding, f"y has dtype {produced}; expected {variant.dtype} (the input's)")
    enclosure = variant.target.options.enclosure
    for name in OUTPUTS:
        if name not in outputs:
            continue
        out, radius = outputs[name], 0.0
        if isinstance(out, tuple):
            out, radius = out
        near = ref.near[name]
        if np.shape(out) != near.shape:
            return _fail(finding, f"{name} has shape {np.shape(out)}; expected {near.shape}")
        bad = _finite_where_expected(name, out, near)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            text = f"{name}{list(at)} is {np.asarray(out)[at]} for finite inputs"
            if allowed.overflow_risk:
                return Finding(
                    variant.name, "refused", text, dtype=variant.dtype, overflow_risk=True
                )
            return _fail(finding, text)
        diff, fine = difference(out, ref, name)
        # the radius of the reference (and of a ball output), and the float64 rounding of
        # the difference itself (2^-52 of it, charged to the limit)
        extra = ref.rad[name] + radius + (2.0**-150 if fine else 2.0**-100) * np.abs(near)
        limit = (extra if enclosure else allowed.bound[name] + extra) * (1 + 2.0**-52)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(limit > 0, diff / limit, np.where(diff > 0, np.inf, 0.0))
        worst_here = float(np.max(ratio, initial=0.0))
        finding.worst = max(finding.worst, worst_here)
        told = certain(near, ref.rad[name])
        finding.errors[name] = relative_error(diff, told, variant.dtype)
        with np.errstate(all="ignore"):
            finding.ulps[name] = ulps(diff, told, variant.dtype)
        scale = scale_of(told)
        if not enclosure and scale > 0 and float(np.max(allowed.bound[name], initial=0.0)) >= scale:
            finding.vacuous = True
        if worst_here > 1:
            at = tuple(int(i) for i in np.unravel_index(int(np.argmax(ratio)), ratio.shape))
            got = np.asarray(out)[at]
            finding.where = _where(variant, case, name, at, got, ref, limit[at], radius)
            return _fail(
                finding,
                f"{name}{list(at)}: |error| {diff[at]:.3e} > allowed {limit[at]:.3e} "
                f"(got {float(got):.9g}, certified {float(near[at]):.9g} "
                f"± {float(ref.rad[name][at]):.2g})",
            )
    for name, (out, derive) in outputs.get("_derived", {}).items():
        derived = derive(ref)
        if isinstance(derived, str):
            finding.grads_skipped = finding.grads_skipped or derived
            continue
        failed = _judge_derived(name, np.asarray(out, dtype=np.float64), *derived)
        if failed:
            return _fail(finding, failed)
    return finding


def _judge_derived(name: str, out: np.ndarray, exact: np.ndarray, limit: np.ndarray) -> str:
    """Why an output a convention derives its exact value for (a sink's ``dσ``) fails
    ``|out − exact| ≤ limit`` ("" when it passes; NaN fails)."""
    if out.shape != exact.shape:
        return f"{name} has shape {out.shape}; expected {exact.shape}"
    diff = np.abs(out - exact)
    bad = ~(diff <= limit * (1 + 2.0**-52))
    if not bad.any():
        return ""
    at = tuple(int(i) for i in np.argwhere(bad)[0])
    return (
        f"{name}{list(at)}: |error| {diff[at]:.3e} > allowed {limit[at]:.3e} "
        f"(got {out[at]:.9g}, exact {exact[at]:.9g})"
    )


def certain(near: np.ndarray, rad: np.ndarray) -> np.ndarray:
    """``near`` where its ball excludes 0, else 0: the values the reference tells from zero.

    Their largest is the output's scale for the normwise errors, the ulps and vacuity: a
    bound at least that large is *vacuous* (a zero output would pass it). An output whose
    exact value may be 0 has no relative scale and is never vacuous: dQ and dK of a row
    with one allowed key (p = 1, G·V − δ = 0) have an arb midpoint of ~1e-48 within its
    radius, and ``|out| ≤ bound`` is an absolute check that any kernel failing to cancel
    fails. Measured with ``max|ref|``, normwise errors reached 10³⁴, and 13% of a default
    run's float64 cases and 18% of its float32 cases were called vacuous for such rows."""
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(near) > rad, near, 0.0)


def _fail(finding: Finding, detail: str) -> Finding:
    finding.status, finding.detail = "fail", detail
    return finding


def _where(variant, case, name, at, got, ref: Reference, limit, radius) -> dict[str, Any]:
    """Coordinates of the worst element: the output entry, its query row or key block (of
    the size the bound assumed; one key when the claim states none)."""
    block = variant.bound_block(case) or 1
    out: dict[str, Any] = {
        "output": name,
        "index": list(at),
        "got": float(got),
        "reference": float(ref.near[name][at]),
        "reference_radius": float(ref.rad[name][at]),
        "allowed": float(limit),
        "block_size": block,
    }
    if name in ("dk", "dv"):
        j = at[-2]
        out["key"] = j
        out["key_block"] = [j // block * block, min((j // block + 1) * block, case.sizes["n_k"])]
    else:
        out["query_row"] = at[-1] if name == "lse" else at[-2]
    return out
