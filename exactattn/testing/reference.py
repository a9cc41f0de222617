"""The reference a target is judged against, and its derived tolerance, behind one adapter.

:func:`compute` is the only place the harness asks for the exact answer: today it calls
:func:`exactattn.difftest.reference.compute` (naive attention over arb balls, or mpmath
when python-flint is missing) on the case with grouped heads expanded; the certified module
replacing it plugs in here. The case hands the reference its allowed set from the mask
spec's definition (:meth:`~exactattn.difftest.cases.Case.allowed`) and its dropout factors
``ρ = r/(1−p)`` by formula (:meth:`~exactattn.difftest.cases.Case.rho`).

The log-sum-exp reference is evaluated here in float64 with a derived radius: scores
``ŝ = fl(c·q·k)`` with ``|ŝ − s| ≤ γ_{d+3}·|c|·Σ_r |q_ir||k_jr|`` (Higham §3.1), then
``lse = m + log Σ e^{ŝ−m}`` with ``(n_k + 4)·2^-52`` relative error in the sum, log and
add; ``lse`` moves by at most ``max_j |ŝ_ij − s_ij|`` when the scores move.

:func:`bounds` is the one call into the first-order error bound
(:func:`exactattn.difftest.tolerance.bounds`) for a variant's claimed arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import mpmath
import numpy as np

from ..difftest import reference as difftest_reference
from ..difftest import tolerance
from ..difftest.cases import Case

OUTPUTS = ("y", "lse", "dq", "dk", "dv")
U64 = 2.0**-53


@dataclass
class Reference:
    """Per output: midpoints (mpf objects), radii and float64 nearest values.

    ``values`` is the reference of the case with grouped heads expanded (what the bound
    reads); ``dk``/``dv`` here are summed over each group.
    """

    mid: dict[str, np.ndarray]
    rad: dict[str, np.ndarray]
    near: dict[str, np.ndarray]
    values: Any
    expanded: Case
    held: dict[str, np.ndarray]
    group: int


def expand(case: Case, held: dict[str, np.ndarray]) -> tuple[Case, dict[str, np.ndarray]]:
    """The case and its held arrays with ``k, v`` repeated to one head per query head."""
    group = case.group
    arrays = dict(held)
    if group > 1:
        arrays["k"], arrays["v"] = (np.repeat(held[x], group, axis=-3) for x in "kv")
    return replace(case, **arrays), arrays


def compute(case: Case, held: dict[str, np.ndarray]) -> Reference:
    """The reference for ``case`` on the inputs exactly as held (see the module docstring)."""
    wide, arrays = expand(case, held)
    values = difftest_reference.compute(wide, arrays["q"], arrays["k"], arrays["v"], arrays["g"])
    mid = dict(values.mid)
    rad = dict(values.rad)
    near = {name: getattr(values, name) for name in ("y", "dq", "dk", "dv")}
    lse, lse_rad = _lse(wide, arrays["q"], arrays["k"])
    with mpmath.workprec(200):
        mid["lse"] = np.frompyfunc(mpmath.mpf, 1, 1)(lse).astype(object)
    rad["lse"], near["lse"] = lse_rad, lse
    if case.group > 1:
        for name in ("dk", "dv"):
            mid[name], rad[name], near[name] = _group_sum(
                mid[name], rad[name], case.group, getattr(case, name[1]).shape
            )
    return Reference(mid, rad, near, values, wide, arrays, case.group)


def _group_sum(mid: np.ndarray, rad: np.ndarray, group: int, shape: tuple[int, ...]):
    """Sum the expanded heads of each group: exactly in mpmath (200 bits), radii added."""
    split = (*shape[:-3], shape[-3], group, *shape[-2:])
    with mpmath.workprec(200):
        total = mid.reshape(split).sum(axis=-3)
    radius = rad.reshape(split).sum(axis=-3) * (1 + 2.0**-50) + 2.0**-190 * np.abs(
        total.astype(np.float64)
    )
    return total, radius, total.astype(np.float64)


def _lse(case: Case, q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``lse`` and a bound on its error (see the module docstring)."""
    allowed = case.allowed()
    c = case.c()
    d, n_k = q.shape[-1], k.shape[-2]
    kt = np.swapaxes(k, -1, -2)
    s = np.where(allowed, c * (q @ kt), -np.inf)
    gamma = (d + 3) * U64 / (1 - (d + 3) * U64)
    err = np.where(allowed, gamma * abs(c) * (np.abs(q) @ np.abs(kt)), 0.0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = s.max(axis=-1) if n_k else np.full(s.shape[:-1], -np.inf)
        finite = np.isfinite(m)
        shift = np.where(finite, m, 0.0)
        log_ell = np.log(np.sum(np.exp(s - shift[..., None]), axis=-1))
        lse = np.where(finite, shift + log_ell, -np.inf)
        radius = err.max(axis=-1, initial=0.0) + (n_k + 4) * 2 * U64 * (1 + np.abs(lse))
    return lse, np.where(finite, 2 * radius, 0.0)


@dataclass
class Allowed:
    """The tolerance of one variant on one case: per-output bounds, and whether an
    intermediate may leave the claimed formats' range (then an error is acceptable)."""

    bound: dict[str, np.ndarray]
    overflow_risk: bool


def bounds(variant: Any, ref: Reference) -> Allowed:
    """The derived bound of ``variant``'s claimed arithmetic (the one call into the bound)."""
    case = replace(ref.expanded, block_size=variant.bound_block(ref.expanded))
    arith = tolerance.of_claim(variant.claim)
    with np.errstate(all="ignore"):  # an infinite bound is a vacuous one, not an error
        b = tolerance.bounds(case, ref.held["q"], ref.held["k"], ref.values, arith)
    out = {"y": b.y, "lse": b.lse, "dq": b.dq, "dk": b.dk, "dv": b.dv}
    group = ref.group
    if group > 1:
        for name in ("dk", "dv"):
            parts = out[name].reshape(_split(out[name].shape, group))
            terms = np.abs(getattr(ref.values, name)).reshape(parts.shape)
            gamma = (group - 1) * arith.u / (1 - (group - 1) * arith.u)
            out[name] = parts.sum(axis=-3) + 2 * gamma * terms.sum(axis=-3)
    return Allowed(out, b.overflow_risk)


def _split(shape: tuple[int, ...], group: int) -> tuple[int, ...]:
    return (*shape[:-3], shape[-3] // group, group, *shape[-2:])


def scale_of(x: np.ndarray) -> float:
    """``max |x|`` over finite entries (0 when there are none): the normwise error scale."""
    finite = np.abs(x[np.isfinite(x)])
    return float(finite.max()) if finite.size else 0.0


def _format(fmt: str) -> Any:
    from ..precision.formats import get_format

    return get_format({"longdouble": "float64"}.get(fmt, fmt))


def relative_error(error: np.ndarray, ref: np.ndarray, fmt: str = "float64") -> float:
    """Normwise ``max |error| / max |ref|`` (finite entries); NaN when the reference is
    below ``fmt``'s normal range (an exact zero, e.g. dQ with one key: no scale to judge by)."""
    scale = scale_of(ref)
    tiny = 2.0 ** _format(fmt).e_min if _format(fmt).e_min is not None else 0.0
    if not error.size or scale <= tiny:
        return float("nan")
    return float(np.max(error[np.isfinite(error)], initial=0.0)) / scale


def ulps(error: np.ndarray, ref: np.ndarray, fmt: str) -> float:
    """``max |error|`` in ulps of ``fmt`` at the output's scale ``max |ref|`` (normwise)."""
    scale = scale_of(ref)
    if not error.size or scale == 0:
        return float("nan")
    spacing = float(_format(fmt).ulp(np.array([scale]))[0])
    return float(np.max(error[np.isfinite(error)], initial=0.0)) / spacing
