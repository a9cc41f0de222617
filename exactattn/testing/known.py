"""The one list of known bugs: a failure a reported, still-open bug explains is ``known``.

A ``known`` finding is reported with the bug it matches (the run goes on), not counted as a
failure. Each entry names the bug and where it is reported; :func:`reclassify` is the one
place a failure is matched against the list.
"""

from __future__ import annotations

from typing import Any

from .judge import Finding

KNOWN_BUGS = {
    "overflow-as-masked": (
        "scores that overflow to -inf in a narrow compute type are taken for masked keys: "
        "a misleading 'no allowed key' ValueError, or y = 0 silently with empty_rows='zero' "
        "(tests/regressions/overflow_as_masked.py, .json)"
    ),
}


def reclassify(variant: Any, case: Any, finding: Finding) -> Finding:
    """``finding`` as ``known`` when a listed bug explains it, else unchanged."""
    misleading = "no allowed key" in finding.detail or case.empty_rows == "zero"
    narrow = variant.claim.scores in ("float16", "bfloat16", "float32", "float64")
    if finding.status == "fail" and finding.overflow_risk and narrow and misleading:
        return Finding(finding.target, "known", f"overflow-as-masked: {finding.detail}")
    return finding
