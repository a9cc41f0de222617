"""The paired mutants (a library bug and a decider bug that accepts it): each is caught by
the other decider, and would be PROVED with that decider missing."""

from __future__ import annotations

import pytest

from exactattn.proofs.engine import cvc5_decider, dual, ledger, point_test
from exactattn.proofs.families import decider_mutants, forward, score_mods, smt
from tests.optional import requires

requires("z3", "flint")
requires("cvc5")


def _probe(mutant):
    family, _, words = mutant.probes[0].partition("/")
    module = {"smt": smt, "forward": forward, "scores": score_mods}[family]
    return next(o for o in module.obligations(2 if family != "smt" else 4) if words in o.name)


def _no_cvc5(text, ms):
    raise cvc5_decider.Missing("cvc5 switched off by the test")


# (mutant, how the other decider is switched off, or None where it is the first decider)
CASES = [
    (decider_mutants.MUTANTS[0], lambda mp: mp.setattr(cvc5_decider, "decide", _no_cvc5)),
    (decider_mutants.MUTANTS[1], None),
    (decider_mutants.MUTANTS[2], lambda mp: mp.setattr(point_test, "flint", None)),
    (decider_mutants.MUTANTS[3], None),
    (decider_mutants.MUTANTS[4], lambda mp: mp.setattr(dual, "flint", None)),
    (decider_mutants.MUTANTS[5], None),
]


@pytest.mark.parametrize(("mutant", "switch_off"), CASES, ids=lambda c: getattr(c, "caught_by", ""))
def test_each_is_caught_by_the_other_decider(mutant, switch_off, monkeypatch):
    assert ledger.check(_probe(mutant)).status == ledger.PROVED  # the probe judges
    with mutant.applied():
        verdict = ledger.check(_probe(mutant))
    # both rule checkers broken alike: the library, correct, is refuted against the rules
    wanted = ledger.REFUTED if mutant is decider_mutants.MUTANTS[5] else ledger.DISAGREED
    assert verdict.status == wanted, verdict
    if switch_off is not None:
        switch_off(monkeypatch)
        with mutant.applied():
            alone = ledger.check(_probe(mutant))
        assert alone.status == ledger.PROVED, alone  # one decider's bug lets it through
