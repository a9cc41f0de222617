"""What the deciders agreed on: the run's line, the certificate's table and trusted base.

Every comparison an obligation makes is recorded (:mod:`.engine.deciders`) as decided by
both of its deciders or by one (with the reason). This module turns the records of a run
into the line printed after the summary, the agreement table of the certificate
(obligations per family, by decider) and the trusted base that remains: what the two
deciders of each kind share, and every kind that was decided by one decider only.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from .engine import deciders, point_test
from .engine.ledger import Outcome

KINDS = (deciders.SMT, deciders.IDENTITY, deciders.DERIVATIVE)

SHARED = {
    deciders.SMT: (
        "the SMT encoding, written once: the library's integer formulas run on z3's Python "
        "terms (`Z3Ops`, `Paths`) and z3's SMT-LIB2 printer (`to_smt2`), which cvc5 parses; "
        "a PROVED needs z3's and cvc5's `unsat` alike"
    ),
    deciders.IDENTITY: (
        "the expression trees both identity deciders read (the library's values as "
        "`proofs/engine/terms.py`'s rules build them — identities of real values — and the "
        "specification's), sympy's node types and structural equality (no simplification), "
        "the reading of exp, log and tanh as independent positive indeterminates (written "
        "twice: `zero_test.py`, `point_test.py`), and FLINT's exact rationals (the zero "
        "test's `fmpq_mpoly`, the evaluation's `fmpq`)"
    ),
    deciders.DERIVATIVE: (
        "the specification's values Y (the trees both the rules of calculus and the dual "
        "numbers differentiate) and `row_gradient`'s use of `sympy.fraction`"
    ),
}

ALONE = {
    deciders.SMT: "z3's `unsat` alone",
    deciders.IDENTITY: "sympy's zero test alone (`proofs/engine/zero_test.py`)",
    deciders.DERIVATIVE: "the rules of calculus of `spec.Derivatives` alone",
    deciders.SIGN: "sympy's sign rules (`check_nonpositive`, the overflow family)",
}


def kind_of(label: str) -> str:
    """The kind of comparison a record's label is about (:data:`deciders.BOTH` or SIGN)."""
    for kind in (*KINDS, deciders.SIGN):
        if label == kind or label.startswith(deciders.ONE[kind]):
            return kind
    raise ValueError(f"label must name a kind of comparison; got {label!r}")


def totals(outcomes: list[Outcome]) -> tuple[Counter, Counter, dict[str, str]]:
    """Comparisons decided by both and by one decider, per kind, with a reason for one."""
    two, one, why = Counter(), Counter(), {}
    for o in outcomes:
        for label, count in o.deciders:
            kind = kind_of(label)
            if label in KINDS:
                two[kind] += count
            else:
                one[kind] += count
                why.setdefault(kind, label.removeprefix(deciders.ONE[kind]).strip(" ()"))
    return two, one, why


def line(outcomes: list[Outcome]) -> str:
    """The line printed after the summary: who decided the comparisons."""
    two, one, why = totals(outcomes)
    parts = [f"{two[k]} {k.split(':')[0]} by {k.split(': ')[1]}" for k in KINDS if two[k]]
    singles = [f"{one[k]} {ALONE[k].split(' (')[0]} ({why[k]})" for k in (*KINDS, "sign")
               if one[k]]  # fmt: skip
    text = "decided twice: " + (", ".join(parts) or "nothing")
    return text + ("; by one decider: " + "; ".join(singles) if singles else "")


def table(outcomes: list[Outcome]) -> list[str]:
    """The agreement table: obligations per family, by decider (markdown)."""
    rows: dict[str, Counter] = defaultdict(Counter)
    for o in outcomes:
        family = o.obligation.family
        rows[family]["obligations"] += 1
        kinds = Counter()
        for label, count in o.deciders:
            kind = kind_of(label)
            kinds[(kind, label in KINDS)] += count
        if not kinds:
            rows[family]["no comparison recorded"] += 1
        for kind in (*KINDS, deciders.SIGN):
            if kinds[(kind, True)] and not kinds[(kind, False)]:
                rows[family][f"{kind}, both"] += 1
            elif kinds[(kind, False)]:
                rows[family][f"{kind}, one"] += 1
    heads = [
        "family", "obligations", "SMT: z3 + cvc5", "SMT: z3 only", "identity: both",
        "identity: zero test only", "derivative: both", "derivative: rules only",
        "sign: sympy only", "none recorded",
    ]  # fmt: skip
    keys = [
        "obligations", f"{deciders.SMT}, both", f"{deciders.SMT}, one",
        f"{deciders.IDENTITY}, both", f"{deciders.IDENTITY}, one",
        f"{deciders.DERIVATIVE}, both", f"{deciders.DERIVATIVE}, one",
        f"{deciders.SIGN}, one", "no comparison recorded",
    ]  # fmt: skip
    out = ["| " + " | ".join(heads) + " |", "| --- |" + " ---: |" * (len(heads) - 1)]
    for family, row in rows.items():
        out.append("| " + " | ".join([family, *(str(row[k]) for k in keys)]) + " |")
    return out


def trusted_base(outcomes: list[Outcome]) -> list[str]:
    """What the verdicts still rest on: per kind, what both deciders share, or the one
    decider where some comparison had only it."""
    two, one, why = totals(outcomes)
    out = []
    for kind in KINDS:
        if two[kind] or one[kind]:
            out.append(f"{kind.split(':')[0]}: {SHARED[kind]}")
        if one[kind]:
            out.append(f"{ALONE[kind]} for {one[kind]} comparisons ({why[kind]})")
        elif not two[kind]:  # nothing recorded (verdicts from elsewhere): assume one decider
            out.append(f"{ALONE[kind]} (no record of a second decider in these verdicts)")
    if one[deciders.SIGN]:
        out.append(f"{ALONE[deciders.SIGN]} for {one[deciders.SIGN]} inequalities (one decider)")
    return out


def method() -> str:
    """The certificate's paragraph on the second deciders and the probability bound."""
    return (
        "Every comparison is decided twice, by deciders that share no code. An SMT query "
        "(the negated claim under the hypotheses, and every branch the symbolic execution "
        "drops as infeasible) is serialised once as SMT-LIB2 by z3 and decided by z3 and by "
        "cvc5 from that text; for a counterexample cvc5 decides the text with z3's model "
        "as definitions (it confirms the model). An identity is decided by the zero test and "
        "by exact evaluation of both sides' normal form (exponentials as independent "
        "positive indeterminates, `proofs/engine/point_test.py`) with python-flint's fmpq "
        f"({point_test.backend_name()}): {point_test.method()}. The specification's "
        "gradients (the rules of calculus) are checked against forward-mode dual numbers "
        "over fmpq along a random direction, at one point drawn from {1..2^89}, the degree "
        "bound at most 2^24 (`proofs/engine/dual.py`). Two answers that differ are "
        "DISAGREED, a failure naming both; a decider that is not installed, or answers "
        "`unknown`, leaves one decider, listed with the reason."
    )
