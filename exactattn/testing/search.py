"""The search: cases drawn from a seed, judged as tasks anywhere, failures shrunk here.

:func:`draw` lists the cases first — hypothesis draws ``examples`` distinct case
descriptions (:class:`~exactattn.cases.Draw`) from ``seed``, the same list on every
machine, before anything is judged. :func:`search` judges them in chunks (:func:`judge_chunk`, a
task for :mod:`exactattn.infra.executors`: this process, local processes or a Dask cluster) and
gathers every unit's findings by case index, so the report does not depend on where or in
which order the chunks ran. Every unit is judged on every case; a unit that fails keeps
being judged (its later failures counted, not shrunk again).

Each failing unit's first failing case is then shrunk here: hypothesis replays the same
draws up to that case without judging them and shrinks from there, judging that unit only
(the shrinker's replays do not count in the statistics). The shrunk case is also the
counterexample of every other failed unit it fails; a unit whose failure does not
reproduce keeps its first failing case, unshrunk.

A chunk whose worker process died is judged again one (case, unit) at a time: a pair whose
worker dies again is a failure of that unit on that case, with the reason (not shrunk:
shrinking runs here); the run goes on. Ctrl-C stops the run and returns what was judged
(``interrupted``). With a :class:`~exactattn.infra.journal.Journal` every judged case is written
as it arrives and a resumed run judges only the cases it lacks.

The units come from a *source* — an object with ``build()`` (the units, each with a
``.name``), ``judge(case, units)`` (their findings on one case) and ``counters()``
(cumulative statistics of this process, reported as their growth) — which must pickle by
reference for worker processes or Dask (:class:`Given` holds units in this process only).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Flaky, Unsatisfiable

from ..cases import Case, Draw, build_case
from ..infra.executors import Executor, LocalExecutor, WorkerDied, as_completed
from ..infra.journal import Journal
from ..infra.progress import Progress
from .coverage import tally
from .judge import Finding

CRASHED = "the worker process died judging this case"
CHUNKS_PER_SLOT = 4  # chunks per task slot of the executor: a short tail, few round trips
MAX_CHUNK = 25
DRAW_FACTOR = 2  # hypothesis draws up to this many times the cases wanted (repeats dropped)


class UnitFailed(AssertionError):
    """A unit disagreed with the reference by more than its arithmetic explains."""


@dataclass
class Report:
    """What a run saw: per unit, verdict counts, skip reasons, the ok findings (for the
    error statistics) and the failures (finding + case JSON); ``notes`` say what went
    wrong with the run itself (a worker that died)."""

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
    notes: list[str] = field(default_factory=list)
    known: dict[str, Counter] = field(default_factory=dict)  # per unit: upstream bug → cases
    served: dict[str, Counter] = field(default_factory=dict)  # per unit: reference → cases
    coverage: dict[str, Counter] = field(default_factory=dict)  # per unit (.coverage.tally)

    def add(self, findings: list[Finding], draw: Draw | None = None) -> None:
        for f in findings:
            if draw is not None:
                tally(self.coverage, f, draw)
            self.counts.setdefault(f.target, Counter())[f.status] += 1
            if f.reference:
                self.served.setdefault(f.target, Counter())[f.reference] += 1
            if f.status == "known-upstream":
                self.known.setdefault(f.target, Counter())[f.detail] += 1
            if f.status == "skip":
                self.skips.setdefault(f.target, Counter())[f.detail] += 1
                continue
            if f.grads_skipped:
                self.grads_skipped.setdefault(f.target, Counter())[f.grads_skipped] += 1
            if f.status == "ok":
                self.worst[f.target] = max(self.worst.get(f.target, 0.0), f.worst)
                self.findings.setdefault(f.target, []).append(f)


class Given:
    """A source of units that exist only in this process (callables, patched objects)."""

    def __init__(self, units: list[Any], judge: Callable[[Case, list[Any]], list[Finding]]):
        self._units, self._judge = list(units), judge

    def build(self) -> list[Any]:
        return list(self._units)

    def judge(self, case: Case, units: list[Any]) -> list[Finding]:
        return self._judge(case, units)

    def counters(self) -> dict[str, float]:
        return {}


# --- drawing -------------------------------------------------------------------------------
def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate, Phase.shrink],
        report_multiple_bugs=False,
        print_blob=False,
    )


@contextlib.contextmanager
def seed_only() -> Iterator[None]:
    """Hypothesis draws from the seed alone while this holds.

    Hypothesis (≥ 6.131) mixes the literal constants of the local modules imported so far
    into its choices, so the same seed drew other cases once the process had imported more
    of exactattn or of a user's code: a check of a correct kernel before a broken one drew
    the broken one's cases differently, and a replay for shrinking could drift from the
    draws it replays. The local constants are held empty here (the global ones stay), and
    the cache of constants by choice type is emptied on the way in and out."""
    try:
        from hypothesis.internal.conjecture import providers

        original, empty = providers._get_local_constants, providers.Constants()
    except (ImportError, AttributeError):  # a Hypothesis without local constants
        yield
        return
    providers.CONSTANTS_CACHE.cache.clear()
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = original
        providers.CONSTANTS_CACHE.cache.clear()


def _budget(examples: int) -> int:
    """Hypothesis's ``max_examples`` for ``examples`` distinct cases (:func:`draw`)."""
    return DRAW_FACTOR * examples + 10


def draw(strategy: st.SearchStrategy[Draw], examples: int, seed: int) -> list[Draw]:
    """The first ``examples`` *distinct* case descriptions hypothesis draws from
    ``strategy`` with ``seed`` (fewer if it draws fewer distinct ones within
    :func:`_budget`): the same on every machine. Hypothesis repeats descriptions (its
    generation copies spans of earlier ones): 200 draws of the check's distribution held
    119 distinct cases, and a repeat judges nothing new."""
    drawn: list[Draw] = []
    seen: set[str] = set()

    @_settings(_budget(examples))
    @given(strategy)
    def collect(description: Draw) -> None:
        key = repr(description)
        if len(drawn) < examples and key not in seen:
            seen.add(key)
            drawn.append(description)

    with contextlib.suppress(Unsatisfiable), seed_only():
        hypothesis_seed(seed)(collect)()
    return drawn


# --- the task ------------------------------------------------------------------------------
_BUILT: dict[bytes, list[Any]] = {}  # a worker builds each source's units once


def _units(source: Any) -> list[Any]:
    try:
        key = pickle.dumps(source)
    except (TypeError, AttributeError, pickle.PicklingError):  # units of this process
        return source.build()
    if key not in _BUILT:
        _BUILT[key] = source.build()
    return _BUILT[key]


def judge_chunk(
    source: Any, draws: list[Draw], only: tuple[str, ...] | None = None
) -> tuple[list[list[Finding]], dict[str, float]]:
    """Task: every unit's (or the ``only`` ones') findings on each drawn case, and how
    much the source's counters grew meanwhile."""
    units = _units(source)
    if only is not None:
        units = [u for u in units if u.name in only]
    before = source.counters()
    with single_thread():
        found = [source.judge(build_case(d), units) for d in draws]
    after = source.counters()
    return found, {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """One BLAS / torch intra-op thread while judging, restored after: the cases are small,
    the workers already fill the cores, and waking a thread pool per operation made a
    300-case check 5× slower (measured). NumPy's OpenBLAS is limited through threadpoolctl
    (its pool was started at import, so ``OMP_NUM_THREADS`` set now does not reach it): its
    spinning threads beside torch's made the bound's small GEMMs 50–100× slower on 2 busy
    cores (a (51×64)·(64×1025) product: 47 ms, 0.44 ms on one thread)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with contextlib.ExitStack() as stack:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # an optional speed-up: judged the same without it
            pass
        else:
            stack.enter_context(threadpool_limits(1))
        torch = sys.modules.get("torch")
        if torch is not None:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            stack.callback(torch.set_num_threads, threads)
        yield


# --- the search ----------------------------------------------------------------------------
def search(
    source: Any,
    strategy: st.SearchStrategy[Draw],
    examples: int,
    seed: int,
    *,
    executor: Executor | None = None,
    journal: Journal | None = None,
    progress: bool = False,
) -> Report:
    """Judge ``examples`` cases drawn from ``seed`` on the source's units, shrink the
    failures (see the module docstring). ``executor`` runs the chunks (default: this
    process); ``journal`` keeps each judged case."""
    executor = executor or LocalExecutor(1)
    draws = draw(strategy, examples, seed)
    units = source.build()
    report = Report()
    found: dict[int, list[Finding]] = {}
    if journal is not None:
        for key, (findings, counters) in journal.kept.items():
            if int(key) < len(draws):
                found[int(key)] = findings
                report.compile.update(counters)
    bar = Progress(len(draws), "cases", progress)
    bar.advance(len(found))
    try:
        _judge_all(source, draws, found, executor, journal, bar, report)
    except KeyboardInterrupt:
        report.interrupted = True
    finally:
        bar.close()
    judged = sorted(found)
    for i in judged:
        report.add(found[i], draws[i])
    report.examples = len(judged)
    first: dict[str, tuple[int, Finding]] = {}
    for i in judged:
        for f in found[i]:
            if f.status == "fail":
                first.setdefault(f.target, (i, f))
    if report.interrupted:
        for i, f in first.values():
            _record(report, f, build_case(draws[i]), "not shrunk, interrupted")
        return report
    try:
        with single_thread():
            _shrink_all(source, units, strategy, examples, seed, draws, first, report)
    except KeyboardInterrupt:
        report.interrupted = True
    return report


def _judge_all(source, draws, found, executor, journal, bar, report) -> None:
    """Judge the cases not yet ``found`` in chunks, then the chunks whose worker died case
    by case and unit by unit."""
    todo = [i for i in range(len(draws)) if i not in found]
    size = max(1, min(MAX_CHUNK, len(todo) // (executor.capacity * CHUNKS_PER_SLOT)))
    if executor.capacity == 1:  # in this process: a case a task, so Ctrl-C keeps each one
        size = 1
    chunks = [todo[k : k + size] for k in range(0, len(todo), size)]
    tasks = ((judge_chunk, (source, [draws[i] for i in chunk])) for chunk in chunks)
    died: list[tuple[list[int], str]] = []
    for done in as_completed(executor, tasks):
        chunk = chunks[done.index]
        if isinstance(done.error, WorkerDied):
            died.append((chunk, str(done.error)))
            continue
        if done.error is not None:
            raise done.error
        findings, counters = done.value
        report.compile.update(counters)
        for n, (i, case_findings) in enumerate(zip(chunk, findings)):
            found[i] = case_findings
            if journal is not None:
                journal.add(str(i), (case_findings, counters if n == 0 else {}))
        bar.advance(len(chunk))
    for chunk, why in died:
        _judge_singly(source, draws, chunk, why, found, executor, journal, report)
        bar.advance(len(chunk))


def _judge_singly(source, draws, chunk, why, found, executor, journal, report) -> None:
    names = [u.name for u in source.build()]
    pairs = [(i, name) for i in chunk for name in names]
    tasks = ((judge_chunk, (source, [draws[i]], (name,))) for i, name in pairs)
    per_case: dict[int, dict[str, list[Finding]]] = {i: {} for i in chunk}
    again = 0
    for done in as_completed(executor, tasks):
        i, name = pairs[done.index]
        if isinstance(done.error, WorkerDied):
            again += 1
            per_case[i][name] = [Finding(name, "fail", f"{CRASHED}: {done.error}")]
            continue
        if done.error is not None:
            raise done.error
        (findings,), counters = done.value
        report.compile.update(counters)
        per_case[i][name] = findings
    for i in chunk:
        found[i] = [f for name in names for f in per_case[i][name]]
        if journal is not None:
            journal.add(str(i), (found[i], {}))
    cases = f"cases {chunk[0]}–{chunk[-1]}" if len(chunk) > 1 else f"case {chunk[0]}"
    report.notes.append(
        f"{why}; judged {cases} again one unit at a time: "
        + (f"{again} (case, unit) pair(s) died again" if again else "none died again")
    )


def _shrink_all(source, units, strategy, examples, seed, draws, first, report) -> None:
    """Shrink each failed unit's first failing case (in unit order); a shrunk case is
    also the counterexample of the other failed units it fails."""
    by_name = {u.name: u for u in units}
    settled: set[str] = set()
    for unit in units:
        if unit.name not in first or unit.name in settled:
            continue
        index, finding = first[unit.name]
        settled.add(unit.name)
        case = build_case(draws[index])
        if finding.detail.startswith(CRASHED):  # judging it here could crash this process
            _record(report, finding, case, "not shrunk: it crashed its worker")
            continue
        shrunk = _shrink(source, unit, strategy, examples, seed, draws, index)
        if shrunk is None:
            _record(report, finding, case, "not shrunk: did not fail again")
            continue
        finding, case = shrunk
        _record(report, finding, case)
        others = [
            by_name[name]
            for name, (_, f) in first.items()
            if name not in settled and not f.detail.startswith(CRASHED)
        ]
        for f in source.judge(case, others) if others else []:
            if f.status == "fail":
                settled.add(f.target)
                _record(report, f, case)


def _shrink(source, unit, strategy, examples, seed, draws, index) -> tuple[Finding, Case] | None:
    """Replay the draws up to ``index`` without judging, then let hypothesis shrink the
    failure of ``unit`` from there; None if it does not fail again (or the replay drifts)."""
    state = {"seen": 0, "failing": False, "drifted": False}
    keys: set[str] = set()  # the distinct descriptions replayed so far (as draw counts them)
    last: list[tuple[Finding, Case]] = []

    @_settings(_budget(examples))
    @given(strategy)
    def property_(description: Draw) -> None:
        if state["drifted"]:
            return
        if not state["failing"]:
            key = repr(description)
            if key in keys:  # a repeat: draw dropped it
                return
            keys.add(key)
            seen = state["seen"]
            state["seen"] += 1
            if seen < index:
                state["drifted"] = description != draws[seen]  # it should not: then give up
                return
        case = build_case(description)
        bad = [f for f in source.judge(case, [unit]) if f.status == "fail"]
        if bad:
            state["failing"] = True
            last[:] = [(bad[0], case)]
            raise UnitFailed(unit.name)

    try:
        with seed_only():
            hypothesis_seed(seed)(property_)()
    except (UnitFailed, Flaky):  # Flaky: it failed, then not on replay; keep what it did
        return last[0] if last else None
    except Unsatisfiable:
        pass
    return None


def _record(report: Report, finding: Finding, case: Case, how: str = "") -> None:
    case.note = f"{finding.target}{f' ({how})' if how else ''}: {finding.detail}"
    report.failures.append((finding, case.to_json()))
