"""Drive a sweep: expand the preset, run references and points as tasks, write the CSV.

Every grid point is an independent task (:func:`.tasks.run_task`); the certified
reference of each problem is one task too (:func:`.tasks.reference_task`), computed once
and handed to that problem's points. References are submitted largest first; a large one
(:data:`SPLIT_COST` and up) splits its rows over the local workers itself, so the last
big reference does not run on one core while the others idle. Rows are appended to
``results.csv`` as tasks finish (one row per run: a point × ``impl``), so a killed sweep
resumes from what it wrote: with ``resume`` the rows already in the CSV are kept and only
the missing points run. The progress bar's ETA weighs each task by its estimated cost
(:func:`cost`), references included.
"""

from __future__ import annotations

import csv
import importlib.metadata
import platform
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..error.metrics import METRICS
from ..infra.executors import WorkerDied, make_executor
from .configs import available
from .grid import KNOBS, Point, expand, key_of
from .presets import get_preset
from .tasks import (
    BOUND_COLUMNS,
    EXPECTED_COLUMNS,
    EXPECTED_GRAD_COLUMNS,
    LOWBIT_COLUMNS,
    QUANTISED_COLUMNS,
    SWEPT,
    reference_task,
    run_task,
)

PACKAGES = ("exactattn", "numpy", "mpmath", "python-flint", "torch")
COLUMNS = (
    *KNOBS,
    "impl",
    "backend",
    "bits",
    "rounding",
    "granularity",
    "u_input",
    "u_compute",
    "u_p",
    "input_seed",
    "status",
    "seconds",
    *(f"{out}_{metric}" for out in SWEPT for metric in METRICS),
    *(f"dev_{out}_{metric}" for out in SWEPT for metric in ("max_abs", "rmse")),
    *BOUND_COLUMNS,
    *LOWBIT_COLUMNS,
    *EXPECTED_COLUMNS,
    *EXPECTED_GRAD_COLUMNS,
    *QUANTISED_COLUMNS,
    "ref_radius",
    "ref_prec",
    "ref_seconds",
    "python",
    *(f"v_{name.replace('-', '_')}" for name in PACKAGES),
)


SPLIT_COST = 1024 * 1024 * 64  # n²·d of a reference worth splitting (~1 s forward)


def cost(problem: Any, kind: str) -> float:
    """Relative cost of a task: ``n²·d``, ×3 with gradients; a reference ~20× a run."""
    work = problem.n**2 * problem.d * (3 if problem.grads else 1)
    return work * (20 if kind == "ref" else 1)


def versions() -> dict[str, str]:
    """Interpreter and package versions (``-`` for a package that is not installed)."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[f"v_{name.replace('-', '_')}"] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[f"v_{name.replace('-', '_')}"] = "-"
    return out


@dataclass
class SweepResult:
    csv_path: Path
    rows_written: int
    rows_kept: int
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def read_rows(path: Path) -> list[dict[str, str]]:
    """Complete rows of a (possibly partial) results CSV; a torn last line is dropped."""
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(
                f"{path} has different columns than this version writes; "
                "use a new --out directory or drop --resume"
            )
        return [row for row in reader if None not in row.values() and row.get(COLUMNS[-1])]


def run_sweep(
    preset_name: str,
    out_dir: str | Path,
    *,
    resume: bool = False,
    workers: int = 1,
    scheduler: Any = None,
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    targets: list[str] | None = None,
) -> SweepResult:
    """Run the preset's grid into ``out_dir/results.csv``; returns what was done.

    ``targets``: run these configuration or registry names (:func:`.configs.sweep_names`)
    on the preset's grids instead of its own configurations."""
    start = time.perf_counter()
    preset = get_preset(preset_name, targets)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.csv"
    kept = read_rows(path) if resume else []
    done = {key_of(row) for row in kept}
    with path.open("w", newline="") as handle:  # rewrite: drops a torn last line
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(kept)
    skipped: dict[str, str] = {}
    points = []
    for point in expand(preset):
        ok, why = available(point.config)
        if not ok:
            skipped[point.config] = why
        elif point.key not in done:
            points.append(point)
    by_problem: dict[Any, list[Point]] = defaultdict(list)
    for point in points:
        by_problem[point.problem].append(point)
    prec = preset.get("reference_prec")  # None: the reference picks the lowest sufficient
    stamp = versions()
    written = 0
    executor = make_executor(workers, scheduler)
    problems = sorted(by_problem, key=lambda p: -cost(p, "ref"))
    total = sum(cost(p, "ref") for p in problems) + sum(cost(p, "run") for p in points)
    bar = _Progress(progress, len(problems), len(points), total)
    try:
        with path.open("a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            pending = {}
            for problem in problems:
                split = (
                    workers if scheduler is None and cost(problem, "ref") >= 20 * SPLIT_COST else 1
                )
                future = executor.submit(
                    reference_task, problem, prec, split, preset.get("reference", "arb")
                )
                pending[future] = ("ref", problem)
            while pending:
                finished, _ = executor.wait_first(pending)
                for future in finished:
                    kind, item = pending.pop(future)
                    try:
                        result = executor.result(future)
                    except WorkerDied as error:  # its rows stay missing: --resume runs it
                        for point in by_problem[item] if kind == "ref" else [item]:
                            skipped[point.key] = f"{error}; rerun with --resume"
                        continue
                    if kind == "ref":
                        bar.reference_done(cost(item, "ref"))
                        for point in by_problem[item]:
                            pending[executor.submit(run_task, point, result)] = ("run", point)
                        continue
                    for row in result:
                        row.update(stamp)
                        writer.writerow(row)
                        written += 1
                        if on_row is not None:
                            on_row(row)
                    handle.flush()
                    bar.run_done(cost(item, "run"))
    finally:
        executor.close()
        bar.close()
    return SweepResult(path, written, len(kept), skipped, time.perf_counter() - start)


class _Progress:
    """Rich progress bars: all work weighted by cost (with an ETA), references and runs
    counted (silent when disabled)."""

    def __init__(self, enabled: bool, references: int, runs: int, total: float):
        self._bar = None
        if not enabled:
            return
        from rich.progress import BarColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

        self._bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            "{task.percentage:>3.0f}%",
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        self._totals = {"references": references, "runs": runs}
        self._done = dict.fromkeys(self._totals, 0)
        self._work = self._bar.add_task("all work, by cost", total=max(total, 1.0))
        self._tasks = {
            name: self._bar.add_task(self._label(name), total=max(count, 1))
            for name, count in self._totals.items()
        }
        self._bar.start()

    def _label(self, name: str) -> str:
        return f"{name} {self._done[name]}/{self._totals[name]}"

    def _advance(self, name: str, work: float) -> None:
        if self._bar is None:
            return
        self._done[name] += 1
        self._bar.update(self._tasks[name], advance=1, description=self._label(name))
        self._bar.advance(self._work, work)

    def reference_done(self, work: float) -> None:
        self._advance("references", work)

    def run_done(self, work: float) -> None:
        self._advance("runs", work)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
