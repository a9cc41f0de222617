"""The proof families by name, and one run of them: the tasks, the lines, the certificate.

``exactattn prove`` (:mod:`exactattn.commands.prove`) parses its arguments and calls
:func:`run`; a new family is a module with ``obligations(max_n)`` and one entry in
:data:`FAMILIES`.

A run is one task per obligation (:func:`prove`), handed to an executor
(:mod:`exactattn.infra.executors`: this process, local processes or a Dask cluster). Obligations
hold closures, which do not travel: a task names its obligation by :class:`Source` (family,
``max_n``, the user's program) and index, and the worker rebuilds the list (once per
process) and checks that entry within the run's ``timeout``. The verdicts are gathered by
index, so the lines, the summary and the certificate are the same however the run was
spread (timings aside; on a cluster of threads z3 may pick another refuting model). The
mutants family judges a mutant only by probes that prove on the unmutated library: each
mutant task carries the unmutated verdicts reached before it was handed out
(:func:`mutants.remember` on the worker); a probe without one is run unmutated there. A
worker that dies leaves its obligation LOST, and the run goes on. Tasks that share a
process take turns (:data:`ONE_AT_A_TIME`): a mutant patches the library process-wide, so
on a cluster of threads (Dask with ``processes=False``) another task's obligation could
run against the patched library.

With a ``journal`` each verdict is written as it arrives; ``resume`` keeps the verdicts a
journal holds for the same ``max_n``, program and library code (TIMEOUT and LOST ones are
checked again) and checks only the rest.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from exactattn.infra.executors import as_completed, make_executor
from exactattn.infra.journal import Journal, code_fingerprint
from exactattn.infra.progress import Progress

from . import agreement, mutation
from .certificate import certificate
from .chain import PROGRAM as PROGRAM_THEOREM
from .chain import lines as chain_lines
from .chain import of_families as chain_theorems
from .chain import ran as chain_ran
from .engine import ledger, solver, sympy_cache
from .families import (
    dropout_bits,
    forward,
    general,
    interfaces,
    monoid,
    mutants,
    overflow,
    reach,
    reverse,
    score_mods,
    second_order,
    smt,
    tiles,
)
from .families import flex_program as program_family

FAMILIES: dict[str, ModuleType] = {
    "monoid": monoid,
    "forward": forward,
    "reverse": reverse,
    "scores": score_mods,
    "general": general,
    "overflow": overflow,
    "smt": smt,
    "tiles": tiles,
    "dropout": dropout_bits,
    "interfaces": interfaces,
    "mutants": mutants,
    "reach": reach,
}
FAMILIES["second_order"] = second_order  # issue 35: the second-order reverse
solver.keep_heap_top()  # in every process that runs obligations, before its heap grows

NOT_BY_DEFAULT = ("reach",)
DEFAULT_MAX_N = 4
INTERRUPTED = 130


def default_families() -> list[str]:
    return [name for name in FAMILIES if name not in NOT_BY_DEFAULT]


@dataclass(frozen=True)
class ProgramRef:
    """A user's FlexAttention program by reference (``module:fn`` or ``file.py:fn``), so
    that a worker can load it too."""

    mask_mod: str | None = None
    score_mod: str | None = None
    batch: tuple[int, int] = (1, 1)
    all_n: bool = False
    assume: tuple[tuple[str, str], ...] = ()
    block_mod: str | None = None

    def load(self) -> program_family.Program:
        """The program; ValueError or ImportError if a reference does not load."""
        mods = {
            "mask_mod": self.mask_mod and program_family.load(self.mask_mod, "--mask-mod"),
            "score_mod": self.score_mod and program_family.load(self.score_mod, "--score-mod"),
            "block_mod": self.block_mod and program_family.load(self.block_mod, "--block-mod"),
        }
        name = " + ".join(ref for ref in (self.mask_mod, self.score_mod) if ref)
        return program_family.Program(
            **mods, batch=self.batch, name=name, all_n=self.all_n, assume=self.assume,
            block_name=self.block_mod or "",
        )  # fmt: skip


@dataclass(frozen=True)
class Source:
    """Where a family's obligations come from: what a worker needs to rebuild them."""

    family: str
    max_n: int
    program: ProgramRef | None = None

    def obligations(self) -> list[ledger.Obligation]:
        if self.program is not None:
            return program_family.obligations_for(self.program.load(), self.max_n)
        return FAMILIES[self.family].obligations(self.max_n)


Key = tuple[str, str, str]  # (family, name, sizes): an obligation's identity


def key_of(ob: ledger.Obligation) -> Key:
    return (ob.family, ob.name, ob.sizes)


# --- the task ------------------------------------------------------------------------------
# Each process's obligation lists by source: a worker builds a list once; the process that
# plans a run puts its own lists here, so its in-process checks run exactly those.
_BUILT: dict[Source, list[ledger.Obligation]] = {}


def _rebuilt(source: Source) -> list[ledger.Obligation]:
    if source not in _BUILT:
        _BUILT[source] = source.obligations()
    return _BUILT[source]


ONE_AT_A_TIME = threading.RLock()  # a process's tasks, one at a time (see the docstring)


def prove(
    source: Source,
    index: int,
    key: Key,
    timeout: float | None = None,
    unmutated: tuple[tuple[Key, str], ...] = (),
) -> ledger.Verdict:
    """Task: check obligation ``index`` of ``source`` (which must be ``key``), after
    remembering the ``unmutated`` verdicts for the mutants family (in a process whose sympy
    cache is sized for proofs: :mod:`exactattn.proofs.engine.sympy_cache`)."""
    with ONE_AT_A_TIME:
        sympy_cache.widen()
        obligations = _rebuilt(source)
        ob = obligations[index] if index < len(obligations) else None
        if ob is None or key_of(ob) != key:
            return ledger.Verdict(
                ledger.LOST,
                0.0,
                f"this worker's {source.family} family has no obligation {key[1]!r} "
                f"({key[2]}) at index {index}: is the same exactattn installed on the workers?",
            )
        mutants.remember([_remembered(k, status) for k, status in unmutated])
        return ledger.check(ob, timeout)


def _remembered(key: Key, status: str) -> ledger.Outcome:
    """An unmutated verdict reached elsewhere, in the form ``mutants.remember`` reads."""
    return ledger.Outcome(ledger.Obligation(*key, check=_not_rechecked), status, 0.0)


def _not_rechecked() -> None:
    raise RuntimeError("a verdict reached elsewhere is remembered, not checked again")


# --- one run -------------------------------------------------------------------------------
def run(
    families: list[str],
    max_n: int = DEFAULT_MAX_N,
    report: str | None = None,
    mutation_tests: bool = False,
    command: str = "exactattn prove",
    program: ProgramRef | None = None,
    *,
    workers: int = 1,
    scheduler: Any = None,
    timeout: float | None = None,
    journal: str | Path | None = None,
    resume: bool = False,
    progress: bool = False,
) -> int:
    """Run ``families`` (names of :data:`FAMILIES`), or a user's ``program`` alone; 0 if
    every obligation is PROVED (or SKIPPED) and every mutant killed, 1 if not, 130 if
    interrupted (the journal keeps what was checked). ``report`` is a path for the
    certificate; ``workers`` / ``scheduler`` choose where the checks run
    (:func:`exactattn.infra.executors.make_executor`); ``timeout`` limits each obligation."""
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}")
    start = time.perf_counter()
    if program is not None:
        families = [program_family.FAMILY]
        sources = [Source(program_family.FAMILY, max_n, program)]
    else:
        sources = [Source(name, max_n) for name in families]
    for source in sources:
        _BUILT[source] = source.obligations()
    planned = [(s, i, ob) for s in sources for i, ob in enumerate(_BUILT[s])]
    log = None
    if journal is not None:
        settings = {"command": "prove", "max_n": max_n, "program": repr(program)}
        log = Journal(
            journal, {**settings, "code": code_fingerprint(Path(__file__).parent)}, resume
        )
    verdicts = _kept(planned, log)
    todo = [p for p in range(len(planned)) if p not in verdicts]
    bar = Progress(len(planned), "obligations", progress)
    bar.advance(len(verdicts))
    shown = _show(planned, verdicts, 0, bar)
    try:
        executor = make_executor(workers, scheduler)
    except BaseException:
        bar.close()
        raise
    interrupted = False
    try:
        for done in as_completed(executor, _tasks(planned, todo, verdicts, timeout)):
            p = todo[done.index]
            verdicts[p] = done.value if done.error is None else _lost(done.error)
            if log is not None:
                ob = planned[p][2]
                log.add(" / ".join(key_of(ob)), verdicts[p], verdicts[p].status)
            bar.advance()
            shown = _show(planned, verdicts, shown, bar)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        executor.close()
        bar.close()
        if log is not None:
            log.close()
    if interrupted:
        where = f"; {journal} keeps them (rerun with --resume)" if journal else ""
        print(f"interrupted: {len(verdicts)} of {len(planned)} obligations checked{where}")
        return INTERRUPTED
    outcomes = [ledger.outcome(ob, verdicts[p]) for p, (_, _, ob) in enumerate(planned)]
    tested = mutation.run_all() if mutation_tests else None
    seconds = time.perf_counter() - start
    print(ledger.summary(outcomes, seconds))
    print(agreement.line(outcomes))
    if program is None and chain_ran(families):
        print("\n".join(chain_lines(outcomes, chain_theorems(families))))
    elif program is not None and program.all_n:
        theorem = PROGRAM_THEOREM
        if program.block_mod is None:  # no structure given: its link does not apply
            theorem = type(theorem)(theorem.name, theorem.statement, theorem.links[:-1])
        print("\n".join(chain_lines(outcomes, (theorem,))))
    if tested is not None:
        print(mutation.summary(tested))
    if report:
        docs = {**FAMILIES, program_family.FAMILY: program_family}
        theorems = {name: docs[name].__doc__ or "" for name in families}
        text = certificate(outcomes, seconds, theorems, command, tested)
        with open(report, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"certificate written to {report}")
    survived = tested is not None and not all(t.killed for t in tested)
    return 0 if all(o.ok for o in outcomes) and not survived else 1


Planned = list[tuple[Source, int, ledger.Obligation]]


def _kept(planned: Planned, log: Journal | None) -> dict[int, ledger.Verdict]:
    """The journal's verdicts for planned obligations (TIMEOUT and LOST are checked again)."""
    if log is None:
        return {}
    found = {}
    for p, (_, _, ob) in enumerate(planned):
        verdict = log.kept.get(" / ".join(key_of(ob)))
        if verdict is not None and verdict.status not in (ledger.TIMEOUT, ledger.LOST):
            found[p] = verdict
    return found


def _tasks(planned: Planned, todo: list[int], verdicts: dict, timeout: float | None):
    """The :func:`prove` tasks in order; a mutant's carries the unmutated verdicts so far."""
    for p in todo:
        source, index, ob = planned[p]
        unmutated = ()
        if source.family == mutants.FAMILY:
            unmutated = tuple(
                (key_of(other), verdicts[q].status)
                for q, (_, _, other) in enumerate(planned)
                if q in verdicts and not other.expect_refuted
            )
        yield prove, (source, index, key_of(ob), timeout, unmutated)


def _lost(error: BaseException) -> ledger.Verdict:
    """The verdict of a task that did not come back (its worker died, or it could not run)."""
    return ledger.Verdict(ledger.LOST, 0.0, f"{type(error).__name__}: {error}")


def _show(planned: Planned, verdicts: dict, shown: int, bar: Progress) -> int:
    """Print the lines of the obligations from ``shown`` on that have verdicts, in order."""
    while shown < len(planned) and shown in verdicts:
        bar.print(ledger.outcome(planned[shown][2], verdicts[shown]).line())
        shown += 1
    return shown
