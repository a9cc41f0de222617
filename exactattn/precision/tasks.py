"""The sweep's two kinds of independent task, as plain picklable functions.

* :func:`reference_task`: the certified reference (:mod:`exactattn.oracle.certified`) of one
  problem, its allowed set written from the mask's definition;
* :func:`run_task`: one grid point, the tiled and the naive computation in the
  configuration's arithmetic, measured against the reference, each error divided by the
  elementwise bound of :mod:`exactattn.error.bounds` for the configuration's arithmetic
  (``bound_ratio`` for Y, ``grad_bound_ratio`` the worst of dQ, dK, dV; ≤ 1 where the
  bound holds); returns two CSV rows. With ``splits > 1`` the tiled run is split-KV
  (:class:`_Split`): partials over key ranges, merged by their lse, bounded by the parts'
  bounds carried through the merge and :func:`exactattn.error.bounds.merge_bounds`.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import api
from ..cases import Case, hold
from ..cases.exact import Reference, certified, fast
from ..cases.inputs import input_seed
from ..core.merge import merge_partials
from ..error import bounds
from ..error.expected_bounds import expected_bounds
from ..error.metrics import METRICS, PAPER_METRICS, deviation, error_metrics, paper_metrics
from .configs import Config, get_config, to_float64
from .grid import MERGES, Point, Problem

SWEPT = ("y", "dq", "dk", "dv")  # the outputs the sweep measures (its CSV's columns)


def reference_task(
    problem: Problem, prec: int | None, workers: int = 1, kind: str = "arb"
) -> Reference:
    """The certified reference of one problem's case (``prec=None``: chosen by the
    reference; ``workers``: processes its blocks of rows are split over). ``kind="fast"``:
    the float64 certified reference (:func:`exactattn.cases.exact.fast`) where it can
    serve — its radius is added to every error, so it is sound, and a low-bit scheme's
    errors (≥ 2^-24) dwarf it — else the arb one."""
    if kind not in ("arb", "fast"):
        raise ValueError(f"reference kind must be 'arb' or 'fast'; got {kind!r}")
    if kind == "fast":
        ref = fast(problem.case(), grads=problem.grads)
        if ref is not None:
            return ref
    return certified(problem.case(), grads=problem.grads, prec=prec, workers=workers)


def _run(
    impl: str,
    case: Case,
    grads: bool,
    ctx: Any,
    inputs: dict[str, np.ndarray],
    sinks: np.ndarray | None = None,
):
    q, k, v, g = inputs["q"], inputs["k"], inputs["v"], inputs["g"]
    keywords = dict(
        scale=case.scale,
        mask=case.mask_object(),
        backend=ctx,
        bias=case.bias,
        softcap=case.softcap,
        sinks=sinks,
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

    def run(self, impl: str, case: Case, grads: bool, sinks: np.ndarray | None = None) -> dict:
        inputs = self.config.prepare({x: getattr(case, x) for x in "qkv"})
        return _run(impl, case, grads, self.ctx, {**inputs, "g": case.g}, sinks)

    def measures(self) -> dict[str, Any]:
        """What the context counted during the last run (a low-bit ``p`` cast's underflow)."""
        measure = getattr(self.ctx, "measures", None)
        return measure() if measure is not None else {}

    def quantised_reference(self, case: Case) -> Reference | None:
        """Exact attention (float64 certified, arb where it cannot serve) at the quantised
        inputs of a scheme that states its quantiser (None for any other configuration):
        :meth:`bound` is then of the distance to it, and the sweep adds its distance to the
        case's exact answer (:func:`_bound_columns`)."""
        scheme = self.config.scheme
        given = {x: getattr(case, x) for x in "qkv"}
        at = None if scheme is None else scheme.reference_inputs(given)
        if at is None:
            return None
        at = {**at, "bias": case.bias} if case.bias is not None else at
        return fast(case, at, grads=False) or certified(case, at, grads=False)

    def bound(self, impl: str, case: Case, grads: bool, of: Any = bounds.bounds) -> dict:
        """The tiled reverse freezes ``m, ℓ`` and reads ``δ = G·Y``; naive attention is one
        block of ``n`` keys with ``δ`` summed over ``P``; every row in one reverse tile
        (``of``: :func:`exactattn.error.bounds.bounds`, or the expected error of
        :func:`exactattn.error.expected_bounds.expected_bounds`); a scheme that states its
        quantiser: of the distance to :meth:`quantised_reference`."""
        tiled = impl == "tiled"
        n = case.sizes["n_k"]
        given = {x: getattr(case, x) for x in "qkv"}
        original = self.config.exact(given)
        arith = self.config.arith(given, case.block_size if tiled else n)  # charges exact()
        return of(
            replace(arith, p_normalized=not tiled),
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


def unit_of(name: str, splits: int = 1, merge: str = "fp32") -> _Configured | _Foreign | _Split:
    """What runs for the ``config`` knob ``name``: a configuration, else a registry target;
    split-KV (:class:`_Split`) when ``splits > 1``."""
    try:
        unit: Any = _Configured(get_config(name))
    except ValueError:
        unit = _Foreign(name)
    if splits > 1:
        if not isinstance(unit, _Configured) or unit.config.quantize:
            raise ValueError(f"splits > 1 runs exactattn's unquantised configurations; not {name}")
        return _Split(unit, merge)
    return unit


class _Split:
    """Split-KV in a configuration's arithmetic (the ``tiled`` run; ``naive`` is unsplit).

    The keys are cut at the case's ``splits`` boundaries ``e_0 < … < e_S``; part ``t`` runs
    the tiled algorithm on keys ``e_{t−1} ≤ j < e_t`` alone (its own blocks from ``e_{t−1}``,
    as a split-KV kernel does) and returns ``(ŷ_t, lse_t)``: ``ŷ_t`` in the input format,
    ``lse_t`` in the compute format. :func:`exactattn.merge_partials` merges them in the
    ``merge`` arithmetic (``fp32``: NumPy float32; ``input``: the input format, the lse
    rounded to it too) and the result is rounded to the input format. Forward only.

    The bound (rigorous, entrywise): with ``B^y_t, B^lse_t`` the bounds of part ``t``
    (:func:`exactattn.error.bounds.bounds` on its keys), ``E = max_t (B^lse_t + |lse'_t − lse_t|)``
    (``lse'_t`` the lse as merged), ``w_t = e^{lse_t − lse}`` the exact weights,
    ``|ŷ − y| ≤ M + e^{2E} Σ_t w_t B^y_t + (e^{2E} − 1) Σ_t w_t |y_t − y|`` plus the final
    rounding ``ū_in(|y| + ·)`` when the merge is wider than the input; ``M`` is
    :func:`exactattn.error.bounds.merge_bounds` of the partials as merged (perturbing each lse by
    ``ε_t``, ``|ε_t| ≤ E``, moves each normalised weight within ``w_t(e^{2E} − 1)``, and the
    weights' changes sum to 0). The exact partials ``(y_t, lse_t)`` are float64 runs.
    """

    def __init__(self, unit: _Configured, merge: str):
        if merge not in MERGES:
            raise ValueError(f"merge must be one of {MERGES}; got {merge!r}")
        self.unit, self.merge = unit, merge
        self.columns, self.ulp_format = unit.columns, unit.ulp_format
        config = unit.config
        wide = merge == "fp32"
        self.merge_ctx = get_config("np-fp32" if wide else NAIVE_OF[config.storage]).make_ctx()
        self.u_merge = get_config("np-fp32" if wide else NAIVE_OF[config.storage]).compute_format.u
        self.last: list[tuple[np.ndarray, np.ndarray]] = []  # the partials as merged

    @staticmethod
    def _parts(case: Case, arrays: dict[str, np.ndarray]):
        """Each part's inputs, keywords (a dense mask: positions stay the case's) and range."""
        allowed = case.allowed()
        for start, stop in itertools.pairwise(case.splits):
            keys = slice(start, stop)
            part = {
                "q": arrays["q"],
                "k": arrays["k"][..., keys, :],
                "v": arrays["v"][..., keys, :],
            }
            keywords = dict(
                scale=case.scale,
                mask=allowed[..., keys],
                bias=None if case.bias is None else case.bias[..., keys],
                softcap=case.softcap,
                block_size=case.block_size,
                empty_rows="zero",
            )
            yield part, keywords

    def run(self, impl: str, case: Case, grads: bool) -> dict:
        if impl == "naive":
            return self.unit.run(impl, case, grads)
        config, ctx = self.unit.config, self.unit.ctx
        arrays = config.prepare({x: getattr(case, x) for x in "qkv"})
        merged_in = []
        for part, keywords in self._parts(case, arrays):
            y_t, stats = api.attention(*part.values(), backend=ctx, return_stats=True, **keywords)
            merged_in.append((to_float64(y_t), to_float64(stats.lse)))
        y, _ = merge_partials(merged_in, backend=self.merge_ctx)
        # what the merge held: y_t exactly (the input format fits), lse_t in its compute format
        self.last = [(y_t, to_float64(self.merge_ctx.as_compute(lse))) for y_t, lse in merged_in]
        self.computed_lse = [lse for _, lse in merged_in]
        return {"y": hold(to_float64(y), config.storage)}

    def bound(self, impl: str, case: Case, grads: bool) -> dict:
        if impl == "naive":
            return self.unit.bound(impl, case, grads)
        config = self.unit.config
        original = {x: getattr(case, x) for x in "qkv"}
        ys, lses, by, blse = [], [], [], []
        for part, keywords in self._parts(case, original):
            y_t, stats = api.attention(*part.values(), return_stats=True, **keywords)
            ys.append(np.asarray(y_t, dtype=np.float64))
            lses.append(np.asarray(stats.lse, dtype=np.float64))
            found = bounds.bounds(
                config.arith(part, case.block_size),
                *part.values(),
                None,
                scale=case.scale,
                allowed=keywords["mask"],
                bias=keywords["bias"],
                softcap=case.softcap,
                delta="gy",
                row_block=case.sizes["n_q"],
                input_rounding=True,
            )
            by.append(found["y"])
            blse.append(found["lse"])
        lse_exact = np.stack(lses)
        top = lse_exact.max(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            w = np.where(np.isneginf(lse_exact), 0.0, np.exp(lse_exact - top))
            w = w / np.where(w.sum(axis=0) > 0, w.sum(axis=0), 1.0)
            moved = [
                np.where(np.isneginf(a), 0.0, np.abs(a - b))
                for (_, a), b in zip(self.last, self.computed_lse)
            ]
        reach = np.max([np.where(w_t > 0, b + m, 0.0) for w_t, b, m in zip(w, blse, moved)], axis=0)
        y = np.einsum("t...,t...v->...v", w, np.stack(ys))
        spread = np.einsum("t...,t...v->...v", w, np.abs(np.stack(ys) - y))
        parts_term = np.einsum("t...,t...v->...v", w, np.stack(by))
        grow = np.exp(2 * reach)[..., None]
        total = bounds.merge_bounds(self.last, self.u_merge)["y"]
        total = total + grow * parts_term + (grow - 1) * spread
        if self.merge == "fp32":  # the merged y rounded to the input format
            u_in = config.input_format.u / (1 - config.input_format.u)
            total = total + u_in * (np.abs(y) + total)
        return {"y": total}


class _Sink:
    """A configuration with one sink logit ``σ`` (one head): the tiled and the naive run with
    ``sinks=[σ]``. The bound, to first order in ``u``: the sink-free bound damped by the
    sink, ``w·B^y`` (``w = 1/(1 + e^{σ−lse})``), plus :func:`exactattn.error.bounds.sink_bounds`
    in the compute format with the pass's ``⌈n_k/b⌉ + 1`` steps (2 for naive attention),
    the row maxima ``m`` and the sink-free bound on the lse. Forward only."""

    def __init__(self, unit: Any, sigma: float, free: Reference):
        if not isinstance(unit, _Configured):
            raise ValueError("a sink runs exactattn's configurations, unsplit")
        self.unit, self.sigma, self.free = unit, np.array([sigma]), free
        self.columns, self.ulp_format = unit.columns, unit.ulp_format

    def run(self, impl: str, case: Case, grads: bool) -> dict:
        return self.unit.run(impl, case, False, self.sigma)

    def bound(self, impl: str, case: Case, grads: bool) -> dict:
        free = self.unit.bound(impl, case, False)
        y, lse = (self.free.hi[x] + self.free.lo[x] for x in ("y", "lse"))
        n_k = case.sizes["n_k"]
        steps = (-(-n_k // case.block_size) if impl == "tiled" else 1) + 1
        scores = case.scale * case.q @ case.k.T
        if case.bias is not None:
            scores = scores + case.bias
        if case.softcap is not None:
            scores = case.softcap * np.tanh(scores / case.softcap)
        m = np.where(case.allowed(), scores, -np.inf).max(axis=-1)
        u = self.unit.config.compute_format.u
        sink = bounds.sink_bounds(  # one head: sink_bounds reads (H, n) rows
            y[None], lse[None], self.sigma, u, steps=steps, m=m[None], lse_error=free["lse"][None]
        )
        damping = 1 / (1 + np.exp(self.sigma[0] - lse))
        return {"y": damping[..., None] * free["y"] + sink["y"][0]}


@dataclass
class _SinkReference:
    """The certified values of a case's attention with a sink ``σ``, from the sink-free
    reference's ``Y`` and ``lse``: ``Y_σ = Y/(1 + e^{σ−lse})``, ``lse_σ = lse + log(1 +
    e^{σ−lse})`` (:mod:`exactattn.core.sinks`), in float64 with their radii carried through
    (``|∂Y_σ/∂lse| ≤ |Y_σ|``, ``|∂lse_σ/∂lse| ≤ 1``) plus 4 float64 roundings."""

    hi: dict[str, np.ndarray]
    lo: dict[str, np.ndarray]
    rad: dict[str, np.ndarray]
    prec: Any
    seconds: float

    @classmethod
    def of(cls, reference: Reference, sigma: float) -> _SinkReference:
        y, lse = (reference.hi[x] + reference.lo[x] for x in ("y", "lse"))
        factor = 1 / (1 + np.exp(sigma - lse))
        y_sink = y * factor[..., None]
        lse_sink = np.logaddexp(lse, sigma)
        eps = 4 * 2.0**-52
        rad_y = reference.rad["y"] * factor[..., None] + np.abs(y_sink) * (
            reference.rad["lse"][..., None] + eps
        )
        rad_lse = reference.rad["lse"] + eps * np.abs(lse_sink)
        zero = {"y": np.zeros_like(y_sink), "lse": np.zeros_like(lse_sink)}
        hi, rad = {"y": y_sink, "lse": lse_sink}, {"y": rad_y, "lse": rad_lse}
        return cls(hi, zero, rad, reference.prec, reference.seconds)

    def largest_radius(self, names: tuple[str, ...]) -> float:
        return max(float(np.max(self.rad[x], initial=0.0)) for x in names if x in self.rad)


def sink_logit(case: Case, reference: Reference) -> float | None:
    """``σ = δ + min_i lse_i`` of a case with a sink offset ``δ`` (None without one)."""
    if case.sinks is None:
        return None
    lse = reference.hi["lse"] + reference.lo["lse"]
    return float(case.sinks[0] + np.min(lse[np.isfinite(lse)], initial=0.0))


def run_task(point: Point, reference: Reference) -> list[dict[str, Any]]:
    """Two rows (``impl`` = tiled, naive) of knobs, metrics, deviation and bound ratios."""
    case = point.case()
    unit = unit_of(point.config, point.splits, point.merge)
    sigma = sink_logit(case, reference)
    if sigma is not None:
        unit = _Sink(unit, sigma, reference)
        reference = _SinkReference.of(reference, sigma)
    results, status, seconds, measured = {}, {}, {}, {}
    for impl in ("tiled", "naive"):
        start = time.perf_counter()
        try:
            results[impl] = unit.run(impl, case, point.grads)
            measured[impl] = unit.measures() if isinstance(unit, _Configured) else {}
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
        present = mine is not None and "y" in mine
        y_ref = reference.hi["y"] + reference.lo["y"]
        papers = paper_metrics(mine["y"], y_ref) if present else {}
        row.update({f"y_{m}": papers.get(m, math.nan) for m in PAPER_METRICS})
        row["p_underflow"] = measured.get(impl, {}).get("p_underflow", math.nan)
        row.update(_bound_columns(unit, case, point.grads, impl, mine, reference))
        rows.append(row)
    return rows


BOUND_COLUMNS = ("bound_ratio", "grad_bound_ratio", "bound_max", "bound_vacuous")
# the low-bit papers' metrics of Y, and the share of p > 0 a low-bit cast sent to 0
LOWBIT_COLUMNS = (*(f"y_{m}" for m in PAPER_METRICS), "p_underflow")
EXPECTED_COLUMNS = ("expected_median", "expected_exceed", "expected_max", "expected_entries")
# the same four figures over the entries of dQ, dK and dV together (runs with gradients)
EXPECTED_GRAD_COLUMNS = tuple(x.replace("expected_", "expected_grad_") for x in EXPECTED_COLUMNS)
GRADS = ("dq", "dk", "dv")
# a scheme that states its quantiser: its error against exact attention at the quantised
# inputs over the bound of it, and the largest distance of that attention to the case's
QUANTISED_COLUMNS = ("arith_bound_ratio", "quant_shift_max")


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
    (the arithmetic cannot resolve them: only finiteness is checked there). A scheme that
    states its quantiser is bounded by the distance to exact attention at its quantised
    inputs ``x̃`` plus that attention's certified distance to the case's (``QUANTISED_COLUMNS``
    give the first ratio alone and the largest distance).

    The bound is :func:`exactattn.error.bounds.bounds` on the exact float64 inputs with
    ``input_rounding`` (the run rounds them to its storage first). The error is the
    distance to the reference's midpoint plus that entry's radius (not the largest radius:
    an entry far below the others, e.g. a gradient through weights ``e^{-700}``, has a bound
    far below the largest radius, and its own radius is as far below it).
    """
    out = dict.fromkeys(
        BOUND_COLUMNS + EXPECTED_COLUMNS + EXPECTED_GRAD_COLUMNS + QUANTISED_COLUMNS, math.nan
    )
    if mine is None:
        return out
    found = unit.bound(impl, case, grads)
    at = unit.quantised_reference(case) if isinstance(unit, _Configured) else None
    shift = 0.0
    if at is not None:  # |Ŷ − Y| ≤ B(x̃) + |Y(x̃) − Y|: the quantisation's own effect, certified
        near = (at.hi["y"] - reference.hi["y"]) + (at.lo["y"] - reference.lo["y"])
        shift = np.abs(near) + at.rad["y"] + reference.rad["y"]
        error = np.abs((mine["y"] - at.hi["y"]) - at.lo["y"]) + at.rad["y"]
        out["arith_bound_ratio"] = bounds.ratio(error, found["y"])
        out["quant_shift_max"] = float(np.max(shift, initial=0.0))
        found = {**found, "y": found["y"] + shift}

    def ratio(name: str) -> float:
        error = np.abs((mine[name] - reference.hi[name]) - reference.lo[name])
        return bounds.ratio(error + reference.rad[name], found[name])

    names = ["y", *(x for x in GRADS if x in mine)]
    out["bound_ratio"] = ratio("y")
    if len(names) > 1:
        out["grad_bound_ratio"] = max(ratio(name) for name in names[1:])
    out["bound_max"] = float(np.max(found["y"], initial=0.0))
    out["bound_vacuous"] = float(
        sum(np.isinf(found[x]).sum() for x in names) / sum(found[x].size for x in names)
    )
    if isinstance(unit, (_Configured, _Foreign)):  # the expected error models no merge, no sink
        expected = unit.bound(impl, case, len(names) > 1, expected_bounds)
        expected = {**expected, "y": expected["y"] + shift}  # the quantisation's, as is

        def error(name: str) -> np.ndarray:
            near = (mine[name] - reference.hi[name]) - reference.lo[name]
            return np.abs(near) + reference.rad[name]

        out.update(expected_columns(error("y"), expected["y"]))
        if len(names) > 1:  # dQ, dK, dV together
            errors = np.concatenate([error(x).ravel() for x in names[1:]])
            limits = np.concatenate(
                [np.broadcast_to(expected[x], mine[x].shape).ravel() for x in names[1:]]
            )
            found = expected_columns(errors, limits)
            out.update({x.replace("expected_", "expected_grad_"): found[x] for x in found})
    return out


def expected_columns(error: np.ndarray, expected: np.ndarray) -> dict[str, float]:
    """A measured error over its expected error (:mod:`exactattn.error.expected_bounds`) per
    entry (Y's; the ``expected_grad_*`` columns: dQ, dK, dV's entries together): the
    median, the share of entries above 1, the largest, and how many entries (``0/0``
    counts as 0, as in :func:`exactattn.error.bounds.ratio`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(error == 0, 0.0, error / np.broadcast_to(expected, error.shape)).ravel()
    r = np.where(np.isnan(r), np.inf, r)
    return {
        "expected_median": float(np.median(r)),
        "expected_exceed": float(np.mean(r > 1)),
        "expected_max": float(r.max()),
        "expected_entries": float(r.size),
    }
