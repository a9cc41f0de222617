"""The reference a target is judged against, and its derived tolerance, behind one adapter each.

:func:`compute` is the only place the harness asks for the exact answer: the certified
reference (:func:`exactattn.certified.certified_attention`, arb balls) of the case on the
inputs exactly as the variant holds them — ``y``, ``lse`` and the gradients, grouped heads
handled by the reference itself. The case hands it the allowed set from the mask spec's
definition (:meth:`~exactattn.cases.Case.allowed`) and the keep-bits of the
documented hash (:func:`exactattn.cases.spec.keep`), never the library's masks or dropout;
the score modification as the case holds it: the bias as held in the variant's format
(``held["bias"]``; its gradient ``dbias`` joins the outputs), the soft-cap, and a user's
``score_mod`` (evaluated over the balls by the reference itself).

:func:`bounds` is the only call into the error bound (:func:`exactattn.bounds.bounds`): the
arithmetic a variant claims as an :class:`exactattn.bounds.Arith` (:func:`arith_of`), the
reverse's structure where the target states it (frozen ``m, ℓ`` or ``lse``; ``δ = G·Y`` or
naive attention's row sum), else the larger of both. A user's ``score_mod`` is bounded
when it is an additive bias (:func:`program_bias`), as that bias; no bound is derived for
any other mod (only enclosures judge it). The bound assumes no overflow, so
:func:`overflow_risk` says separately when a partial result may leave the claimed formats'
range: an overflow error or a non-finite output is then accepted ("refused").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mpmath
import numpy as np

from .. import bounds as error_bounds
from .. import loading
from ..cases import Case, spec

OUTPUTS = ("y", "lse", "dq", "dk", "dv", "dbias")
REF_PREC = 160  # bits: far below the finest format judged (mpmath at 80 bits)
REVERSES = (("ml", "gy"), ("lse", "gy"), ("ml", "rowsum"))  # (frozen stats, δ) a reverse uses
LARGEST = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
           "float64": 1.7976931348623157e308, "e4m3": 448.0, "e5m2": 57344.0}  # fmt: skip


@dataclass
class Reference:
    """Per output: the certified balls' midpoints (exact mpf), radii and nearest float64."""

    mid: dict[str, np.ndarray]
    rad: dict[str, np.ndarray]
    near: dict[str, np.ndarray]
    balls: Any  # the Enclosure (double-double midpoints: Ball.error)
    case: Case
    held: dict[str, np.ndarray]
    program_bias: np.ndarray | None = None  # a user's additive score_mod as a bias (float64)
    unbounded: str = ""  # why no error bound can be derived for this case ("" when one can)


def keep_bits(case: Case) -> np.ndarray | None:
    """The keep-bits ``r`` of the case's dropout, from their definition (None without)."""
    if not case.dropout_p:
        return None
    n = case.sizes
    return spec.keep(case.dropout_p, case.seed, case.batch, n["n_q"], n["n_k"])


def compute(case: Case, held: dict[str, np.ndarray]) -> Reference:
    """The certified reference for ``case`` on the inputs exactly as held."""
    from ..difftest.reference import require

    score_mod = None
    if case.score_mod is not None:
        score_mod = loading.load_callable(case.score_mod, "--score-mod")
    enclosure = require()(
        held["q"],
        held["k"],
        held["v"],
        held["g"],
        scale=case.scale,
        allowed=case.allowed(),
        keep=keep_bits(case),
        dropout_p=case.dropout_p,
        prec=REF_PREC,
        enable_gqa=case.group > 1,
        bias=held.get("bias"),
        softcap=case.softcap,
        score_mod=score_mod,
    )
    mid, rad, near = {}, {}, {}
    with mpmath.workprec(REF_PREC + 64):
        for name in enclosure.balls:
            ball = enclosure[name]
            mid[name], rad[name] = ball.mpf(), ball.rad
            with np.errstate(invalid="ignore"):
                near[name] = ball.hi + ball.lo
    ref = Reference(mid, rad, near, enclosure, case, held)
    if score_mod is not None:
        ref.program_bias, ref.unbounded = program_bias(score_mod, case, held)
    return ref


def program_bias(fn: Any, case: Case, held: dict[str, np.ndarray]) -> tuple[Any, str]:
    """A user's score_mod as the bias ``β = mod(0)`` when it is additive, ``mod(s) = s + β``
    — else ``(None, why)``. Judged in float64 on the case's scores ``s = c·q·k``: the slope
    ``∂mod/∂s`` (a :class:`exactattn.ops.Dual`'s tangent) is 1 at ``s`` and at 0, and
    ``mod(s)`` is ``s + β`` to float64 rounding, at every pair the mask allows (a check on
    these scores, not a proof that the mod is additive everywhere)."""
    from ..backends import NumpyContext
    from ..ops import Dual, grid_indices

    q, k = held["q"].astype(np.float64), held["k"].astype(np.float64)
    if case.group > 1:
        k = np.repeat(k, case.group, axis=-3)
    n = case.sizes
    lifted = spec.lift(case.batch)
    grid = (*lifted, n["n_q"], n["n_k"])
    s = (case.c() * (q @ np.swapaxes(k, -1, -2))).reshape(grid)
    ctx, indices = NumpyContext("float64"), grid_indices(lifted, n["n_q"], n["n_k"])

    def mod(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = fn(Dual(ctx, x, 1.0), *indices)
        value = np.broadcast_to(out.value if isinstance(out, Dual) else out, grid)
        tangent = 0.0 if not isinstance(out, Dual) or out.tangent is None else out.tangent
        return np.asarray(value, dtype=np.float64), np.broadcast_to(tangent, grid)

    with np.errstate(all="ignore"):
        at_s, slope_s = mod(s)
        beta, slope_0 = mod(np.zeros(grid))
        apart = np.abs(at_s - (s + beta)) > 2.0**-50 * (np.abs(s) + np.abs(beta))
    on = case.allowed().reshape(grid) & (beta != -np.inf)
    if (on & ((slope_s != 1) | (slope_0 != 1) | apart)).any():
        return None, (
            f"score_mod {case.score_mod} is not an additive bias (∂mod/∂s ≠ 1 on this case): "
            "no error bound is derived for it, only enclosures are judged"
        )
    return beta.reshape((*case.batch, n["n_q"], n["n_k"])), ""


def arith_of(variant: Any, case: Case) -> error_bounds.Arith:
    """The :class:`~exactattn.bounds.Arith` a variant claims, at its key-block size.

    exactattn's own IEEE, mpmath and emulated configurations: their context's arithmetic
    (:meth:`Arith.of_context`); every other target: its claim (the coarser of the score
    and statistics formats computes, ``p`` — and in the reverse ``p`` and ``γ`` — is cast
    when it is coarser, as FlashAttention-2's kernels do; outputs are in the input format).
    """
    target = variant.target
    block = variant.bound_block(case)
    own = ("numpy", "torch", "mpmath", "emulated")
    if target.convention == "api" and target.options.get("backend") in own:
        return error_bounds.Arith.of_context(target.options["ctx"](), block=block)
    claim = variant.claim
    fmt = error_bounds.number_format
    compute = max((fmt(claim.scores), fmt(claim.stats)), key=lambda f: f.u)
    p = fmt(claim.p) if fmt(claim.p).u > compute.u else None
    return error_bounds.Arith(
        input=fmt(claim.input),
        compute=compute,
        acc=fmt(claim.acc) if fmt(claim.acc).u >= compute.u else compute,
        output=fmt(claim.input),
        p=p,
        grad_cast=p,  # a kernel that casts p for P·V casts p and γ for the reverse's GEMMs
        block=block,
    )


@dataclass
class Allowed:
    """The tolerance of one variant on one case: per-output bounds, and whether a partial
    result may leave the claimed formats' range (then an overflow is acceptable)."""

    bound: dict[str, np.ndarray]
    overflow_risk: bool


def bounds(variant: Any, ref: Reference) -> Allowed:
    """The bound of ``variant``'s claimed arithmetic on ``ref``'s case (the one call)."""
    case, held = ref.case, ref.held
    bound = claimed_bound(variant, case, held, program_bias=ref.program_bias)
    return Allowed(bound, overflow_risk(arith_of(variant, case), case, held))


def claimed_bound(
    variant: Any,
    case: Case,
    inputs: dict[str, Any],
    *,
    input_rounding: bool = False,
    program_bias: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """:func:`exactattn.bounds.bounds` of the variant's arithmetic on ``inputs`` (``q, k, v,
    g`` and an optional ``bias``), the largest over the reverse structures it may use
    (``input_rounding``: the inputs are exact values the variant rounds to its input format,
    as in the sweep; ``program_bias``: a user's additive score_mod, added to the bias)."""
    arith = arith_of(variant, case)
    reverses = variant.target.options.get("reverse", REVERSES)
    bias = inputs.get("bias")
    if program_bias is not None:  # an additive score_mod after the bias: one bias
        bias = program_bias if bias is None else bias + program_bias
    keywords = dict(
        scale=case.scale,
        allowed=case.allowed(),
        bias=bias,
        softcap=case.softcap,
        rho=case.rho() if case.dropout_p else None,
        enable_gqa=case.group > 1,
        row_block=case.sizes["n_q"] if variant.target.options.get("backend") == "numpy" else None,
        input_rounding=input_rounding,
    )
    found = [
        error_bounds.bounds(arith, *(inputs[x] for x in "qkvg"), stats=s, delta=d, **keywords)
        for s, d in reverses
    ]
    return {name: np.maximum.reduce([b[name] for b in found]) for name in found[0]}


def overflow_risk(arith: error_bounds.Arith, case: Case, held: dict[str, np.ndarray]) -> bool:
    """Whether a partial sum the target forms may reach a quarter of the largest finite
    number of a format it claims (scores, ``p·V``, ``G·V``, the gradient products)."""
    formats = [arith.input, arith.compute, arith.acc] + ([arith.p] if arith.p else [])
    largest = min(LARGEST.get(f.name, np.inf) for f in formats)
    if not np.isfinite(largest):
        return False
    q, k, v, g = (np.abs(held[x]) for x in "qkvg")
    if case.group > 1:
        k, v = (np.repeat(x, case.group, axis=-3) for x in (k, v))
    c, rho = abs(case.c()), 1 / (1 - case.dropout_p)
    qk = q @ np.swapaxes(k, -1, -2)
    gv = g @ np.swapaxes(v, -1, -2)
    worst = max(
        c,
        float(qk.max(initial=0.0)) * max(c, 1.0),
        float(v.sum(axis=-2).max(initial=0.0)) * rho,
        float(gv.max(initial=0.0)) * rho,
        float(gv.max(initial=0.0)) * rho * c * float(np.maximum(q.sum(-2), k.sum(-2)).max()),
        float(max(q.max(initial=0.0), g.max(initial=0.0))),
    )
    return worst >= largest / 4


def scale_of(x: np.ndarray) -> float:
    """``max |x|`` over finite entries (0 when there are none): the normwise error scale."""
    finite = np.abs(x[np.isfinite(x)])
    return float(finite.max()) if finite.size else 0.0


def _format(fmt: str) -> Any:
    return error_bounds.number_format(fmt)


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
