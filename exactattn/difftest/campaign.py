"""The differential test as a use of ``exactattn check``: exactattn's own number systems as
a registry selection (:mod:`.targets`), judged by check's runner
(:func:`exactattn.testing.session.judge_cases`) with the known bugs reclassified
(:mod:`exactattn.testing.known`) and the cases a unit does not take left out.

:func:`run` draws the cases from the seed and judges them in this process, in local worker
processes or on a Dask cluster (the same report either way). Each failure is shrunk to a
minimal case, written as a replay file (``<dir>/<unit>-<hash>.json``: the case with its
arrays and the unit's verdict).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cases import Case
from ..cases.strategies import draws
from ..infra.journal import Journal, code_fingerprint
from ..targets import Variant
from ..testing import check_report
from ..testing.case_check import Options
from ..testing.case_check import check_case as check_variants
from ..testing.judge import Finding
from ..testing.known import reclassify
from ..testing.search import Given, Report
from ..testing.search import search as search_units
from ..testing.session import Settings, judge_cases
from .targets import discover


def check_case(case: Case, units: list[Variant]) -> list[Finding]:
    """Every unit's verdict on ``case`` that takes it (references cached per rounding), a
    failure a known bug explains reclassified."""
    by_name = {u.name: u for u in units}
    findings = check_variants(case, units, Options(grads=True))
    return [reclassify(by_name[f.target], case, f) for f in findings if f.status != "skip"]


@dataclass(frozen=True)
class Units:
    """difftest's units of the ``selection`` (see :func:`.targets.discover`), rebuilt
    wherever the cases are judged."""

    selection: tuple[str, ...] | None = None

    def build(self) -> list[Variant]:
        return discover(None if self.selection is None else list(self.selection))[0]

    def judge(self, case: Case, units: list[Variant]) -> list[Finding]:
        return check_case(case, units)

    def counters(self) -> dict[str, float]:
        return {}


def search(
    units: list[Variant], examples: int, seed: int, max_n: int = 12, progress: bool = False
) -> Report:
    """``examples`` cases judged in this process on ``units``; each failure shrunk."""
    return search_units(
        Given(units, check_case), draws(max_n=max_n), examples, seed, progress=progress
    )


def run(
    examples: int,
    selection: list[str] | None = None,
    seed: int = 0,
    workers: int = 1,
    max_n: int = 12,
    *,
    scheduler: Any = None,
    journal: str | Path | None = None,
    resume: bool = False,
    progress: bool = False,
) -> tuple[Report, list[str], dict[str, str]]:
    """Run ``examples`` cases over the selected units on ``workers`` processes or the Dask
    cluster of ``scheduler``; ``journal`` keeps each judged case, ``resume`` the cases it
    already holds (same examples, seed, max n and units)."""
    start = time.perf_counter()
    units, missing = discover(selection)
    names = [u.name for u in units]
    log = None
    if journal is not None:
        settings = {"command": "difftest", "examples": examples, "seed": seed, "max_n": max_n}
        log = Journal(journal, {**settings, "units": names, "code": code_fingerprint()}, resume)
    source = Units(None if selection is None else tuple(selection))
    settings = Settings(
        examples=examples,
        max_n=max_n,
        seed=seed,
        workers=workers,
        scheduler=scheduler,
        progress=progress,
    )
    try:
        report = judge_cases(source, draws(max_n=max_n), settings, log)
    finally:
        if log is not None:
            log.close()
    report.seconds = time.perf_counter() - start
    return report, names, missing


def save_failures(report: Report, directory: str | Path) -> list[Path]:
    """Write each failure as ``<unit>-<hash>.json`` with an ``expect`` block."""
    return [
        check_report.save_failure(finding, text, directory, None)
        for finding, text in report.failures
    ]
