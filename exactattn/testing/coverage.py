"""What a PASS covered: per variant, the cases judged by calling path and where they reach.

A check's verdicts say little without what was run: a kernel passing 200 cases of 32 keys
was never run across its 128-key block boundary. :func:`tally` counts, for each variant's
judged (not skipped) case, its calling path (:mod:`exactattn.cases.paths`), ``n_q ≠ n_k``,
decode (``n_q = 1``), GQA, cases with at least 2 and at least 8 key blocks of the claimed
size ``b`` (the bound's; the case's own block size when the claim states none), a partial
tail block (``n_k mod b ≠ 0``), the largest ``n``, the vacuous bounds and which reference
served, and for cases with interface fields what they covered (sequences per batch,
zero-length sequences, number of splits, empty splits and splits on a block edge, page
sizes, shared pages, sinks above the lse, a KV cache's appends, page crossings and rotary:
:func:`exactattn.cases.interface_fields.coverage` of the built case, its findings'
``covered``);
:func:`table` prints it beside the verdicts (and ``report.md``).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

COLUMNS = (
    ("judged", "judged"),
    ("n_q≠n_k", "cross"),
    ("decode", "decode"),
    ("GQA", "gqa"),
    ("≥2 blocks", "blocks2"),
    ("≥8 blocks", "blocks8"),
    ("n_k%b≠0", "tail"),
    ("largest n", "largest"),
    ("vacuous", "vacuous"),
    ("float64 ref", "float64"),
)
LEGEND = (
    "b = claimed key-block size; ≥2/≥8 blocks: ceil(n_k/b); n_k%b≠0: partial tail block; "
    "float64 ref: served by the float64 reference (else arb)"
)
QUANTISED = (
    "reference: exact attention at the inputs as the claim's stated quantiser "
    "(quantiser=nearest) quantises them, in {} cases"
)
TABLE_LEGEND = (
    "run/skip/fail: cases; fwd, grad max: normwise error (grad: dQ, dK, dV); ulps: at max|Y|;"
    " /naive, /FA-2: median error ratios; vacuous: bound ≥ the output's largest value told from 0"
)


def path_of(draw: Any) -> str:
    """The calling path a drawn case was drawn for (``other`` for difftest's draws)."""
    note = getattr(draw, "note", "")
    if note.startswith("ill-conditioned"):
        return "ill-conditioned"
    return note.removeprefix("path ") if note.startswith("path ") else "other"


VIEW = "view "  # a path-like subset that cuts across the drawn paths (GQA)


def views_of(draw: Any) -> list[str]:
    """The subsets a case also belongs to besides its drawn path: ``view GQA`` (more query
    heads than key/value heads, whatever the mask), counted apart from the paths."""
    return [f"{VIEW}GQA"] if draw.group > 1 else []


def tally(counts: dict[str, Counter], finding: Any, draw: Any) -> None:
    """Count ``finding`` (a judged case of its variant) under its case ``draw``."""
    if finding.status == "skip":
        return
    c = counts.setdefault(finding.target, Counter())
    b = finding.block_size or draw.block_size or 1
    blocks = math.ceil(draw.n_k / b)
    c["judged"] += 1
    for path in [path_of(draw), *views_of(draw)]:
        c[f"path {path}"] += 1
        c[f"failed {path}"] += finding.status == "fail"
        c[f"worst {path}"] = max(c[f"worst {path}"], finding.worst)  # |error| / bound, ok cases
        if not math.isnan(finding.expected):
            c[f"expected {path}"] = max(c[f"expected {path}"], finding.expected)
    c["cross"] += draw.n_q != draw.n_k
    c["decode"] += draw.n_q == 1
    c["gqa"] += draw.group > 1
    c["blocks2"] += blocks >= 2
    c["blocks8"] += blocks >= 8
    c["tail"] += draw.n_k % b != 0
    c["largest"] = max(c["largest"], draw.n_q, draw.n_k)
    c["vacuous"] += bool(finding.vacuous)
    c["float64"] += finding.reference == "float64"
    c["quantised"] += finding.quantised
    for key in finding.covered:  # read off the built case (a KV cache's resolved layout)
        c[f"iface {key}"] += 1


def rows(counts: dict[str, Counter], variants: list[str]) -> list[dict[str, Any]]:
    """One row per variant: counts, and shares for the vacuous bounds and the reference."""
    out = []
    for name in variants:
        c = counts.get(name, Counter())
        n = c["judged"]
        row: dict[str, Any] = {"variant": name, **{key: c[key] for _, key in COLUMNS}}
        row["quantised"] = c["quantised"]
        for key in ("vacuous", "float64"):
            row[key] = c[key] / n if n else math.nan
        row["paths"] = {
            k.removeprefix("path "): v
            for k, v in c.items()
            if k.startswith("path ") and not k.startswith(f"path {VIEW}")
        }
        row["interfaces"] = {
            k.removeprefix("iface "): v for k, v in c.items() if k.startswith("iface ")
        }
        out.append(row)
    return out


def _paths(row: dict[str, Any], key: str = "paths") -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(row[key].items(), key=lambda kv: -kv[1]))


def _cell(x: Any) -> str:
    if isinstance(x, float):
        return "–" if math.isnan(x) else f"{x:.0%}"
    return str(x)


def table(counts: dict[str, Counter], variants: list[str]) -> list[str]:
    """The terminal coverage table, its legend and the cases per path."""
    lines = [f"  {'coverage':<26}" + "".join(f" {title:>9}" for title, _ in COLUMNS)]
    for row in rows(counts, variants):
        cells = "".join(f" {_cell(row[key]):>9}" for _, key in COLUMNS)
        lines.append(f"  {row['variant']:<26}{cells}")
        paths = _paths(row)
        if paths:
            lines.append(f"  {'':<26} paths: {paths}")
        if row["interfaces"]:
            lines.append(f"  {'':<26} interfaces: {_paths(row, 'interfaces')}")
        if row["quantised"]:
            lines.append(f"  {'':<26} {QUANTISED.format(row['quantised'])}")
    lines.append(f"  {LEGEND}")
    return lines


def markdown(counts: dict[str, Counter], variants: list[str]) -> list[str]:
    """The coverage table in markdown (``report.md``)."""
    lines = ["| variant | " + " | ".join(t for t, _ in COLUMNS) + " | cases per path |"]
    lines.append("|" + " --- |" * (len(COLUMNS) + 2))
    for row in rows(counts, variants):
        paths = _paths(row)
        if row["interfaces"]:
            paths += f"; interfaces: {_paths(row, 'interfaces')}"
        if row["quantised"]:
            paths += f"; {QUANTISED.format(row['quantised'])}"
        cells = " | ".join(_cell(row[key]) for _, key in COLUMNS)
        lines.append(f"| {row['variant']} | {cells} | {paths} |")
    return [*lines, "", LEGEND + "."]
