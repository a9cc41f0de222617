"""Run a difftest target on a case and compare two runs within their derived bounds."""

from __future__ import annotations

from typing import Any

import mpmath
import numpy as np

from exactattn.difftest import reference
from exactattn.difftest.cases import Case
from exactattn.difftest.targets import Target
from exactattn.difftest.tolerance import bounds
from tests.optional import requires

NAMES = ("y", "dq", "dk", "dv")


def held(target: Target, case: Case) -> Case:
    """The case with its arrays rounded to what the target stores (so runs are comparable)."""
    import dataclasses

    return dataclasses.replace(case, **{n: target.hold(getattr(case, n)) for n in "qkvg"})


def run(target: Target, case: Case) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``name -> (value as float64 or mpf array, ball radius)`` for y, dq, dk, dv."""
    if not target.supports(case):
        import pytest

        pytest.skip(f"{target.name} does not take this case")
    out = target.run(case, {n: getattr(case, n) for n in "qkvg"})
    result = {}
    for name in NAMES:
        value = out[name]
        radius = np.zeros(np.shape(value[0] if isinstance(value, tuple) else value))
        if isinstance(value, tuple):
            value, radius = value
        result[name] = (np.asarray(value), np.asarray(radius, dtype=np.float64))
    return result


def allowance(target: Target, case: Case) -> dict[str, np.ndarray]:
    """Per-entry bound on |output − exact| for this target (2× the first-order bound)."""
    if target.enclosure:
        return {n: np.zeros(case.q.shape) for n in NAMES} | _zero_like(case)
    requires("flint")
    ref = reference.compute(case, case.q, case.k, case.v, case.g)
    b = bounds(case, case.q, case.k, ref, target.arith)
    return {"y": b.y, "dq": b.dq, "dk": b.dk, "dv": b.dv}


def _zero_like(case: Case) -> dict[str, np.ndarray]:
    n_q = case.q.shape[:-1]
    return {
        "y": np.zeros((*n_q, case.v.shape[-1])),
        "dq": np.zeros(case.q.shape),
        "dk": np.zeros(case.k.shape),
        "dv": np.zeros(case.v.shape),
    }


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
