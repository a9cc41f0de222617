"""Run the differential test: hypothesis draws cases, every target is judged, failures shrink.

:func:`run` splits the examples over worker processes (one hypothesis search each, with
its own seed). When a target fails, hypothesis shrinks the case to a minimal one, which is
written as a replay file (``<dir>/<target>-<hash>.json``: the case with its arrays and the
target's verdict); the search then resumes without that target for the remaining budget,
so one run can report several independent failures.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Unsatisfiable

from .cases import Case, Spec, build_case
from .check import Finding, check_case
from .strategies import specs
from .targets import Target, discover

PROGRESS_EVERY = 500  # cases between progress lines on stderr


class TargetFailed(AssertionError):
    """A target disagreed with the reference by more than the arithmetic explains."""


@dataclass
class Report:
    """What a run saw: examples, verdict counts per target, failures (case + finding)."""

    examples: int = 0
    seconds: float = 0.0
    counts: dict[str, Counter] = field(default_factory=dict)
    worst: dict[str, float] = field(default_factory=dict)
    failures: list[tuple[Finding, str]] = field(default_factory=list)  # (finding, case json)

    def add(self, findings: list[Finding]) -> None:
        for f in findings:
            self.counts.setdefault(f.target, Counter())[f.status] += 1
            if f.status == "ok":
                self.worst[f.target] = max(self.worst.get(f.target, 0.0), f.worst)

    def merge(self, other: Report) -> None:
        self.examples += other.examples
        for name, counter in other.counts.items():
            self.counts.setdefault(name, Counter()).update(counter)
        for name, value in other.worst.items():
            self.worst[name] = max(self.worst.get(name, 0.0), value)
        self.failures += other.failures


def search(
    targets: list[Target], examples: int, seed: int, max_n: int = 12, progress: str = ""
) -> Report:
    """Hypothesis searches over ``examples`` cases in all; each failure is shrunk, recorded,
    and its target dropped for the rest of the budget."""
    report = Report()
    active = list(targets)
    budget = examples
    while budget > 0 and active:
        failure, ran = _search_once(active, budget, seed, max_n, report, progress)
        report.examples += ran
        if failure is None:
            break
        finding, case = failure
        case.note = f"{finding.target}: {finding.detail}"
        report.failures.append((finding, case.to_json()))
        active = [t for t in active if t.name != finding.target]
        budget -= min(ran, budget)
        seed += 1
    return report


def _search_once(
    active: list[Target], budget: int, seed: int, max_n: int, report: Report, progress: str
) -> tuple[tuple[Finding, Case] | None, int]:
    """One hypothesis run: ``(shrunk failure or None, cases executed)``."""
    last: dict[str, tuple[Finding, Case]] = {}
    ran = 0
    start = time.perf_counter()

    @settings(
        max_examples=budget,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate, Phase.shrink],
        report_multiple_bugs=False,
        print_blob=False,
    )
    @given(specs(max_n=max_n))
    def property_(spec: Spec) -> None:
        nonlocal ran
        case = build_case(spec)
        findings = check_case(case, active)
        ran += 1
        report.add(findings)
        if progress and ran % PROGRESS_EVERY == 0:
            seconds, cpu = time.perf_counter() - start, time.process_time()
            print(f"{progress}: {ran} cases, {seconds:.0f} s, cpu {cpu:.0f} s", file=sys.stderr)
        bad = [f for f in findings if f.status == "fail"]
        if bad:
            last[bad[0].target] = (bad[0], case)  # the final call is the shrunk case
            raise TargetFailed(bad[0].target)

    try:
        hypothesis_seed(seed)(property_)()  # reproducible from --seed
    except TargetFailed as error:
        return last[str(error)], ran
    except Unsatisfiable:
        pass
    return None, ran


def _worker(args: tuple[list[str] | None, int, int, int]) -> Report:
    selection, examples, seed, max_n = args
    _one_thread()
    targets, _ = discover(selection)
    return search(targets, examples, seed, max_n, progress=f"worker {seed % 1000}")


def _one_thread() -> None:
    """One BLAS / torch thread per worker: the workers already fill the cores."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def run(
    examples: int,
    selection: list[str] | None = None,
    seed: int = 0,
    jobs: int = 1,
    max_n: int = 12,
) -> tuple[Report, list[str], dict[str, str]]:
    """Run ``examples`` cases over the selected targets on ``jobs`` processes."""
    start = time.perf_counter()
    targets, missing = discover(selection)
    names = [t.name for t in targets]
    if jobs <= 1:
        _one_thread()
        report = search(targets, examples, seed, max_n)
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
    """Write each failure as ``<target>-<hash>.json`` with an ``expect`` block."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for finding, text in report.failures:
        data = json.loads(text)
        data["expect"] = {"target": finding.target, "status": "ok", "seen": finding.detail}
        body = json.dumps(data, indent=1)
        digest = hashlib.sha1(body.encode()).hexdigest()[:10]
        safe = "".join(ch if ch.isalnum() else "_" for ch in finding.target)
        path = out / f"{safe}-{digest}.json"
        path.write_text(body)
        paths.append(path)
    return paths
