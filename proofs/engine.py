"""Obligations, their verdicts, the one-line-per-obligation log and the markdown certificate.

An *obligation* is a named claim with the sizes it covers and a function that checks it.
The function runs the library's code over :class:`exactattn.SympyContext` and calls
:func:`check_equal` / :func:`check_nonpositive` on what the code returned; the first
failing comparison stops it. Verdicts:

* ``PROVED``   every comparison passed the symbolic test (:mod:`.symbolic`);
* ``REFUTED``  a comparison failed and a concrete counterexample was found (:mod:`.numeric`);
* ``UNDECIDED`` a comparison was not proved but no counterexample was found, or the
  expression left the decidable fragment — counted as a failure;
* ``FAILED``   the code under test (or the check) raised an exception: recorded with the
  exception, never a crash of the run — counted as a failure;
* ``SKIPPED``  the check needs an optional package that is not installed (the reason names
  the extra): neither proved nor a failure — the certificate says what was not checked.

A *mutant* obligation (``expect_refuted=True``) runs the same check on a deliberately
broken variant of one step; it passes only when REFUTED.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import sympy

from . import numeric, symbolic
from .coverage import Coverage

PROVED, REFUTED, UNDECIDED, FAILED = "PROVED", "REFUTED", "UNDECIDED", "FAILED"
SKIPPED = "SKIPPED"
NO_TARGET = "NO TARGET"  # a mutant whose target is missing from the library


class Refuted(Exception):
    def __init__(self, counterexample: numeric.Counterexample):
        super().__init__(counterexample.short())
        self.counterexample = counterexample


class Undecided(Exception):
    pass


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


@dataclass
class Outcome:
    obligation: Obligation
    status: str
    seconds: float
    detail: str = ""
    counterexample: numeric.Counterexample | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        """PROVED (or SKIPPED); for a mutant, anything but PROVED (it was killed)."""
        if self.status == SKIPPED:
            return True
        if self.obligation.expect_refuted:
            return self.status not in (PROVED, NO_TARGET)
        return self.status == PROVED

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
        index = symbolic.first_difference(lhs_a, rhs_a)
        if index is None:
            return
        reason = "the zero test did not reduce lhs − rhs to 0"
        suspects = [index]
    except symbolic.Unsupported as err:
        reason = str(err)
        suspects = list(np.ndindex(lhs_a.shape))
    for index in suspects:
        a, b = lhs_a[index], rhs_a[index]
        label = f"{what}{list(index) if index else ''}"
        found = numeric.find_counterexample(label, a, b)
        if found is not None:
            raise Refuted(found)
    label = f"{what}{list(suspects[0]) if suspects[0] else ''}"
    raise Undecided(f"{label}: not proved ({reason}) and no counterexample found")


def check_nonpositive(what: str, expr: Any) -> None:
    """Prove ``expr ≤ 0`` from sympy's sign rules (−∞ counts); raise if not."""
    expr = sympy.sympify(expr)
    if expr == sympy.S.NegativeInfinity or expr.is_nonpositive:
        return
    found = numeric.find_positive(what, expr)
    if found is not None:
        raise Refuted(found)
    raise Undecided(f"{what}: {expr} ≤ 0 not proved and no counterexample found")


# --- running -------------------------------------------------------------------------------
def run(obligations: Iterable[Obligation], stream: TextIO | str | None = "stdout") -> list[Outcome]:
    """Check each obligation in turn, printing its line to ``stream`` (None: silent)."""
    if stream == "stdout":
        stream = sys.stdout
    outcomes = []
    for ob in obligations:
        start = time.perf_counter()
        try:
            note = ob.check()
            outcome = Outcome(ob, PROVED, 0.0, detail=note or "")
        except Refuted as err:
            outcome = Outcome(ob, REFUTED, 0.0, counterexample=err.counterexample)
        except Killed as err:
            outcome = Outcome(ob, err.status, 0.0, detail=str(err))
        except NoTarget as err:
            outcome = Outcome(ob, NO_TARGET, 0.0, detail=str(err))
        except Skipped as err:
            outcome = Outcome(ob, SKIPPED, 0.0, detail=str(err))
        except (Undecided, symbolic.Unsupported) as err:
            outcome = Outcome(ob, UNDECIDED, 0.0, detail=str(err))
        except Exception as err:  # the code under test raised: a verdict, not a crash
            outcome = Outcome(ob, FAILED, 0.0, detail=_exception_text(err))
        outcome.seconds = time.perf_counter() - start
        outcomes.append(outcome)
        if stream is not None:
            print(outcome.line(), file=stream, flush=True)
    return outcomes


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
