"""Obligations, their verdicts, the one-line-per-obligation log and the markdown certificate.

An *obligation* is a named claim with the sizes it covers and a function that checks it.
The function runs the library's code over :class:`exactattn.SympyContext` and calls
:func:`check_equal` / :func:`check_nonpositive` on what the code returned; the first
failing comparison stops it. Verdicts:

* ``PROVED``   every comparison passed the symbolic test (:mod:`.symbolic`);
* ``REFUTED``  a comparison failed and a concrete counterexample was found (:mod:`.numeric`);
* ``UNDECIDED`` a comparison was not proved but no counterexample was found, or the
  expression left the decidable fragment — counted as a failure.

A *mutant* obligation (``expect_refuted=True``) runs the same check on a deliberately
broken variant of one step; it passes only when REFUTED.
"""

from __future__ import annotations

import platform
import sys
import textwrap
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
import sympy

from . import numeric, symbolic

PROVED, REFUTED, UNDECIDED = "PROVED", "REFUTED", "UNDECIDED"


class Refuted(Exception):
    def __init__(self, counterexample: numeric.Counterexample):
        super().__init__(counterexample.short())
        self.counterexample = counterexample


class Undecided(Exception):
    pass


@dataclass(frozen=True)
class Obligation:
    family: str
    name: str
    sizes: str
    check: Callable[[], Any]
    expect_refuted: bool = False


@dataclass
class Outcome:
    obligation: Obligation
    status: str
    seconds: float
    detail: str = ""
    counterexample: numeric.Counterexample | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        wanted = REFUTED if self.obligation.expect_refuted else PROVED
        return self.status == wanted

    def line(self) -> str:
        ob = self.obligation
        verdict = self.status
        if ob.expect_refuted:
            verdict += " (mutant killed)" if self.ok else " (MUTANT SURVIVED)"
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
    for index in np.ndindex(lhs_a.shape):
        a, b = lhs_a[index], rhs_a[index]
        label = f"{what}{list(index) if index else ''}"
        try:
            if symbolic.equal(a, b):
                continue
            reason = "the zero test did not reduce lhs − rhs to 0"
        except symbolic.Unsupported as err:
            reason = str(err)
        found = numeric.find_counterexample(label, a, b)
        if found is not None:
            raise Refuted(found)
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
        except (Undecided, symbolic.Unsupported) as err:
            outcome = Outcome(ob, UNDECIDED, 0.0, detail=str(err))
        outcome.seconds = time.perf_counter() - start
        outcomes.append(outcome)
        if stream is not None:
            print(outcome.line(), file=stream, flush=True)
    return outcomes


def summary(outcomes: list[Outcome], seconds: float) -> str:
    failed = [o for o in outcomes if not o.ok]
    proved = sum(o.status == PROVED for o in outcomes if not o.obligation.expect_refuted)
    mutants = [o for o in outcomes if o.obligation.expect_refuted]
    killed = sum(o.ok for o in mutants)
    verdict = "ALL OK" if not failed else f"{len(failed)} FAILED"
    return (
        f"{len(outcomes)} obligations: {proved} proved, {killed}/{len(mutants)} mutants "
        f"refuted, in {seconds:.1f}s — {verdict}"
    )


def certificate(
    outcomes: list[Outcome], seconds: float, theorems: dict[str, str], command: str
) -> str:
    """A markdown certificate readable without the code: theorems, method, verdicts."""
    lines = [
        "# exactattn proof certificate",
        "",
        f"Command: `{command}`  ",
        f"Python {platform.python_version()}, sympy {sympy.__version__}, "
        f"numpy {np.__version__}, {platform.machine()}  ",
        f"Result: **{summary(outcomes, seconds)}**",
        "",
        "## Method",
        "",
        "Every obligation runs the library's own tiled code (`exactattn.algorithm`, through "
        "the public API where it can) over the exact sympy backend, with symbols as inputs, "
        "and compares what the code returned with the textbook formula (or with sympy's "
        "derivative of it).",
        "",
        textwrap.dedent("\n\n".join(symbolic.__doc__.split("\n\n")[1:4])).strip(),
        "",
        "A REFUTED verdict carries a concrete point (rational inputs) at which the two sides "
        "evaluate, in 30-digit mpmath arithmetic, to different numbers. Mutants are "
        "deliberately broken variants of one step of the algorithm, substituted into the "
        "same code path; each must be refuted.",
        "",
        "## Theorems",
        "",
    ]
    for family, text in theorems.items():
        lines += [f"### {family}", "", text.strip(), ""]
    lines += [
        "## Obligations",
        "",
        "| family | obligation | sizes | seconds | verdict |",
        "| --- | --- | --- | ---: | --- |",
    ]
    for o in outcomes:
        ob = o.obligation
        verdict = o.status + (" (mutant, expected)" if ob.expect_refuted and o.ok else "")
        if not o.ok:
            verdict = f"**{verdict} — FAILURE**"
        name = ob.name.replace("|", "\\|")
        lines.append(f"| {ob.family} | {name} | {ob.sizes} | {o.seconds:.2f} | {verdict} |")
    details = [o for o in outcomes if o.counterexample is not None or o.status == UNDECIDED]
    if details:
        lines += ["", "## Counterexamples and open items", ""]
        for o in details:
            text = o.counterexample.full() if o.counterexample is not None else o.detail
            lines.append(f"- **{o.obligation.family} / {o.obligation.name}** — {text}")
    return "\n".join(lines) + "\n"
