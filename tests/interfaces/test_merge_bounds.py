"""bounds.merge_bounds / sink_bounds hold for the merge run in float32 and float16, and a merge
that forgets the max breaks them."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

import exactattn
from exactattn.backends import NumpyContext
from exactattn.error import bounds
from tests.optional import requires

U = {"float32": 2.0**-24, "float16": 2.0**-11}


def _exact(partials):
    """``(y, lse)`` of the union from the definition, in 60-digit mpmath."""
    with mpmath.workdps(60):
        ys = [np.asarray(y, dtype=np.float64) for y, _ in partials]
        lses = [np.asarray(lse, dtype=np.float64) for _, lse in partials]
        y_out, lse_out = np.zeros(ys[0].shape), np.zeros(lses[0].shape)
        for i in np.ndindex(lses[0].shape):
            w = [mpmath.exp(mpmath.mpf(lse[i])) for lse in lses]
            total = mpmath.fsum(w)
            lse_out[i] = float(mpmath.log(total)) if total else -np.inf
            for a in range(ys[0].shape[-1]):
                num = mpmath.fsum(wt * mpmath.mpf(y[i][a]) for wt, y in zip(w, ys))
                y_out[i][a] = float(num / total) if total else 0.0
    return y_out, lse_out


def _partials(rng, dtype, parts=4, spread=2.0, offset=0.0):
    out = []
    for t in range(parts):
        y = rng.normal(size=(5, 3)).astype(dtype)
        lse = (rng.normal(size=5) * spread + offset).astype(dtype)
        if t == 2:
            lse[1] = -np.inf
        out.append((y, lse))
    return out


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("seed", range(4))
def test_the_merge_is_within_its_bound(dtype, seed):
    rng = np.random.default_rng(seed)
    partials = _partials(rng, dtype, offset=100.0 * seed if dtype == "float32" else seed)
    y, lse = exactattn.merge_partials(partials, backend=NumpyContext(dtype, compute=dtype))
    y_ref, lse_ref = _exact(partials)
    bound = bounds.merge_bounds(partials, U[dtype])
    assert bounds.ratio(y - y_ref, bound["y"]) <= 1
    finite = np.isfinite(lse_ref)
    assert bounds.ratio((lse - lse_ref)[finite], bound["lse"][finite]) <= 1


def test_a_merge_without_the_max_breaks_the_bound():
    rng = np.random.default_rng(9)
    partials = _partials(rng, "float32", offset=200.0)
    with np.errstate(all="ignore"):
        w = [np.exp(lse) for _, lse in partials]  # float32: e^{200} overflows
    with np.errstate(all="ignore"):
        y = sum(wt[:, None] * y for wt, (y, _) in zip(w, partials)) / sum(w)[:, None]
    y_ref, _ = _exact(partials)
    assert bounds.ratio(y - y_ref, bounds.merge_bounds(partials, U["float32"])["y"]) > 1


def test_the_sink_term_is_within_its_bound():
    rng = np.random.default_rng(4)
    y, lse = (
        rng.normal(size=(2, 3, 4)).astype(np.float32),
        rng.normal(size=(2, 3)).astype(np.float32),
    )
    sinks = np.array([0.5, -1.0], dtype=np.float32)
    ctx = NumpyContext("float32", compute="float32")
    sink_part = (np.zeros_like(y), np.broadcast_to(sinks[:, None], lse.shape).copy())
    y_m, lse_m = exactattn.merge_partials([(y, lse), sink_part], backend=ctx)
    y_ref, lse_ref = _exact([(y, lse), sink_part])
    bound = bounds.sink_bounds(y, lse, sinks, U["float32"])
    assert bounds.ratio(y_m - y_ref, bound["y"]) <= 1
    assert bounds.ratio(lse_m - lse_ref, bound["lse"]) <= 1


def test_a_budget_past_ln2_leaves_y_unbounded_never_negative():
    """``1 − (e^{β̂} − 1) ≤ 0``: the merge's bound on ``y`` is vacuous (∞), not a negative
    number that fails every result (a sink case at scale 1e4 whose claimed lse bound is 2.5:
    ``tests/interfaces/sinks_budget_past_ln2.json``, now ok)."""
    y, lse = np.ones((1, 2)), np.zeros(1)
    for budget, finite in ((0.1, True), (math.log(2) + 1e-9, False), (2.5, False)):
        bound = bounds.merge_bounds([(y, lse), (0 * y, lse - 1)], 2.0**-53, extra=[budget, 0.0])
        assert (bound["y"] > 0).all() and np.isfinite(bound["y"]).all() == finite, budget


def test_the_sink_case_past_ln2_replays_ok():
    from pathlib import Path

    requires("torch")
    from exactattn.commands.check import main

    path = Path(__file__).resolve().parent / "sinks_budget_past_ln2.json"
    assert main(["--replay", str(path), "--no-probes"]) == 0
