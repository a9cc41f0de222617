"""The search: hypothesis draws cases, every active unit is judged, failures shrink.

:func:`search` runs one hypothesis search after another over a budget of examples. When a
unit (a variant, or a difftest target) fails, hypothesis shrinks the case to a minimal one
(shrinking follows that unit only) and the counterexample is recorded with its case (a
replay file); the search then resumes for the remaining budget without that unit, or with
it kept and its further failures counted but not shrunk (``keep_failed``), so one run
reports several independent failures. Every other unit the shrunk case fails gets it as its
counterexample too; a unit that failed only while another was being searched gets its first
failing case, unshrunk. Only the cases drawn before a failure count in the statistics (the
shrinker's replays do not). Ctrl-C stops the search and returns what was seen
(``interrupted``).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Flaky, Unsatisfiable

from ..difftest.cases import Case, Draw, build_case
from .judge import Finding

PROGRESS_EVERY = 250  # cases between progress lines on stderr


class UnitFailed(AssertionError):
    """A unit disagreed with the reference by more than its arithmetic explains."""


@dataclass
class Report:
    """What a run saw: per unit, verdict counts, skip reasons, the ok findings (for the
    error statistics) and the failures (finding + case JSON)."""

    examples: int = 0
    seconds: float = 0.0
    interrupted: bool = False
    counts: dict[str, Counter] = field(default_factory=dict)
    worst: dict[str, float] = field(default_factory=dict)
    skips: dict[str, Counter] = field(default_factory=dict)
    grads_skipped: dict[str, Counter] = field(default_factory=dict)
    findings: dict[str, list[Finding]] = field(default_factory=dict)
    failures: list[tuple[Finding, str]] = field(default_factory=list)
    compile: Counter = field(default_factory=Counter)  # FlexAttention's compile statistics

    def add(self, findings: list[Finding]) -> None:
        for f in findings:
            self.counts.setdefault(f.target, Counter())[f.status] += 1
            if f.status == "skip":
                self.skips.setdefault(f.target, Counter())[f.detail] += 1
                continue
            if f.grads_skipped:
                self.grads_skipped.setdefault(f.target, Counter())[f.grads_skipped] += 1
            if f.status == "ok":
                self.worst[f.target] = max(self.worst.get(f.target, 0.0), f.worst)
                self.findings.setdefault(f.target, []).append(f)

    def merge(self, other: Report) -> None:
        self.examples += other.examples
        self.interrupted |= other.interrupted
        for mine, theirs in (
            (self.counts, other.counts),
            (self.skips, other.skips),
            (self.grads_skipped, other.grads_skipped),
        ):
            for name, counter in theirs.items():
                mine.setdefault(name, Counter()).update(counter)
        for name, value in other.worst.items():
            self.worst[name] = max(self.worst.get(name, 0.0), value)
        for name, found in other.findings.items():
            self.findings.setdefault(name, []).extend(found)
        self.failures += other.failures
        self.compile.update(other.compile)


def search(
    judge_case: Callable[[Case, list[Any]], list[Finding]],
    units: list[Any],
    strategy: st.SearchStrategy[Draw] | Callable[[list[Any]], st.SearchStrategy[Draw]],
    examples: int,
    seed: int,
    progress: str = "",
    keep_failed: bool = False,
) -> Report:
    """Search ``examples`` cases in all (see the module docstring). ``judge_case(case,
    active)`` returns the findings of the active units; a unit is named by ``.name``.
    ``strategy`` may be a function of the active units (so a dropped unit's dtype is no
    longer drawn). With ``keep_failed`` a unit that failed stays in the run (its later
    failures are counted, not shrunk again), so its statistics cover the whole budget."""
    report = Report()
    active = list(units)
    settled: set[str] = set()
    first: dict[str, tuple[Finding, Case]] = {}  # each unit's first failing counted case
    budget = examples
    while budget > 0 and active:
        drawn = strategy(active) if callable(strategy) else strategy
        failure, ran, interrupted = _search_once(
            judge_case, active, drawn, budget, seed, report, progress, settled, first
        )
        report.examples += ran
        failed = []
        for finding, case in failure or []:  # the shrunk case, and every unit it also fails
            case.note = f"{finding.target}: {finding.detail}"
            report.failures.append((finding, case.to_json()))
            failed.append(finding.target)
        if interrupted:
            report.interrupted = True
            break
        if not failed:
            break
        if keep_failed:
            settled.update(failed)
        else:
            active = [u for u in active if u.name not in failed]
        budget -= min(ran, budget)
        seed += 1
    recorded = {finding.target for finding, _ in report.failures}
    for name, (finding, case) in first.items():  # failed while another unit was shrunk
        if name not in recorded:
            case.note = f"{finding.target} (not shrunk): {finding.detail}"
            report.failures.append((finding, case.to_json()))
    return report


def _search_once(judge_case, active, strategy, budget, seed, report, progress, settled, first):
    """One hypothesis run: ``(failures or None, cases counted, interrupted)``; the failures are
    the shrunk case's for the unit that failed first, then for the others it also fails."""
    last: dict[str, list[tuple[Finding, Case]]] = {}
    state: dict[str, Any] = {"ran": 0, "failing": False, "unit": ""}
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
    @given(strategy)
    def property_(draw: Draw) -> None:
        case = build_case(draw)
        findings = judge_case(case, active)
        if not state["failing"]:
            state["ran"] += 1
            report.add(findings)
            for f in findings:
                if f.status == "fail":
                    first.setdefault(f.target, (f, case))
            ran = state["ran"]
            if progress and ran % PROGRESS_EVERY == 0:
                seconds = time.perf_counter() - start
                print(f"{progress}: {ran} cases, {seconds:.0f} s", file=sys.stderr, flush=True)
        bad = [f for f in findings if f.status == "fail" and f.target not in settled]
        if state["failing"]:  # shrinking: only the unit that failed first counts
            bad = [f for f in bad if f.target == state["unit"]]
        if bad:
            state["failing"], state["unit"] = True, bad[0].target
            also = [f for f in findings if f.status == "fail" and f.target not in settled]
            # the final call is the shrunk case: its failures, the shrinking unit's first
            others = [(f, case) for f in also if f.target != bad[0].target]
            last[bad[0].target] = [(bad[0], case), *others]
            raise UnitFailed(bad[0].target)

    try:
        hypothesis_seed(seed)(property_)()  # reproducible from --seed
    except UnitFailed as error:
        return last[str(error)], state["ran"], False
    except Flaky:  # a nondeterministic unit failed once and not on replay: keep what it did
        return next(iter(last.values()), None), state["ran"], False
    except Unsatisfiable:
        pass
    except KeyboardInterrupt:  # keep a failure found before the interrupt (maybe unshrunk)
        return next(iter(last.values()), None), state["ran"], True
    return None, state["ran"], False
