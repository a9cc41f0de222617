"""The proof families by name, and one run of them: the lines, the summary, the certificate.

``exactattn prove`` (:mod:`exactattn.commands.prove`) parses its arguments and calls
:func:`run`; a new family is a module with ``obligations(max_n)`` and one entry in
:data:`FAMILIES`.
"""

from __future__ import annotations

import time
from types import ModuleType

from . import (
    dropout,
    engine,
    forward,
    general,
    monoid,
    mutants,
    mutation,
    overflow,
    reach,
    reverse,
    scores,
    smt,
    tiles,
)
from . import program as program_family
from .certificate import certificate

FAMILIES: dict[str, ModuleType] = {
    "monoid": monoid,
    "forward": forward,
    "reverse": reverse,
    "scores": scores,
    "general": general,
    "overflow": overflow,
    "smt": smt,
    "tiles": tiles,
    "dropout": dropout,
    "mutants": mutants,
    "reach": reach,
}
NOT_BY_DEFAULT = ("reach",)
DEFAULT_MAX_N = 4


def default_families() -> list[str]:
    return [name for name in FAMILIES if name not in NOT_BY_DEFAULT]


def run(
    families: list[str],
    max_n: int = DEFAULT_MAX_N,
    report: str | None = None,
    mutation_tests: bool = False,
    command: str = "exactattn prove",
    program: program_family.Program | None = None,
) -> int:
    """Run ``families`` (names of :data:`FAMILIES`), or a user's ``program`` alone; 0 if
    every obligation is PROVED (or SKIPPED) and every mutant killed, else 1. ``report`` is a
    path for the certificate."""
    start = time.perf_counter()
    outcomes: list[engine.Outcome] = []
    if program is not None:
        families = [program_family.FAMILY]
        outcomes = engine.run(program_family.obligations_for(program, max_n))
    for name in families if program is None else []:
        done = engine.run(FAMILIES[name].obligations(max_n))
        mutants.remember(done)  # the unmutated verdicts the mutants family compares with
        outcomes += done
    tested = mutation.run_all() if mutation_tests else None
    seconds = time.perf_counter() - start
    print(engine.summary(outcomes, seconds))
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
