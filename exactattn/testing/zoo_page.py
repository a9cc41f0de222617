"""The zoo: every available foreign target checked at one profile, as one markdown page.

``exactattn zoo`` (``exactattn check --zoo``) runs every registered foreign target this
machine can run — torch's SDPA backends, FlexAttention, transformers' functions, ONNX
Runtime, OpenVINO, JAX/XLA, and the GPU libraries where there is a device — through check's
one runner (so ``--workers``, ``--scheduler`` and ``--journal``/``--resume`` work as for
check), and :func:`page` writes what it found: per target, dtype and calling path (the
drawn paths, a GQA row across them, and an interface convention's name before its paths:
``flash-kvcache: decode``) the cases judged, the failures, the worst error over its bound
and the worst measured error over the expected one (``/exp``, :mod:`.suspicion`), then the
targets that could not run and why, the skips by reason, and every finding with its cause
and reproducer.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from ..targets import registry
from ..targets.interface_table import NAMES as INTERFACES
from . import coverage, skips
from .known import UPSTREAM


def targets() -> list[str]:
    """The names of every foreign (not exactattn's own) registered target."""
    return [name for name, t in registry().items() if t.family == "foreign"]


def rows(result: Any) -> list[dict[str, Any]]:
    """One row per variant and calling path: judged, failed, worst error/bound, /exp."""
    out = []
    for variant in result.variants:
        c = result.report.coverage.get(variant, Counter())
        paths = sorted(k.removeprefix("path ") for k in c if k.startswith("path "))
        convention = result.targets[variant.partition("[")[0]].convention
        interface = f"{convention}: " if convention in INTERFACES else ""
        for path in paths:
            out.append(
                {
                    "variant": variant,
                    "path": interface + path.removeprefix(coverage.VIEW),
                    "judged": c[f"path {path}"],
                    "failed": c[f"failed {path}"],
                    "worst": c[f"worst {path}"],
                    "expected": c.get(f"expected {path}", math.nan),
                }
            )
    return out


def page(result: Any, command: str, wall: float, cpu: float, load: str) -> str:
    """The markdown of the zoo (see the module docstring)."""
    report = result.report
    lines = [
        "# The zoo: the world's attention kernels against the certified reference",
        "",
        f"Written by `{command}` in {wall:.0f} s wall, {cpu:.0f} s CPU ({load}); "
        f"{report.examples} drawn cases, each judged on every variant that takes it. "
        "err/bound: the largest |error| over its rigorous bound among the passing cases "
        "(≤ 1 passes); /exp: the largest measured error of Y over its expected error "
        "(SUSPICIOUS above 4, never a failure).",
        "",
        "| target | path | judged | failed | err/bound | /exp | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows(result):
        verdict = "FAIL" if row["failed"] else "pass"
        lines.append(
            f"| {row['variant']} | {row['path']} | {row['judged']} | {row['failed']} | "
            f"{row['worst']:.3g} | {_num(row['expected'])} | {verdict} |"
        )
    if result.unavailable:
        lines += ["", "## Not run here", ""]
        lines += [f"- {name}: {why}" for name, why in sorted(result.unavailable.items())]
    listed = skips.markdown(result)
    if listed:
        lines += ["", "## Skipped cases by reason", "", *listed]
    lines += ["", "## Findings", ""]
    known = {name for counts in report.known.values() for name in counts}
    for name in sorted(known):
        bug = UPSTREAM[name]
        lines.append(
            f"- KNOWN-UPSTREAM `{name}`: {bug.summary}. Replay `{bug.replay}`; {bug.report}."
        )
    for finding, _ in report.failures:
        lines.append(f"- FAIL {finding.target}: {finding.detail}")
    if not known and not report.failures:
        lines.append("- none: every judged case passed within its target's claim")
    lines += [
        "",
        "Claims and the upstream sources they are taken from: each target's",
        "docstring (`exactattn check --list`) and the reproducers in `docs/zoo/`.",
        "",
    ]
    return "\n".join(lines)


def _num(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.3g}"
