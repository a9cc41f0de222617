"""Obligations, their verdicts, the one-line-per-obligation log and the markdown certificate.

An *obligation* is a named claim with the sizes it covers and a function that checks it.
The function runs the library's code over :class:`exactattn.SympyContext` and calls
:func:`check_equal` / :func:`check_nonpositive` on what the code returned; the first
failing comparison stops it. Verdicts:

* ``PROVED``   every comparison passed the symbolic test (:mod:`exactattn.proofs.engine.zero_test`);
* ``REFUTED``  a comparison failed and a concrete counterexample was found
(:mod:`exactattn.proofs.engine.counterexamples`);
* ``UNDECIDED`` a comparison was not proved but no counterexample was found, or the
  expression left the decidable fragment — counted as a failure;
* ``DISAGREED`` two deciders of one comparison answered differently (z3 and cvc5, the zero
  test and the evaluation at a random point, the rules of calculus and dual numbers:
  :mod:`.deciders`) — counted as a failure, never PROVED;
* ``UNKNOWN``  the SMT solver answered ``unknown`` or ran out of its time limit — neither
  proved nor refuted, counted as a failure (never PROVED);
* ``FAILED``   the code under test (or the check) raised an exception: recorded with the
  exception, never a crash of the run — counted as a failure;
* ``SKIPPED``  the check needs an optional package that is not installed (the reason names
  the extra): neither proved nor a failure — the certificate says what was not checked;
* ``TIMEOUT``  no verdict within the run's per-obligation limit (``exactattn prove
  --timeout``) — counted as a failure;
* ``LOST``     the process running it died, or it could not run there (the detail says
  why) — counted as a failure.

A *mutant* obligation (``expect_refuted=True``) runs the same check on a deliberately
broken variant of one step; it passes when the check does not prove (a TIMEOUT or LOST
mutant was not judged, so it does not pass).

:func:`check` reaches one obligation's :class:`Verdict` (what travels back from a worker
process; :func:`outcome` puts it with its obligation again), :func:`run` checks a list in
turn. ``exactattn prove`` spreads the checks over processes or a cluster
(:mod:`exactattn.proofs.proof_run`).
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import sympy

from . import counterexamples, deciders, point_test, zero_test
from .coverage_matrix import Coverage

PROVED, REFUTED, UNDECIDED, FAILED = "PROVED", "REFUTED", "UNDECIDED", "FAILED"
UNKNOWN = "UNKNOWN"  # the solver gave up (``unknown``, its timeout)
DISAGREED = "DISAGREED"  # two deciders of one comparison gave different answers
SKIPPED = "SKIPPED"
NO_TARGET = "NO TARGET"  # a mutant whose target is missing from the library
TIMEOUT, LOST = "TIMEOUT", "LOST"
NOT_JUDGED = (NO_TARGET, TIMEOUT, LOST, UNKNOWN)  # no verdict on the claim: never ok


class Refuted(Exception):
    def __init__(self, counterexample: counterexamples.Counterexample):
        super().__init__(counterexample.short())
        self.counterexample = counterexample


class Undecided(Exception):
    pass


class Unknown(Exception):
    """The solver answered ``unknown`` (or hit its time limit): no verdict either way."""


class Skipped(Exception):
    """The check needs an optional package that is missing (the message names the extra)."""


class NoTarget(Exception):
    """A mutant's target does not exist in the library (renamed?): neither killed nor run."""


class Killed(Exception):
    """A mutant's probe did not prove, without a counterexample (UNDECIDED or FAILED)."""

    def __init__(self, status: str, detail: str):
        super().__init__(detail)
        self.status = status


@dataclass(frozen=True)
class Obligation:
    family: str
    name: str
    sizes: str
    check: Callable[[], Any]
    expect_refuted: bool = False
    coverage: tuple[Coverage, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """What checking one obligation found (picklable: it comes back from workers)."""

    status: str
    seconds: float
    detail: str = ""
    counterexample: counterexamples.Counterexample | None = None
    deciders: tuple[tuple[str, int], ...] = ()  # (kind and who decided, comparisons)


@dataclass
class Outcome:
    obligation: Obligation
    status: str
    seconds: float
    detail: str = ""
    counterexample: counterexamples.Counterexample | None = field(default=None, repr=False)
    deciders: tuple[tuple[str, int], ...] = ()

    @property
    def ok(self) -> bool:
        """PROVED (or SKIPPED); for a mutant, judged and not PROVED (it was killed)."""
        if self.status == SKIPPED:
            return True
        if self.obligation.expect_refuted:
            return self.status not in (PROVED, *NOT_JUDGED)
        return self.status == PROVED

    @property
    def verdict(self) -> Verdict:
        return Verdict(self.status, self.seconds, self.detail, self.counterexample, self.deciders)

    def line(self) -> str:
        ob = self.obligation
        verdict = self.status
        if ob.expect_refuted and self.status != SKIPPED:
            verdict += " (mutant killed)" if self.ok else " (MUTANT NOT KILLED)"
        text = f"{ob.family:<9} {ob.name:<58} {ob.sizes:<28} {self.seconds:7.2f}s  {verdict}"
        if self.counterexample is not None:
            text += f"\n{'':<12}counterexample: {self.counterexample.short()}"
        elif self.detail and self.status != PROVED:
            text += f"\n{'':<12}{self.detail}"
        return text


# --- comparisons ---------------------------------------------------------------------------
def check_equal(what: str, lhs: Any, rhs: Any) -> None:
    """Prove ``lhs = rhs`` (scalars or same-shape arrays); raise Refuted/Undecided if not."""
    lhs_a, rhs_a = np.asarray(lhs, dtype=object), np.asarray(rhs, dtype=object)
    if lhs_a.shape != rhs_a.shape:
        raise Undecided(f"{what}: shapes differ, {lhs_a.shape} vs {rhs_a.shape}")
    try:
        index = zero_test.first_difference(lhs_a, rhs_a)
        if index is None:
            _second_opinion(what, lhs_a, rhs_a)
            return
        reason = "the zero test did not reduce lhs − rhs to 0"
        suspects = [index]
        _second_opinion(what, lhs_a[index], rhs_a[index], proved=False)
    except zero_test.Unsupported as err:
        reason = str(err)
        suspects = list(np.ndindex(lhs_a.shape))
    for index in suspects:
        a, b = lhs_a[index], rhs_a[index]
        label = f"{what}{list(index) if index else ''}"
        found = counterexamples.find_counterexample(label, a, b)
        if found is not None:
            raise Refuted(found)
    label = f"{what}{list(suspects[0]) if suspects[0] else ''}"
    raise Undecided(f"{label}: not proved ({reason}) and no counterexample found")


def _second_opinion(what: str, lhs: Any, rhs: Any, proved: bool = True) -> None:
    """Decide ``lhs = rhs`` again by exact evaluation at a random point
    (:mod:`.point_test`), after the zero test proved it (``proved``) or found the first
    entry it did not prove (then ``lhs``, ``rhs`` are that entry). Equal answers are
    recorded as decided by both; an expression outside the evaluation's fragment, or no
    python-flint, leaves one decider (recorded with the reason); different answers raise
    :class:`~.deciders.Disagreement`."""
    indices, pairs = point_test.pairs_of(lhs, rhs)
    count = max(len(pairs), 1)
    if not point_test.available():
        deciders.one(deciders.IDENTITY, f"fmpq points need python-flint: {install_flint()}", count)
        return
    if not pairs:  # the same trees on both sides: equal for either decider
        deciders.both(deciders.IDENTITY, 1)
        return
    try:
        decision = point_test.decide(pairs)
    except point_test.Unsupported as err:
        deciders.one(deciders.IDENTITY, f"not evaluated: {err}", count)
        return
    if proved and decision.different:
        k = decision.different[0]
        at = list(indices[k]) if indices[k] else ""
        raise deciders.Disagreement(
            f"{what}{at}: the zero test proved lhs = rhs; at a random point (seed "
            f"{decision.seed}) lhs = {decision.values[0][0]}, rhs = {decision.values[0][1]}"
        )
    if not proved and not decision.different:
        raise deciders.Disagreement(
            f"{what}: the zero test did not prove lhs = rhs; at a random point (seed "
            f"{decision.seed}) both sides are equal ({decision.bound})"
        )
    deciders.both(deciders.IDENTITY, count)


def install_flint() -> str:
    from exactattn.infra.optional import install_hint

    return install_hint("flint")


def check_nonpositive(what: str, expr: Any) -> None:
    """Prove ``expr ≤ 0`` from sympy's sign rules (−∞ counts); raise if not."""
    expr = sympy.sympify(expr)
    if expr == sympy.S.NegativeInfinity or expr.is_nonpositive:
        deciders.one(deciders.SIGN, "no second decider for an inequality")
        return
    found = counterexamples.find_positive(what, expr)
    if found is not None:
        raise Refuted(found)
    raise Undecided(f"{what}: {expr} ≤ 0 not proved and no counterexample found")


# --- running -------------------------------------------------------------------------------
class TimedOut(BaseException):
    """Raised into a check that overran its limit; a BaseException, so that no ``except
    Exception`` in the code under test (or in a mutant's probes) can take it for a verdict."""


def check(ob: Obligation, timeout: float | None = None) -> Verdict:
    """Check one obligation (within ``timeout`` seconds, if given) and say what was found."""
    start = time.perf_counter()
    with deciders.collecting() as tally:
        found = _verdict(ob, timeout)
    seconds = time.perf_counter() - start
    by = tuple(sorted(tally.items()))
    return Verdict(found.status, seconds, found.detail, found.counterexample, by)


def _verdict(ob: Obligation, timeout: float | None) -> Verdict:
    try:
        note = _within(timeout, ob.check)
        found = Verdict(PROVED, 0.0, detail=note or "")
    except TimedOut:
        found = Verdict(TIMEOUT, 0.0, f"no verdict within {timeout:g} s (--timeout)")
    except Refuted as err:
        found = Verdict(REFUTED, 0.0, counterexample=err.counterexample)
    except Unknown as err:
        found = Verdict(UNKNOWN, 0.0, detail=str(err))
    except deciders.Disagreement as err:
        found = Verdict(DISAGREED, 0.0, detail=str(err))
    except Killed as err:
        found = Verdict(err.status, 0.0, detail=str(err))
    except NoTarget as err:
        found = Verdict(NO_TARGET, 0.0, detail=str(err))
    except Skipped as err:
        found = Verdict(SKIPPED, 0.0, detail=str(err))
    except (Undecided, zero_test.Unsupported) as err:
        found = Verdict(UNDECIDED, 0.0, detail=str(err))
    except Exception as err:  # the code under test raised: a verdict, not a crash
        found = Verdict(FAILED, 0.0, detail=_exception_text(err))
    return found


def outcome(ob: Obligation, verdict: Verdict) -> Outcome:
    return Outcome(
        ob, verdict.status, verdict.seconds, verdict.detail, verdict.counterexample,
        getattr(verdict, "deciders", ()),
    )  # fmt: skip


def run(
    obligations: Iterable[Obligation],
    stream: TextIO | str | None = "stdout",
    timeout: float | None = None,
) -> list[Outcome]:
    """Check each obligation in turn, printing its line to ``stream`` (None: silent)."""
    if stream == "stdout":
        stream = sys.stdout
    outcomes = []
    for ob in obligations:
        done = outcome(ob, check(ob, timeout))
        outcomes.append(done)
        if stream is not None:
            print(done.line(), file=stream, flush=True)
    return outcomes


def _within(seconds: float | None, fn: Callable[[], Any]) -> Any:
    """``fn()``, interrupted by :class:`TimedOut` after ``seconds``.

    A timer thread raises the exception in this thread (CPython's
    ``PyThreadState_SetAsyncExc``), so the limit works in any thread — the main one, a
    worker process's, a Dask worker's. It takes effect at the next Python bytecode: a long
    call into C (z3 has its own limit) is interrupted when it returns.
    """
    if seconds is None:
        return fn()
    target = threading.get_ident()
    lock = threading.Lock()
    running = [True]

    def interrupt() -> None:
        with lock:
            if running[0]:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(target), ctypes.py_object(TimedOut)
                )

    timer = threading.Timer(seconds, interrupt)
    timer.daemon = True
    timer.start()
    try:
        return fn()
    finally:
        with lock:
            running[0] = False
        timer.cancel()


def _exception_text(err: Exception) -> str:
    """``Type: message`` and where it was raised (the innermost frame)."""
    frame = traceback.extract_tb(err.__traceback__)[-1] if err.__traceback__ else None
    where = f" (at {Path(frame.filename).name}:{frame.lineno} in {frame.name})" if frame else ""
    return f"{type(err).__name__}: {err}{where}"


def summary(outcomes: list[Outcome], seconds: float) -> str:
    failed = [o for o in outcomes if not o.ok]
    proved = sum(o.status == PROVED for o in outcomes if not o.obligation.expect_refuted)
    mutants = [o for o in outcomes if o.obligation.expect_refuted]
    killed = sum(o.ok and o.status != SKIPPED for o in mutants)
    skipped = sum(o.status == SKIPPED for o in outcomes)
    verdict = "ALL OK" if not failed else f"{len(failed)} FAILED"
    return (
        f"{len(outcomes)} obligations: {proved} proved, {killed}/{len(mutants)} mutants "
        f"killed{f', {skipped} skipped' if skipped else ''}, in {seconds:.1f}s — {verdict}"
    )
