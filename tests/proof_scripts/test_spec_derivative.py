"""The specification's derivative (:class:`exactattn.proofs.engine.symbolic_spec.Derivatives`)
against forward-mode dual numbers over fmpq (:mod:`exactattn.proofs.engine.dual`), a wrong
rule caught by them, and caught by the reverse proofs when they are off."""

from __future__ import annotations

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from exactattn.proofs.engine import deciders, dual, ledger, symbolic_spec
from exactattn.proofs.families import reverse
from tests.optional import requires

requires("flint")

X, Y, Z = (sympy.Symbol(n, real=True) for n in "xyz")
CAP = sympy.Symbol("cap", positive=True)
WRT = [X, Y, Z, CAP]


@st.composite
def polynomials(draw, depth: int = 2):
    if depth == 0 or draw(st.booleans()):
        return draw(st.sampled_from([X, Y, Z, CAP, sympy.Rational(draw(st.integers(-3, 3)), 2)]))
    a, b = draw(polynomials(depth - 1)), draw(polynomials(depth - 1))
    return draw(st.sampled_from([a + b, a * b, a - b]))


@st.composite
def expressions(draw, depth: int = 3):
    """What the specification differentiates: sums and products of polynomials, e^u, tanh u
    (also inside an exponent, as a soft-capped score), integer powers and logs of positive
    values (1 + e^u)."""
    if depth == 0 or draw(st.booleans()):
        return draw(polynomials())
    a, b, u = draw(expressions(depth - 1)), draw(expressions(depth - 1)), draw(polynomials())
    return draw(
        st.sampled_from(
            [a + b, a * b, a * sympy.exp(u), a / (1 + sympy.exp(u)), CAP * sympy.tanh(u / CAP),
             sympy.exp(CAP * sympy.tanh(u / CAP)) * b, sympy.log(1 + sympy.exp(u)) * b,
             (a + b) ** 3]
        )
    )  # fmt: skip


def _check(expr, rules=None) -> None:
    rules = rules or symbolic_spec.Derivatives()
    dual.check_gradient("e", [1], [expr], WRT, [rules(expr, x) for x in WRT])


@settings(max_examples=120, deadline=None)
@given(expressions())
def test_the_rules_agree_with_dual_numbers(expr):
    with deciders.collecting() as tally:
        _check(expr)
    assert set(tally) == {deciders.DERIVATIVE}, tally


RULE = symbolic_spec.Derivatives._rule


def wrong_tanh(self, e, x):
    """``(tanh u)' = (1 + tanh² u) u'``: the sign of the chain rule's factor flipped."""
    if isinstance(e, sympy.tanh):
        return (1 + e * e) * self(e.args[0], x)
    return RULE(self, e, x)


def drops_a_term(self, e, x):
    """A product rule without the last factor's term."""
    if e.is_Mul and self(e.args[-1], x) != 0:
        return RULE(self, e.func(*e.args[:-1], evaluate=False), x) * e.args[-1]
    return RULE(self, e, x)


class WrongTanh(symbolic_spec.Derivatives):
    _rule = wrong_tanh


class DropsATerm(symbolic_spec.Derivatives):
    _rule = drops_a_term


@pytest.mark.parametrize("rules", [WrongTanh, DropsATerm])
def test_a_wrong_rule_is_caught_by_dual_numbers(rules):
    expr = sympy.exp(CAP * sympy.tanh(X * Y / CAP)) * (X + Z) / (1 + sympy.exp(X * Z))
    _check(expr)
    with pytest.raises(deciders.Disagreement, match="dual numbers"):
        _check(expr, rules())


def _obligation():  # built afresh: a problem keeps the gradients it computed
    return next(o for o in reverse.obligations(2) if "symbolic c" in o.name and "n_q=3" in o.sizes)


def test_a_wrong_product_rule_is_caught_twice_in_the_reverse_proofs(monkeypatch):
    """A product rule that drops the last factor's term: dual numbers dissent (DISAGREED);
    with them off, the reverse obligation refutes the library against the wrong gradient."""
    assert ledger.check(_obligation()).status == ledger.PROVED
    monkeypatch.setattr(symbolic_spec.Derivatives, "_rule", drops_a_term)
    verdict = ledger.check(_obligation())
    assert verdict.status == ledger.DISAGREED, verdict
    monkeypatch.setattr(dual, "flint", None)  # one decider: the rules alone
    verdict = ledger.check(_obligation())
    assert verdict.status == ledger.REFUTED, verdict
    assert any("rules only" in label for label, _ in verdict.deciders)
