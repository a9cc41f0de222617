"""Run a difftest unit on a case and compare two runs within their derived bounds."""

from __future__ import annotations

import dataclasses
from typing import Any

import mpmath
import numpy as np
import pytest

from exactattn.cases import Case
from exactattn.cases.exact import certified
from exactattn.targets import Variant
from exactattn.testing.tolerance import bounds
from tests.optional import requires

NAMES = ("y", "dq", "dk", "dv")


def held(unit: Variant, case: Case) -> Case:
    """The case with its arrays rounded to what the unit stores (so runs are comparable)."""
    return dataclasses.replace(case, **{n: unit.hold(getattr(case, n)) for n in "qkvg"})


def run(unit: Variant, case: Case) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``name -> (value as float64 or mpf array, ball radius)`` for y, dq, dk, dv."""
    why = unit.unsupported(case)
    if why is not None:
        pytest.skip(f"{unit.name} does not take this case: {why}")
    out = unit.run(case, {n: getattr(case, n) for n in "qkvg"}, True)
    result = {}
    for name in NAMES:
        value = out[name]
        radius = np.zeros(np.shape(value[0] if isinstance(value, tuple) else value))
        if isinstance(value, tuple):
            value, radius = value
        result[name] = (np.asarray(value), np.asarray(radius, dtype=np.float64))
    return result


def allowance(unit: Variant, case: Case) -> dict[str, np.ndarray]:
    """Per-entry bound on |output − exact| for this unit (2× the first-order bound)."""
    if unit.target.options.enclosure:
        return {n: np.zeros(np.shape(_like(case, n))) for n in NAMES}
    requires("flint")
    ref = certified(case, {n: getattr(case, n) for n in "qkvg"})
    return {n: b for n, b in bounds(unit, ref).bound.items() if n in NAMES}


def _like(case: Case, name: str) -> np.ndarray:
    return {"y": case.g, "dq": case.q, "dk": case.k, "dv": case.v}[name]


def difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a − b| as float64, exact for mpf entries (computed at 300 bits)."""
    if a.dtype == object or b.dtype == object:
        with mpmath.workprec(300):
            to = np.frompyfunc(
                lambda e: e if isinstance(e, mpmath.mpf) else mpmath.mpf(float(e)), 1, 1
            )
            diff = np.frompyfunc(lambda x, y: float(abs(x - y)), 2, 1)(to(a), to(b))
        return np.asarray(diff, dtype=np.float64)
    return np.abs(a.astype(np.float64) - b.astype(np.float64))


def assert_close(
    name: str,
    a: tuple[np.ndarray, np.ndarray],
    b: tuple[np.ndarray, np.ndarray],
    bound_a: np.ndarray,
    bound_b: np.ndarray,
    float64_slack: Any = None,
) -> None:
    """|a − b| ≤ bound_a + bound_b + radii (+ float64 rounding of the returned values)."""
    diff = difference(a[0], b[0])
    allowed = bound_a + bound_b + a[1] + b[1]
    if a[0].dtype != object:
        allowed = allowed + 2.0**-52 * np.abs(a[0].astype(np.float64))
    over = diff > allowed
    assert not over.any(), (
        f"{name}: |difference| {diff[over].max():.3e} > allowed {allowed[over].min():.3e}"
    )


def assert_identical(name: str, a: tuple, b: tuple) -> None:
    x, y = a[0], b[0]
    if x.dtype == object:
        assert all(bool(p == q) for p, q in zip(x.flat, y.flat)), name
    else:
        assert x.dtype == y.dtype and np.array_equal(x, y), name
