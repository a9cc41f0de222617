"""The tolerance a target is judged with: the error bound of the arithmetic it claims.

The exact answer comes from the case model's one reference adapter
(:func:`exactattn.cases.exact.certified`). :func:`bounds` is the only call into the
error bound (:func:`exactattn.error.bounds.bounds`): the arithmetic a variant claims as an
:class:`exactattn.error.bounds.Arith` (:meth:`exactattn.targets.Variant.arith`), the reverse's
structure where the target states it (frozen ``m, ℓ`` or ``lse``; ``δ = G·Y`` or naive
attention's row sum), else the larger of both. A user's ``score_mod`` is bounded when it is
an additive bias (:func:`exactattn.cases.exact.program_bias`), as that bias; no bound is
derived for any other mod (only enclosures judge it). A GQA backward that rounds each
head's gradient before the group's sum is charged for it (:mod:`.group_sums`). The bound
assumes no overflow, so :func:`overflow_risk` says separately when a partial result may
leave the claimed formats' range: an overflow error or a non-finite output is then accepted
("refused").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.formats import LARGEST
from ..cases import Case
from ..cases.exact import Reference
from ..error import bounds as error_bounds
from . import group_sums


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
    bound = group_sums.widened(variant, case, ref, bound)
    arith = variant.arith(variant.bound_block(case), held)
    return Allowed(bound, overflow_risk(arith, case, held))


def claimed_bound(
    variant: Any,
    case: Case,
    inputs: dict[str, Any],
    *,
    input_rounding: bool = False,
    program_bias: np.ndarray | None = None,
    bound: Any = error_bounds.bounds,
) -> dict[str, np.ndarray]:
    """:func:`exactattn.error.bounds.bounds` of the variant's arithmetic on ``inputs`` (``q, k, v,
    g`` and an optional ``bias``), the largest over the reverse structures it may use
    (:func:`exactattn.error.bounds.bounds_max`: one forward for all; ``input_rounding``: the
    inputs are exact values the variant rounds to its input format, as in the sweep;
    ``program_bias``: a user's additive score_mod, added to the bias; ``bound``: the
    function evaluated, :func:`exactattn.error.bounds.bounds` or the expected error
    :func:`exactattn.error.expected_bounds.expected_bounds`, which takes the same arguments)."""
    arith = variant.arith(variant.bound_block(case), inputs)
    inputs = variant.bound_inputs(inputs)  # a low-bit claim's rotation, smoothing
    reverses = variant.target.options.reverses
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
        row_block=case.sizes["n_q"] if variant.target.options.backend == "numpy" else None,
        input_rounding=input_rounding,
    )
    if bound is error_bounds.bounds:
        return error_bounds.bounds_max(
            arith, *(inputs[x] for x in "qkvg"), reverses=tuple(reverses), **keywords
        )
    found = [
        bound(arith, *(inputs[x] for x in "qkvg"), stats=s, delta=d, **keywords)
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
