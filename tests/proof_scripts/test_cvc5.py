"""cvc5 as the second SMT decider: it decides z3's own SMT-LIB2 text, agreement is recorded,
a disagreement is DISAGREED (never PROVED), and without cvc5 one decider is reported."""

from __future__ import annotations

import pytest

from exactattn.proofs import agreement, certificate
from exactattn.proofs.engine import cvc5_decider, deciders, ledger, solver
from exactattn.proofs.families import decider_mutants, mutants, smt
from tests.optional import requires

requires("z3")
requires("cvc5")
import z3


def _prove(claim, hypotheses=()):
    def check():
        solver.prove("claim", claim, hypotheses)

    return ledger.check(ledger.Obligation("t", "claim", "-", check))


def test_cvc5_decides_the_text_z3_writes():
    x, y = z3.Ints("x y")
    s = z3.Solver()
    s.add(x >= 0, y == x / 3, z3.Not(y <= x))
    assert cvc5_decider.decide(s.to_smt2(), 10_000).word == "unsat"
    s = z3.Solver()
    s.add(x >= 0, z3.Not(x / 3 >= 1))
    assert cvc5_decider.decide(s.to_smt2(), 10_000).word == "sat"


def test_a_quantified_query_is_decided_by_cvc5_too():
    f = z3.Function("f", z3.IntSort(), z3.IntSort())
    x, a = z3.Ints("x a")
    verdict = _prove(f(a) >= 0, [z3.ForAll([x], f(x) >= 0)])
    assert verdict.status == ledger.PROVED
    assert verdict.deciders == ((deciders.SMT, 1),)


def test_a_refutation_is_confirmed_by_cvc5_with_z3s_model():
    f = z3.Function("f", z3.IntSort(), z3.IntSort())
    x, a = z3.Ints("x a")
    verdict = _prove(f(a) >= 1, [z3.ForAll([x], f(x) >= 0)])
    assert verdict.status == ledger.REFUTED
    assert verdict.deciders == ((deciders.SMT, 1),)


def test_a_crash_or_a_garbled_text_is_unknown_never_unsat():
    answer = cvc5_decider.decide("(assert (= x", 1000)
    assert answer.word == "unknown" and "cvc5 raised" in answer.reason


def test_disagreement_is_never_proved(monkeypatch):
    x = z3.Int("x")
    monkeypatch.setattr(cvc5_decider, "decide", lambda text, ms: cvc5_decider.Answer("sat"))
    verdict = _prove(x * x >= 0)
    assert verdict.status == ledger.DISAGREED
    assert "z3 answered unsat, cvc5 answered sat" in verdict.detail


def test_unknown_or_missing_cvc5_leaves_one_decider_with_the_reason(monkeypatch):
    x = z3.Int("x")
    monkeypatch.setattr(
        cvc5_decider, "decide", lambda text, ms: cvc5_decider.Answer("unknown", "timeout")
    )
    verdict = _prove(x * x >= 0)
    assert verdict.status == ledger.PROVED
    assert verdict.deciders == (("smt: z3 only (cvc5 answered unknown (timeout))", 1),)

    def missing():
        raise cvc5_decider.Missing(f"cvc5 is not installed: {cvc5_decider.INSTALL}")

    monkeypatch.setattr(cvc5_decider, "decide", lambda text, ms: missing())
    ob = ledger.Obligation("t", "x² ≥ 0", "-", lambda: solver.prove("x² ≥ 0", x * x >= 0))
    outcome = ledger.outcome(ob, ledger.check(ob))
    assert outcome.status == ledger.PROVED
    ((label, _),) = outcome.deciders
    assert "z3 only" in label and "exactattn[proofs]" in label  # names the extra
    assert "by one decider: 1 z3's `unsat` alone" in agreement.line([outcome])


def test_a_z3_timeout_is_unknown(monkeypatch):
    x = z3.Int("x")
    monkeypatch.setattr(solver, "z3_check", lambda s: z3.unknown)
    assert _prove(x * x >= 0).status == ledger.UNKNOWN


def test_an_infeasible_branch_is_dropped_only_when_cvc5_agrees(monkeypatch):
    paths = solver.Paths([])
    a = paths.symbol("a")
    monkeypatch.setattr(cvc5_decider, "decide", lambda text, ms: cvc5_decider.Answer("sat"))
    with pytest.raises(deciders.Disagreement):
        paths.explore(lambda: (a < 0) and (a > 0))


@pytest.mark.parametrize("mutant", decider_mutants.MUTANTS[:2], ids=lambda m: m.caught_by)
def test_one_solvers_bug_is_caught_by_the_other(mutant):
    """The library broken *and* one solver broken to accept it: DISAGREED by the other."""
    probe = next(o for o in smt.obligations() if "window_tile_kind" in o.name)
    with mutants.BY_NAME["window_tile_kind: FULL one key too wide"].applied():
        alone = ledger.check(probe)  # the library's bug alone: refuted by both
    assert alone.status == ledger.REFUTED and {label for label, _ in alone.deciders} == {
        deciders.SMT
    }
    with mutant.applied():
        verdict = ledger.check(probe)
    assert verdict.status == ledger.DISAGREED, verdict
    assert "z3 answered" in verdict.detail and "cvc5 answered" in verdict.detail


def test_the_certificate_lists_the_deciders_of_each_obligation():
    outcomes = [ledger.outcome(ob, ledger.check(ob)) for ob in smt.obligations()[:2]]
    text = certificate.certificate(outcomes, 1.0, {}, "exactattn prove smt")
    assert "## Agreement of the deciders" in text
    assert "| smt | 2 |" in text.replace(" 2 | 2 |", " 2 |")
    assert "smt: z3 + cvc5 ×" in text
    assert "a PROVED needs z3's and cvc5's `unsat` alike" in text
    assert "z3's `unsat` alone" not in text
    assert "2^-64" in text
