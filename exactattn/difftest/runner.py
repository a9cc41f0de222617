"""Run the differential test: :func:`exactattn.testing.runner.search` over difftest's units.

:func:`run` splits the examples over worker processes (one hypothesis search each, with
its own seed). A failure is shrunk to a minimal case, written as a replay file
(``<dir>/<unit>-<hash>.json``: the case with its arrays and the unit's verdict), and the
search resumes without that unit for the remaining budget.
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ..targets import Variant
from ..testing import report as check_report
from ..testing.runner import Report
from ..testing.runner import search as search_units
from ..testing.session import _one_thread
from .check import check_case
from .strategies import draws
from .targets import discover


def search(
    units: list[Variant], examples: int, seed: int, max_n: int = 12, progress: str = ""
) -> Report:
    """Hypothesis searches over ``examples`` cases; each failure shrunk, recorded, and its
    unit dropped for the rest of the budget."""
    return search_units(check_case, units, draws(max_n=max_n), examples, seed, progress)


def _worker(args: tuple[list[str] | None, int, int, int]) -> Report:
    selection, examples, seed, max_n = args
    _one_thread()
    units, _ = discover(selection)
    return search(units, examples, seed, max_n, progress=f"worker {seed % 1000}")


def run(
    examples: int,
    selection: list[str] | None = None,
    seed: int = 0,
    jobs: int = 1,
    max_n: int = 12,
) -> tuple[Report, list[str], dict[str, str]]:
    """Run ``examples`` cases over the selected units on ``jobs`` processes."""
    start = time.perf_counter()
    units, missing = discover(selection)
    names = [u.name for u in units]
    if jobs <= 1:
        _one_thread()
        report = search(units, examples, seed, max_n)
    else:
        shares = [examples // jobs + (i < examples % jobs) for i in range(jobs)]
        report = Report()
        with ProcessPoolExecutor(jobs) as pool:
            for part in pool.map(
                _worker, [(selection, n, seed * 1000 + i, max_n) for i, n in enumerate(shares)]
            ):
                report.merge(part)
    report.seconds = time.perf_counter() - start
    return report, names, missing


def save_failures(report: Report, directory: str | Path) -> list[Path]:
    """Write each failure as ``<unit>-<hash>.json`` with an ``expect`` block."""
    return [
        check_report.save_failure(finding, text, directory, None)
        for finding, text in report.failures
    ]
