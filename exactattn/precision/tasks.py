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

from .. import api, bounds, masks
from ..cases import spec
from ..cases.inputs import input_seed, make_inputs
from .configs import Config, get_config, to_float64
from .grid import Point, Problem
from .metrics import METRICS, deviation, error_metrics
from .presets import SCORES
from .reference import OUTPUTS, Reference, certified_reference

MASKS = ("none", "causal", "window")


def build_mask(name: str, n: int) -> Any:
    """``none``, ``causal`` or ``window`` (each query sees the ``max(1, n//8)`` keys before it)."""
    if name == "none":
        return None
    if name == "causal":
        return masks.causal()
    if name == "window":
        return masks.sliding_window(left=max(1, n // 8), right=0)
    raise ValueError(f"mask must be one of {MASKS}; got {name!r}")


def allowed_set(name: str, n: int) -> np.ndarray | None:
    """The allowed set of :func:`build_mask`'s mask, written from its definition for the
    reference (not through :mod:`exactattn.masks`): ``j ≤ i`` (causal), and also
    ``j ≥ i − max(1, n//8)`` (window); ``None`` when every pair is allowed."""
    if name not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}; got {name!r}")
    if name == "none":
        return None
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    allowed = j <= i
    return allowed & (j >= i - max(1, n // 8)) if name == "window" else allowed


def score_terms(name: str, n: int, seed: int) -> tuple[np.ndarray | None, float | None]:
    """The bias ``B`` (float64, ``(n, n)``) and soft-cap of a score modification, written
    from its definition (:mod:`exactattn.cases.spec`, not :mod:`exactattn.scores`):

    * ``alibi``: ``B_ij = −|i − j|/8`` (one head's slope, 2^-3: exact in every format);
    * ``t5``: a N(0, 1) table of 32 buckets indexed by T5's bidirectional bucket of
      ``j − i`` (max distance 128);
    * ``bias-inf``: N(0, 1) entries, a tenth of the off-diagonal ones ``−∞`` (the diagonal
      stays finite, so no row of a causal problem ends empty);
    * ``softcap``: no bias, scores capped as ``5·tanh(s/5)``.
    """
    if name not in SCORES:
        raise ValueError(f"score must be one of {SCORES}; got {name!r}")
    rng = np.random.default_rng([seed, n, SCORES.index(name)])
    if name == "alibi":
        return spec.bias({"kind": "alibi", "form": "abs", "slopes": [2.0**-3]}, (), n, n), None
    if name == "t5":
        table = rng.standard_normal((1, 32))
        return spec.bias({"kind": "t5", "table": table, "max_distance": 128}, (), n, n), None
    if name == "bias-inf":
        values = rng.standard_normal((n, n))
        values[(rng.random((n, n)) < 0.1) & ~np.eye(n, dtype=bool)] = -np.inf
        return values, None
    if name == "softcap":
        return None, 5.0
    return None, None


def scale_of(problem: Problem | Point) -> float:
    """The score scale ``c = scale / sqrt(d)`` as a float64 (exact input of every run)."""
    return float(problem.scale) / math.sqrt(problem.d)


def reference_task(problem: Problem, prec: int | None, workers: int = 1) -> Reference:
    """The certified reference of one problem (``prec=None``: chosen by the reference;
    ``workers``: processes its blocks of rows are split over)."""
    inputs = make_inputs(problem.dist, problem.n, problem.d, problem.seed)
    bias, softcap = score_terms(problem.score, problem.n, problem.seed)
    return certified_reference(
        inputs,
        scale=scale_of(problem),
        allowed=allowed_set(problem.mask, problem.n),
        bias=bias,
        softcap=softcap,
        prec=prec,
        grads=problem.grads,
        workers=workers,
    )


def _run(impl: str, point: Point, ctx: Any, inputs: dict[str, np.ndarray], mask: Any):
    q, k, v, g = inputs["q"], inputs["k"], inputs["v"], inputs["g"]
    bias, softcap = score_terms(point.score, point.n, point.seed)
    keywords = dict(scale=scale_of(point), mask=mask, backend=ctx, bias=bias, softcap=softcap)
    if impl == "tiled":
        keywords["block_size"] = point.block
        forward, backward = api.attention, api.attention_backward
    else:
        forward, backward = api.naive_attention, api.naive_attention_backward
    y, stats = forward(q, k, v, return_stats=True, **keywords)
    out = {"y": y}
    if point.grads:
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

    def run(self, impl: str, point: Point, original: dict[str, np.ndarray]) -> dict:
        inputs = {x: self.config.prepare(a) if x != "g" else a for x, a in original.items()}
        return _run(impl, point, self.ctx, inputs, build_mask(point.mask, point.n))

    def bound(self, impl: str, point: Point, original: dict[str, np.ndarray]) -> dict:
        """The tiled reverse freezes ``m, ℓ`` and reads ``δ = G·Y``; naive attention is one
        block of ``n`` keys with ``δ`` summed over ``P``; every row in one reverse tile."""
        tiled = impl == "tiled"
        return bounds.bounds(
            self.config.arith(original, point.block if tiled else point.n),
            *(original[x] for x in "qkv"),
            original["g"] if point.grads else None,
            scale=scale_of(point),
            allowed=allowed_set(point.mask, point.n),
            **dict(zip(("bias", "softcap"), score_terms(point.score, point.n, point.seed))),
            delta="gy" if tiled else "rowsum",
            row_block=point.n,
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

    def case(self, point: Point, original: dict[str, np.ndarray]) -> Any:
        from ..cases import Case

        mask = {"none": {"kind": "none"}, "causal": {"kind": "causal"}}.get(point.mask)
        if mask is None:
            mask = {"kind": "window", "left": max(1, point.n // 8), "right": 0}
        bias, softcap = score_terms(point.score, point.n, point.seed)
        return Case(
            **original,
            block_size=point.block,
            scale=scale_of(point),
            mask=mask,
            bias=bias,
            softcap=softcap,
        )

    def run(self, impl: str, point: Point, original: dict[str, np.ndarray]) -> dict:
        if impl == "naive":
            return self.naive.run(impl, point, original)
        case = self.case(point, original)
        why = self.variant.unsupported(case)
        if why:
            raise Skipped(why)
        grads = point.grads and self.variant.grads_unsupported() is None  # else forward only
        out = self.variant.run(case, self.variant.held(case), grads)
        return {x: np.asarray(out[x], dtype=np.float64) for x in OUTPUTS if x in out}

    def bound(self, impl: str, point: Point, original: dict[str, np.ndarray]) -> dict:
        if impl == "naive":
            return self.naive.bound(impl, point, original)
        from ..testing.reference import claimed_bound

        case = self.case(point, original)
        inputs = {**original, "g": original["g"] if point.grads else None, "bias": case.bias}
        return claimed_bound(self.variant, case, inputs, input_rounding=True)


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
    original = make_inputs(point.dist, point.n, point.d, point.seed)
    results, status, seconds = {}, {}, {}
    for impl in ("tiled", "naive"):
        start = time.perf_counter()
        try:
            results[impl] = unit.run(impl, point, original)
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
            "ref_radius": reference.radius,
            "ref_prec": reference.prec,
            "ref_seconds": reference.seconds,
        }
        mine, other = results[impl], results["naive" if impl == "tiled" else "tiled"]
        for name in OUTPUTS:
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
        row.update(_bound_columns(unit, point, impl, original, mine, reference))
        rows.append(row)
    return rows


BOUND_COLUMNS = ("bound_ratio", "grad_bound_ratio", "bound_max", "bound_vacuous")
GRADS = ("dq", "dk", "dv")


def _bound_columns(
    unit: _Configured | _Foreign,
    point: Point,
    impl: str,
    original: dict[str, np.ndarray],
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
    out = dict.fromkeys(BOUND_COLUMNS, math.nan)
    if mine is None:
        return out
    found = unit.bound(impl, point, original)

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
    return out
