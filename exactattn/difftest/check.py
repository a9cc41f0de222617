"""Judge one case on every difftest unit (:func:`exactattn.testing.check.check_case`), with
the listed known bugs reclassified.

A failure explained by a reported, still-open bug of the core is ``known`` (the run goes
on and the bug is listed), not ``fail``; cases a unit does not take are left out.
"""

from __future__ import annotations

from ..cases import Case
from ..targets import Variant
from ..testing.check import Options
from ..testing.check import check_case as check_variants
from ..testing.judge import Finding

KNOWN_BUGS = {
    "overflow-as-masked": (
        "scores that overflow to -inf in a narrow compute type are taken for masked keys: "
        "a misleading 'no allowed key' ValueError, or y = 0 silently with empty_rows='zero' "
        "(tests/regressions/overflow_as_masked.py, .json)"
    ),
}


def _known(unit: Variant, case: Case, finding: Finding) -> Finding:
    """Reclassify a failure explained by a listed, reported bug (the run goes on)."""
    misleading = "no allowed key" in finding.detail or case.empty_rows == "zero"
    narrow = unit.claim.scores in ("float16", "bfloat16", "float32", "float64")
    if finding.status == "fail" and finding.overflow_risk and narrow and misleading:
        return Finding(finding.target, "known", f"overflow-as-masked: {finding.detail}")
    return finding


def check_case(case: Case, units: list[Variant]) -> list[Finding]:
    """Every unit's verdict on ``case`` that takes it (references cached per rounding)."""
    by_name = {u.name: u for u in units}
    findings = check_variants(case, units, Options(grads=True))
    return [_known(by_name[f.target], case, f) for f in findings if f.status != "skip"]
