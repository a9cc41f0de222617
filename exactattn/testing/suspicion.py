"""The third verdict, ``SUSPICIOUS``: within the rigorous bound, far outside the expected error.

A kernel that rounds as it claims has errors near its *expected* error
(:mod:`exactattn.error.expected_bounds`: rounding errors as independent mean-zero variables,
``λ = 3`` standard deviations), far below the rigorous worst case wherever that is loose
(long chains, bf16 statistics over many key blocks: budgets ``(1 + u)^{n/b}``). An ``ok``
finding whose Y error exceeds :data:`FAR` times the expected error somewhere is marked
suspicious: a bug the worst case cannot see, or rounding biased one way (truncation
claimed as round to nearest). It is reported, never a failure: the exit code is unchanged.

``FAR = 4`` (so an entry ``12σ`` away): over the sweep presets ``quick`` and ``full``
(every NumPy, torch, FP8 and mpmath configuration, tiled and naive, 1510 runs, 40 million
entries of Y) the largest ratio is 1.58 (docs/error_bound.md §7, with the commands).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..cases.exact import Reference
from ..error.expected_bounds import CONFIDENCE, expected_bounds
from .judge import Finding, difference
from .tolerance import claimed_bound

FAR = 4.0


def mark(variant: Any, outputs: dict[str, Any], ref: Reference, finding: Finding) -> None:
    """Set ``finding.expected`` (Y's largest error over its expected error) and, beyond
    :data:`FAR`, ``finding.suspicious``; only ``ok`` findings of non-enclosure targets."""
    if finding.status != "ok" or variant.target.options.enclosure or "y" not in outputs:
        return
    out = outputs["y"][0] if isinstance(outputs["y"], tuple) else outputs["y"]
    # of the reverse's structures only naive attention's (δ as a row sum) changes the
    # forward's expected error (its cast of p is of the normalised weights): one evaluation
    options = variant.target.options
    naive = any(delta == "rowsum" for _, delta in options.reverses)
    one = replace(options, reverses=(("ml", "rowsum" if naive else "gy"),))
    single = replace(variant, target=replace(variant.target, options=one))
    expected = claimed_bound(
        single, ref.case, ref.held, program_bias=ref.program_bias, bound=expected_bounds
    )["y"]
    diff, _ = difference(out, ref, "y")
    limit = expected + ref.rad["y"]
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(diff == 0, 0.0, diff / limit)
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    at = tuple(int(i) for i in np.unravel_index(int(np.argmax(ratio)), ratio.shape))
    finding.expected = float(ratio[at])
    if finding.expected > FAR:
        finding.suspicious = (
            f"y{list(at)}: |error| {diff[at]:.3e} is {finding.expected:.3g}x the expected "
            f"{expected[at]:.3e} ({CONFIDENCE:g} sigma of independent mean-zero roundings; "
            f"far: > {FAR:g}x), within the rigorous bound"
        )
