"""The third verdict, ``SUSPICIOUS``: within the rigorous bound, far outside the expected error.

A kernel that rounds as it claims has errors near its *expected* error
(:mod:`exactattn.error.expected_bounds`: rounding errors as independent mean-zero variables,
``λ = 3`` standard deviations), far below the rigorous worst case wherever that is loose
(long chains, bf16 statistics over many key blocks: budgets ``(1 + u)^{n/b}``; a reverse's
sums over thousands of rows). An ``ok`` finding whose Y error, or with gradients whose dQ,
dK or dV error, exceeds :data:`FAR` times the expected error somewhere is marked
suspicious, naming the output and the entry: a bug the worst case cannot see (a dV
accumulated in bf16 where the claim says fp32), or rounding biased one way (truncation
claimed as round to nearest). A claimed split of dK, dV's sums over blocks of query rows
(``Claim.qsplit``, torch's CPU flash backward) adds its roundings to the expected error
(:func:`.group_sums.split_variance`). It is reported, never a failure: the exit code is
unchanged.

``FAR = 4`` (so an entry ``12σ`` away): over the sweep presets ``quick``, ``full`` and
``lowbit`` (every NumPy, torch, FP8, mpmath and low-bit configuration, tiled and naive, 2044
runs, 73 million entries of Y; 1500 runs with gradients, 120 million entries of dQ, dK, dV)
the largest ratio is 1.66 for Y and 1.74 for the gradients (docs/error_bound.md §7, with
the commands).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..cases.exact import Reference
from ..error.expected_bounds import CONFIDENCE, expected_bounds
from . import group_sums
from .judge import Finding, difference
from .tolerance import claimed_bound

FAR = 4.0
GRADS = ("dq", "dk", "dv")


def mark(variant: Any, outputs: dict[str, Any], ref: Reference, finding: Finding) -> None:
    """Set ``finding.expected`` (the largest error over its expected error, of Y and, when
    the finding has them and the case a ``g``, dQ, dK, dV) and, beyond :data:`FAR`,
    ``finding.suspicious`` naming the output and entry; only ``ok`` findings of
    non-enclosure targets."""
    if finding.status != "ok" or variant.target.options.enclosure or "y" not in outputs:
        return
    grads = [x for x in GRADS if x in outputs and x in ref.names]
    inputs = dict(ref.held)
    if not grads or inputs.get("g") is None:
        grads, inputs["g"] = [], None  # the forward only: no reverse evaluated
    # of the reverse's structures only naive attention's (δ as a row sum) changes the
    # forward's expected error (its cast of p is of the normalised weights): for Y one
    # evaluation; with gradients every structure the target may use (the largest)
    options = variant.target.options
    naive = any(delta == "rowsum" for _, delta in options.reverses)
    if not grads:
        options = replace(options, reverses=(("ml", "rowsum" if naive else "gy"),))
    single = replace(variant, target=replace(variant.target, options=options))
    expected = claimed_bound(
        single, ref.case, inputs, program_bias=ref.program_bias, bound=expected_bounds
    )
    qsplit = variant.claim.qsplit
    if grads and qsplit is not None:  # a claimed split of the reverse's sums (torch's CPU flash)
        out = variant.arith(None).output
        extra = group_sums.split_variance(ref.case, ref, out, qsplit, variant.bound_block(ref.case))
        for name, var in extra.items():
            expected[name] = np.sqrt(expected[name] ** 2 + CONFIDENCE**2 * var)
    worst = (-1.0, "", (), 0.0, 0.0)
    for name in ("y", *grads):
        out = outputs[name][0] if isinstance(outputs[name], tuple) else outputs[name]
        diff, _ = difference(out, ref, name)
        own = np.broadcast_to(expected[name], diff.shape)
        limit = own + ref.rad[name]
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(diff == 0, 0.0, diff / limit)
        ratio = np.where(np.isnan(ratio), np.inf, ratio)
        at = tuple(int(i) for i in np.unravel_index(int(np.argmax(ratio)), ratio.shape))
        if ratio[at] > worst[0]:
            worst = (float(ratio[at]), name, at, float(diff[at]), float(own[at]))
    finding.expected, name, at, diff_at, expected_at = worst
    if finding.expected > FAR:
        finding.suspicious = (
            f"{name}{list(at)}: |error| {diff_at:.3e} is {finding.expected:.3g}x the expected "
            f"{expected_at:.3e} ({CONFIDENCE:g} sigma of independent mean-zero roundings; "
            f"far: > {FAR:g}x), within the rigorous bound"
        )
