"""The sweep's two kinds of independent task, as plain picklable functions.

* :func:`reference_task`: the certified reference (:mod:`exactattn.certified`) of one
  problem, its allowed set written from the mask's definition;
* :func:`run_task`: one grid point, the tiled and the naive computation in the
  configuration's arithmetic, measured against the reference, each error divided by the
  elementwise bound of :mod:`exactattn.bounds` for the configuration's arithmetic
  (``bound_ratio`` for Y, ``grad_bound_ratio`` the worst of dQ, dK, dV; ≤ 1 where the
  bound holds); returns two CSV rows.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from .. import api, bounds
from ..cases import Case
from ..cases.inputs import input_seed
from ..cases.reference import Reference, certified
from ..expected_bounds import expected_bounds
from ..metrics import METRICS, deviation, error_metrics
from .configs import Config, get_config, to_float64
from .grid import Point, Problem

SWEPT = ("y", "dq", "dk", "dv")  # the outputs the sweep measures (its CSV's columns)


def reference_task(problem: Problem, prec: int | None, workers: int = 1) -> Reference:
    """The certified reference of one problem's case (``prec=None``: chosen by the
    reference; ``workers``: processes its blocks of rows are split over)."""
    return certified(problem.case(), grads=problem.grads, prec=prec, workers=workers)


def _run(impl: str, case: Case, grads: bool, ctx: Any, inputs: dict[str, np.ndarray]):
    q, k, v, g = inputs["q"], inputs["k"], inputs["v"], inputs["g"]
    keywords = dict(
        scale=case.scale,
        mask=case.mask_object(),
        backend=ctx,
        bias=case.bias,
        softcap=case.softcap,
    )
    if impl == "tiled":
        keywords["block_size"] = case.block_size
        forward, backward = api.attention, api.attention_backward
    else:
        forward, backward = api.naive_attention, api.naive_attention_backward
    y, stats = forward(q, k, v, return_stats=True, **keywords)
    out = {"y": y}
    if grads:
        out["dq"], out["dk"], out["dv"] = backward(q, k, v, y, stats, g, **keywords)
    return {name: to_float64(x) for name, x in out.items()}


# --- what runs at a point: an exactattn configuration, or any registry target ---------------
NAIVE_OF = {
    "float16": "np-fp16",
    "bfloat16": "torch-bf16",
    "float32": "np-fp32",
    "float64": "np-fp64",
}


class _Configured:
    """An exactattn configuration: its tiled run (``tiled``) and naive attention
    (``naive``), both in the configuration's arithmetic, bounded by :meth:`Config.arith`."""

    def __init__(self, config: Config):
        self.config = config
        self.ctx = config.make_ctx()
        fmt = config.input_format
        self.columns = {
            "backend": getattr(self.ctx, "name", str(self.ctx)),
            "bits": config.bits,
            "rounding": config.rounding,
            "granularity": config.granularity,
            "u_input": fmt.u,
            "u_compute": config.compute_format.u,
            "u_p": config.p_format.u,
        }
        self.ulp_format = config.ulp_format

    def run(self, impl: str, case: Case, grads: bool) -> dict:
        inputs = {x: self.config.prepare(getattr(case, x)) for x in "qkv"}
        return _run(impl, case, grads, self.ctx, {**inputs, "g": case.g})

    def bound(self, impl: str, case: Case, grads: bool, of: Any = bounds.bounds) -> dict:
        """The tiled reverse freezes ``m, ℓ`` and reads ``δ = G·Y``; naive attention is one
        block of ``n`` keys with ``δ`` summed over ``P``; every row in one reverse tile
        (``of``: :func:`exactattn.bounds.bounds`, or the expected error of
        :func:`exactattn.expected_bounds.expected_bounds`)."""
        tiled = impl == "tiled"
        n = case.sizes["n_k"]
        original = {x: getattr(case, x) for x in "qkv"}
        return of(
            self.config.arith(original, case.block_size if tiled else n),
            *original.values(),
            case.g if grads else None,
            scale=case.scale,
            allowed=case.allowed() if case.masked else None,
            bias=case.bias,
            softcap=case.softcap,
            delta="gy" if tiled else "rowsum",
            row_block=case.sizes["n_q"],
            input_rounding=True,
        )


class _Foreign:
    """A registry target that is not an exactattn configuration (``sdpa[float16]``,
    ``flex``…): its own call as ``tiled``, naive attention in its dtype
    (:data:`NAIVE_OF`) as ``naive``, bounded by the arithmetic it claims. A point it does
    not take is skipped with its reason; without gradients there, only the forward runs."""

    def __init__(self, name: str):
        from .. import targets

        self.variant = targets.variant(name)
        self.naive = _Configured(get_config(NAIVE_OF[self.variant.dtype]))
        claim = self.variant.claim
        fmt = bounds.number_format
        self.columns = {
            "backend": f"{self.variant.name} ({self.variant.target.convention} convention)",
            "bits": fmt(claim.input).p,
            "rounding": "nearest",
            "granularity": "native",
            "u_input": fmt(claim.input).u,
            "u_compute": max(fmt(claim.scores).u, fmt(claim.stats).u),
            "u_p": fmt(claim.p).u,
        }
        self.ulp_format = fmt(claim.input)

    def run(self, impl: str, case: Case, grads: bool) -> dict:
        if impl == "naive":
            return self.naive.run(impl, case, grads)
        why = self.variant.unsupported(case)
        if why:
            raise Skipped(why)
        grads = grads and self.variant.grads_unsupported() is None  # else forward only
        out = self.variant.run(case, self.variant.held(case), grads)
        return {x: np.asarray(out[x], dtype=np.float64) for x in SWEPT if x in out}

    def bound(self, impl: str, case: Case, grads: bool, of: Any = bounds.bounds) -> dict:
        if impl == "naive":
            return self.naive.bound(impl, case, grads, of)
        from ..testing.tolerance import claimed_bound

        inputs = {**case.arrays(), "g": case.g if grads else None, "bias": case.bias}
        return claimed_bound(self.variant, case, inputs, input_rounding=True, bound=of)


class Skipped(Exception):
    """The target does not take this point (its capabilities say why)."""


def unit_of(name: str) -> _Configured | _Foreign:
    """What runs for the ``config`` knob ``name``: a configuration, else a registry target."""
    try:
        return _Configured(get_config(name))
    except ValueError:
        return _Foreign(name)


def run_task(point: Point, reference: Reference) -> list[dict[str, Any]]:
    """Two rows (``impl`` = tiled, naive) of knobs, metrics, deviation and bound ratios."""
    unit = unit_of(point.config)
    case = point.case()
    results, status, seconds = {}, {}, {}
    for impl in ("tiled", "naive"):
        start = time.perf_counter()
        try:
            results[impl] = unit.run(impl, case, point.grads)
            status[impl] = "ok"
        except Skipped as why:
            results[impl], status[impl] = None, f"skipped: {why}"[:200]
        except (FloatingPointError, ValueError, OverflowError, RuntimeError) as error:
            results[impl] = None
            status[impl] = f"error: {type(error).__name__}: {error}"[:200]
        seconds[impl] = time.perf_counter() - start
    rows = []
    for impl in ("tiled", "naive"):
        row: dict[str, Any] = {
            **{name: getattr(point, name) for name in Point.__dataclass_fields__},
            "impl": impl,
            **unit.columns,
            "input_seed": input_seed(point.seed, point.dist, point.n, point.d),
            "status": status[impl],
            "seconds": seconds[impl],
            "ref_radius": reference.largest_radius(SWEPT),
            "ref_prec": reference.prec,
            "ref_seconds": reference.seconds,
        }
        mine, other = results[impl], results["naive" if impl == "tiled" else "tiled"]
        for name in SWEPT:
            present = mine is not None and name in mine
            metrics = (
                error_metrics(mine[name], reference.hi[name], unit.ulp_format, reference.lo[name])
                if present
                else dict.fromkeys(METRICS, math.nan)
            )
            row.update({f"{name}_{metric}": value for metric, value in metrics.items()})
            dev = (
                deviation(mine[name], other[name])
                if present and other is not None and name in other
                else {"max_abs": math.nan, "rmse": math.nan}
            )
            row[f"dev_{name}_max_abs"], row[f"dev_{name}_rmse"] = dev["max_abs"], dev["rmse"]
        row.update(_bound_columns(unit, case, point.grads, impl, mine, reference))
        rows.append(row)
    return rows


BOUND_COLUMNS = ("bound_ratio", "grad_bound_ratio", "bound_max", "bound_vacuous")
EXPECTED_COLUMNS = ("expected_median", "expected_exceed", "expected_max", "expected_entries")
GRADS = ("dq", "dk", "dv")


def _bound_columns(
    unit: _Configured | _Foreign,
    case: Case,
    grads: bool,
    impl: str,
    mine: dict[str, np.ndarray] | None,
    reference: Reference,
) -> dict[str, float]:
    """Measured error over the bound: ``bound_ratio`` (Y), ``grad_bound_ratio`` (the worst
    of dQ, dK, dV), the largest bound on Y and the share of entries whose bound is infinite
    (the arithmetic cannot resolve them: only finiteness is checked there).

    The bound is :func:`exactattn.bounds.bounds` on the exact float64 inputs with
    ``input_rounding`` (the run rounds them to its storage first). The error is the
    distance to the reference's midpoint plus that entry's radius (not the largest radius:
    an entry far below the others, e.g. a gradient through weights ``e^{-700}``, has a bound
    far below the largest radius, and its own radius is as far below it).
    """
    out = dict.fromkeys(BOUND_COLUMNS + EXPECTED_COLUMNS, math.nan)
    if mine is None:
        return out
    found = unit.bound(impl, case, grads)

    def ratio(name: str) -> float:
        error = np.abs((mine[name] - reference.hi[name]) - reference.lo[name])
        return bounds.ratio(error + reference.rad[name], found[name])

    names = ["y", *(x for x in GRADS if x in mine)]
    out["bound_ratio"] = ratio("y")
    if len(names) > 1:
        out["grad_bound_ratio"] = max(ratio(name) for name in names[1:])
    out["bound_max"] = float(found["y"].max())
    out["bound_vacuous"] = float(
        sum(np.isinf(found[x]).sum() for x in names) / sum(found[x].size for x in names)
    )
    error = np.abs((mine["y"] - reference.hi["y"]) - reference.lo["y"]) + reference.rad["y"]
    out.update(expected_columns(error, unit.bound(impl, case, False, expected_bounds)["y"]))
    return out


def expected_columns(error: np.ndarray, expected: np.ndarray) -> dict[str, float]:
    """Y's measured error over its expected error (:mod:`exactattn.expected_bounds`) per
    entry: the median, the share of entries above 1, the largest, and how many entries
    (``0/0`` counts as 0, as in :func:`exactattn.bounds.ratio`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(error == 0, 0.0, error / np.broadcast_to(expected, error.shape)).ravel()
    r = np.where(np.isnan(r), np.inf, r)
    return {
        "expected_median": float(np.median(r)),
        "expected_exceed": float(np.mean(r > 1)),
        "expected_max": float(r.max()),
        "expected_entries": float(r.size),
    }
