"""The specification's derivative (:class:`exactattn.proofs.engine.symbolic_spec.Derivatives`)
against ``sympy.diff``, and a wrong rule caught by the reverse proofs."""

from __future__ import annotations

import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from exactattn.proofs.engine import ledger, symbolic_spec, zero_test
from exactattn.proofs.families import reverse

X, Y, Z = (sympy.Symbol(n, real=True) for n in "xyz")
CAP = sympy.Symbol("cap", positive=True)


@st.composite
def polynomials(draw, depth: int = 2):
    if depth == 0 or draw(st.booleans()):
        return draw(st.sampled_from([X, Y, Z, CAP, sympy.Rational(draw(st.integers(-3, 3)), 2)]))
    a, b = draw(polynomials(depth - 1)), draw(polynomials(depth - 1))
    return draw(st.sampled_from([a + b, a * b, a - b]))


@st.composite
def expressions(draw, depth: int = 3):
    """What the specification differentiates: sums and products of polynomials, e^u, tanh u,
    integer powers and logs of positive values (1 + e^u)."""
    if depth == 0 or draw(st.booleans()):
        return draw(polynomials())
    a, b, u = draw(expressions(depth - 1)), draw(expressions(depth - 1)), draw(polynomials())
    return draw(
        st.sampled_from(
            [a + b, a * b, a * sympy.exp(u), a / (1 + sympy.exp(u)), CAP * sympy.tanh(u / CAP),
             sympy.log(1 + sympy.exp(u)) * b, (a + b) ** 3]
        )
    )  # fmt: skip


@settings(max_examples=120, deadline=None)
@given(expressions(), st.sampled_from([X, Y, Z, CAP]))
def test_the_rules_give_sympys_derivative(expr, x):
    assert zero_test.equal(symbolic_spec.Derivatives()(expr, x), sympy.diff(expr, x))


def test_a_wrong_product_rule_is_caught_by_the_reverse_proofs(monkeypatch):
    """A product rule that drops the last factor's term: the specification's gradient is
    then wrong, and the reverse obligation refutes the library against it."""

    def obligation():  # built afresh: a problem keeps the gradients it computed
        return next(
            o for o in reverse.obligations(2) if "symbolic c" in o.name and "n_q=3" in o.sizes
        )

    assert ledger.check(obligation()).status == ledger.PROVED
    rule = symbolic_spec.Derivatives._rule

    def drops_a_term(self, e, x):
        if e.is_Mul and self(e.args[-1], x) != 0:
            return rule(self, e.func(*e.args[:-1], evaluate=False), x) * e.args[-1]
        return rule(self, e, x)

    monkeypatch.setattr(symbolic_spec.Derivatives, "_rule", drops_a_term)
    assert ledger.check(obligation()).status == ledger.REFUTED
