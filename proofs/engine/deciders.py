"""Which deciders judged an obligation's comparisons: every verdict decided twice.

Each comparison an obligation makes is decided by two methods that share no code:

* an SMT query (``hypotheses ∧ ¬claim`` unsatisfiable, or a branch infeasible) by **z3**
  and by **cvc5**, the second reading the SMT-LIB2 text z3 serialises from the very
  assertions it decided (:mod:`.solver`, :mod:`.cvc5_decider`);
* an algebraic identity ``lhs = rhs`` by **sympy's zero test** (:mod:`.zero_test`, a
  polynomial identity over ℚ) and by **exact evaluation** of the two sides' normal form at
  random rational points with python-flint's ``fmpq`` (:mod:`.point_test`);
* the specification's derivatives (the rules of :class:`.symbolic_spec.Derivatives`) by
  those rules and by **forward-mode dual numbers** over ``fmpq`` (:mod:`.dual`).

While :func:`~.ledger.check` runs an obligation it collects here, per kind of comparison,
how many were decided by both, and how many by one decider only with the reason (the second
is not installed, or answered ``unknown``). Two answers that differ are a
:class:`Disagreement`: an error naming the comparison and both answers, never PROVED.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

SMT = "smt: z3 + cvc5"
IDENTITY = "identity: zero test + fmpq points"
DERIVATIVE = "derivative: rules + dual numbers"
SIGN = "sign"  # ``e ≤ 0`` by sympy's sign rules (the overflow family): no second decider yet
BOTH = (SMT, IDENTITY, DERIVATIVE)
ONE = {SMT: "smt: z3 only", IDENTITY: "identity: zero test only",
       DERIVATIVE: "derivative: rules only", SIGN: "sign: sympy's sign rules only"}  # fmt: skip


class Disagreement(Exception):
    """Two deciders answered differently: neither answer is taken, the check fails."""


_tally: Counter[str] | None = None


@contextmanager
def collecting() -> Iterator[Counter[str]]:
    """Collect the records of the comparisons made inside the block (one obligation)."""
    global _tally
    outer, _tally = _tally, Counter()  # a check inside a check (a mutant's probe) apart
    try:
        yield _tally
    finally:
        _tally = outer


def both(kind: str, count: int = 1) -> None:
    """``count`` comparisons of ``kind`` (one of :data:`BOTH`) decided alike by both."""
    if _tally is not None:
        _tally[kind] += count


def one(kind: str, reason: str, count: int = 1) -> None:
    """``count`` comparisons of ``kind`` decided by the first decider only, and why."""
    if _tally is not None:
        _tally[f"{ONE[kind]} ({reason})"] += count


def add(record: tuple[tuple[str, int], ...]) -> None:
    """Count another check's record here (a mutant's: that of the probe that killed it)."""
    if _tally is not None:
        for label, count in record:
            _tally[label] += count


def single(entries: Iterator[tuple[str, int]] | tuple[tuple[str, int], ...]) -> int:
    """How many comparisons of a record (``(label, count)`` pairs) had one decider."""
    return sum(count for label, count in entries if label not in BOTH)
