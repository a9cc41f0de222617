"""Run the differential test: :func:`exactattn.testing.runner.search` over difftest's units.

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
from ..executors import make_executor
from ..journal import Journal, code_fingerprint
from ..targets import Variant
from ..testing import report as check_report
from ..testing.judge import Finding
from ..testing.runner import Given, Report
from ..testing.runner import search as search_units
from .check import check_case
from .targets import discover


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
    executor = make_executor(workers, scheduler)
    try:
        report = search_units(
            source, draws(max_n=max_n), examples, seed,
            executor=executor, journal=log, progress=progress,
        )  # fmt: skip
    finally:
        executor.close()
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
