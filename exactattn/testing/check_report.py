"""What ``exactattn check`` writes: the results table, counterexamples and replay files.

Per variant (a target in one dtype): cases run / skipped / failed with their reasons; the
forward error (normwise ``max|Y − Y_exact| / max|Y_exact|``) max and median, the same in
ulps of the dtype at ``max|Y_exact|``, the gradients' (dQ, dK, dV, each normwise) max and
median; side by side, the median and largest ratio of
the target's error to naive attention's in the same dtype and to the FlashAttention-2
policy's on the same inputs (only cases where the baseline's error is nonzero); the share
of cases whose derived bound was vacuous (``≥`` the largest value the reference tells from
zero: little beyond finiteness was checked; :func:`.judge.certain`) and of cases
whose two runs differed bitwise. :func:`write` puts the table, the skip reasons, the dropout
probe and the failures in ``report.md`` and all of it in ``report.json``.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from pathlib import Path
from typing import Any

from ..cases import Case
from . import coverage, skips
from .case_check import target_errors
from .judge import Finding
from .session import Result

COLUMNS = (
    ("target", "target"),
    ("dtype", "dtype"),
    ("run", "run"),
    ("skipped", "skipped"),
    ("failed", "failed"),
    ("fwd err max", "y_max"),
    ("fwd err median", "y_median"),
    ("ulps max", "ulps_max"),
    ("ulps median", "ulps_median"),
    ("grad err max", "grads_max"),
    ("grad err median", "grads_median"),
    ("/naive median", "naive_median"),
    ("/naive max", "naive_max"),
    ("/FA-2 median", "fa2_median"),
    ("/FA-2 max", "fa2_max"),
    ("vacuous", "vacuous"),
    ("nondeterministic", "nondeterministic"),
    ("/expected max", "expected_max"),
    ("suspicious", "suspicious"),
)


def _finite(xs: Any) -> list[float]:
    return [x for x in xs if not math.isnan(x)]


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def _max(xs: list[float]) -> float:
    return max(xs) if xs else math.nan


def summary(result: Result) -> list[dict[str, Any]]:
    """One row per variant (the columns above)."""
    report = result.report
    rows = []
    for name in result.variants:
        counts = report.counts.get(name, {})
        found: list[Finding] = report.findings.get(name, [])
        y = _finite(f.errors.get("y", math.nan) for f in found)
        ulps = _finite(f.ulps.get("y", math.nan) for f in found)
        grads = _finite(e for f in found for g, e in f.errors.items() if g in ("dq", "dk", "dv"))
        ratios: dict[str, list[float]] = {"naive": [], "fa2": []}
        for f in found:
            mine = target_errors(f)
            for label in ratios:
                base = f.baseline.get(label, {})
                for part, value in mine.items():
                    if base.get(part, 0.0) > 0 and not math.isnan(value):
                        ratios[label].append(value / base[part])
        determinism = [f.deterministic for f in found if f.deterministic is not None]
        judged = ("ok", "fail", "refused", "known", "known-upstream")
        run_count = sum(counts.get(s, 0) for s in judged)
        rows.append(
            {
                "target": name.split("[")[0],
                "variant": name,
                "dtype": found[0].dtype if found else _dtype(name),
                "run": run_count,
                "skipped": counts.get("skip", 0),
                "failed": counts.get("fail", 0),
                "refused": counts.get("refused", 0),
                "known_upstream": dict(report.known.get(name, {})),
                "y_max": _max(y),
                "y_median": _median(y),
                "ulps_max": _max(ulps),
                "ulps_median": _median(ulps),
                "grads_max": _max(grads),
                "grads_median": _median(grads),
                "naive_median": _median(ratios["naive"]),
                "naive_max": _max(ratios["naive"]),
                "naive_over_2": sum(r > 2 for r in ratios["naive"]) / len(ratios["naive"])
                if ratios["naive"]
                else math.nan,
                "fa2_median": _median(ratios["fa2"]),
                "fa2_max": _max(ratios["fa2"]),
                "vacuous": sum(f.vacuous for f in found) / len(found) if found else math.nan,
                "nondeterministic": sum(not d for d in determinism) / len(determinism)
                if determinism
                else math.nan,
                "skip_reasons": dict(report.skips.get(name, {})),
                "grads_skipped": dict(report.grads_skipped.get(name, {})),
                "worst_ratio_to_bound": report.worst.get(name, math.nan),
                "expected_max": _max(_finite(f.expected for f in found)),
                "suspicious": sum(bool(f.suspicious) for f in found),
                "suspicious_cases": [f.suspicious for f in found if f.suspicious],
                "suspicious_worst": max(
                    (f for f in found if f.suspicious),
                    key=lambda f: f.expected,
                    default=Finding("", ""),
                ).suspicious,
            }
        )
    return rows


def _dtype(name: str) -> str:
    return name.split("[")[1].rstrip("]") if "[" in name else ""


def _cell(x: Any) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return "–"
        return f"{x:.3g}" if x != 0 else "0"
    return str(x)


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown results table."""
    lines = ["| " + " | ".join(title for title, _ in COLUMNS) + " |"]
    lines.append("|" + " --- |" * len(COLUMNS))
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[key]) for _, key in COLUMNS) + " |")
    return lines


def counterexample(finding: Finding, case_json: str, replay: Path | None = None) -> str:
    """A failure as a readable counterexample."""
    case = Case.from_json(case_json)
    lines = [
        f"FAIL {finding.target}: {finding.detail}",
        f"  case: {case.describe(finding.own_block)}",
    ]
    if finding.block_size is not None and not finding.own_block:
        lines.append(f"  the bound assumes key blocks of {finding.block_size} (the claim)")
    where = finding.where
    if where:
        if "key" in where:
            lo, hi = where["key_block"]
            place = f"key j={where['key']}, key block [{lo}, {hi}) of size {where['block_size']}"
        else:
            place = f"query row i={where['query_row']}"
        lines.append(
            f"  worst element: {where['output']}{where['index']} ({place}): got {where['got']:.9g},"
            f" certified {where['reference']:.9g} ± {where['reference_radius']:.2g}, "
            f"allowed ± {where['allowed']:.3g}"
        )
    if replay is not None:
        lines.append(f"  replay: exactattn check --replay {replay}")
    return "\n".join(lines)


def suspicious(rows: list[dict[str, Any]]) -> list[str]:
    """One ``SUSPICIOUS`` line per variant with such cases (:mod:`.suspicion`): within the
    rigorous bound, far outside the expected error; never a failure."""
    return [
        f"SUSPICIOUS {r['variant']}: {r['suspicious']} of {r['run']} cases, the worst "
        f"{r['suspicious_worst']} (not a failure: exit code unchanged)"
        for r in rows
        if r["suspicious"]
    ]


def known_upstream(result: Result) -> list[str]:
    """One ``KNOWN-UPSTREAM`` line per variant and upstream bug: the cases it explained, the
    bug, its replay file and upstream report (:data:`.known.UPSTREAM`); never a failure."""
    from .known import UPSTREAM

    return [
        f"KNOWN-UPSTREAM {name}: {count} case{'s' * (count != 1)}, {UPSTREAM[bug].line()}"
        for name, bugs in result.report.known.items()
        for bug, count in bugs.items()
    ]


def save_failure(finding: Finding, case_json: str, directory: str | Path, spec: Any) -> Path:
    """Write a replay file: the case with an ``expect`` block naming the variant."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    data = json.loads(case_json)
    data["expect"] = {"target": finding.target, "status": "ok", "seen": finding.detail}
    if spec is not None:
        data["expect"]["spec"] = spec
    if finding.where:
        data["expect"]["where"] = finding.where
    body = json.dumps(data, indent=1)
    digest = hashlib.sha1(body.encode()).hexdigest()[:10]
    safe = "".join(ch if ch.isalnum() else "_" for ch in finding.target)
    path = out / f"{safe}-{digest}.json"
    path.write_text(body)
    return path


def markdown(result: Result, rows: list[dict[str, Any]], failures: list[str]) -> str:
    s = result.settings
    head = [
        "# exactattn check",
        "",
        f"- variants: {', '.join(result.variants) or '(none)'}",
        f"- examples: {result.report.examples} (seed {s.seed}, max n {s.max_n}, "
        f"gradients {'on' if s.grads else 'off'}, device {s.device})",
        f"- wall time: {result.seconds:.1f} s"
        + (" (interrupted: partial)" if result.report.interrupted else ""),
    ]
    for name, why in result.unavailable.items():
        head.append(f"- unavailable: {name} ({why})")
    for name, dtypes in result.unsupported_dtypes.items():
        head.append(f"- {name} does not take {', '.join(dtypes)}")
    if result.compile:
        c = result.compile
        head.append(
            f"- FlexAttention: {c['compiles']} compiles in {c['compile_seconds']:.1f} s, "
            f"{c['runs']} compiled runs in {c['run_seconds']:.2f} s (compile time apart)"
        )
    body = ["", "## Results", "", *table(rows), ""]
    body += [
        "Errors are normwise relative (max |err| / max |exact|); ulps of the dtype; ratios "
        "are the target's error over naive attention in the same dtype and over the "
        "FlashAttention-2 policy on the same inputs (median and largest over cases); "
        "vacuous: share of cases whose derived bound was at least the largest value the "
        "reference tells from zero for that output (an exact zero is checked absolutely); "
        "/expected max: the largest Y error over its expected error (independent mean-zero "
        "roundings, 3 sigma); suspicious: cases beyond 4x of it, within the rigorous bound.",
        "",
    ]
    body += ["## Coverage", "", *coverage.markdown(result.report.coverage, result.variants), ""]
    listed = skips.markdown(result)
    if listed:
        body += ["## Skipped, with reasons", "", *listed, ""]
    if result.probes:
        body += ["## Dropout probe (the target's own keep-bits)", ""]
        body += ["| variant | p | keep rate | z | kept-factor error | mean z (y, grads) | ok |"]
        body += ["| --- | --- | --- | --- | --- | --- | --- |"]
        for p in result.probes:
            if not p.ran:
                body.append(f"| {p.target} | {p.p} | not run: the target has no dropout | | | | |")
                continue
            means = ", ".join(f"{k} {v:.2g}" for k, v in p.mean_z.items())
            body.append(
                f"| {p.target} | {p.p} | {p.keep_rate:.4f} | {p.keep_z:+.2f} | "
                f"{p.factor_error:.2g} | {means} | {'yes' if p.ok else 'NO: ' + p.detail} |"
            )
        body.append("")
    flagged = suspicious(rows)
    if flagged:
        body += ["## Suspicious (within the rigorous bound, far outside the expected error)", ""]
        body += [f"- {line}" for line in flagged] + [""]
    upstream = known_upstream(result)
    if upstream:
        body += ["## Known upstream (reported, not failed)", "", *(f"- {u}" for u in upstream), ""]
    if failures:
        body += ["## Failures", "", "```", *failures, "```", ""]
    return "\n".join(head + body)


def write(result: Result, directory: str | Path, failures: list[str]) -> tuple[Path, Path]:
    """``report.md`` and ``report.json`` in ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    rows = summary(result)
    md = out / "report.md"
    md.write_text(markdown(result, rows, failures))
    data = {
        "settings": vars(result.settings),
        "examples": result.report.examples,
        "seconds": result.seconds,
        "interrupted": result.report.interrupted,
        "unavailable": result.unavailable,
        "unsupported_dtypes": result.unsupported_dtypes,
        "variants": rows,
        "coverage": coverage.rows(result.report.coverage, result.variants),
        "probes": [vars(p) for p in result.probes],
        "compile": result.compile,
        "failures": [
            {"target": f.target, "detail": f.detail, "where": f.where, "case": json.loads(text)}
            for f, text in result.report.failures
        ],
    }
    js = out / "report.json"
    js.write_text(json.dumps(data, indent=1, default=_json_default))
    return md, js


def _json_default(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    return str(x)
