"""The proofs' exact terms (:mod:`exactattn.proofs.engine.terms`): the values sympy builds, the
forms the zero test reads, and a wrong rule caught by the proofs themselves."""

from __future__ import annotations

import numpy as np
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from exactattn.proofs.engine import counterexamples, ledger, terms, zero_test
from exactattn.proofs.families import forward

X, Y, Z = (sympy.Symbol(n, real=True) for n in "xyz")
POSITIVE = sympy.Symbol("p", positive=True)
ATOMS = (X, Y, Z, POSITIVE)


def _both(op, *pairs):
    """``op`` on the terms and on the sympy expressions of ``pairs`` ((term, expr) each)."""
    return op(*(t for t, _ in pairs)), op(*(e for _, e in pairs))


@st.composite
def expressions(draw, depth: int = 4, polynomial: bool = False):
    """(term, sympy expression) built by the same operations; divisions and logs only of
    values that are positive by construction (1 + u²), exponents a polynomial minus logs,
    as the algorithm's are (the zero test's fragment: a log outside an exponent is an
    atom named by its argument's form, so two forms of one argument are two atoms)."""
    if depth == 0 or draw(st.booleans()):
        if draw(st.booleans()):
            value = sympy.Rational(draw(st.integers(-6, 6)), draw(st.integers(1, 4)))
        else:
            value = draw(st.sampled_from(ATOMS))
        return terms.as_term(value), value
    a = draw(expressions(depth - 1, polynomial))
    b = draw(expressions(depth - 1, polynomial))
    ops = ["+", "-", "*", "neg"] if polynomial else ["+", "-", "*", "/", "exp", "log", "pow"]
    op = draw(st.sampled_from(ops))
    if op == "+":
        return _both(lambda u, v: u + v, a, b)
    if op == "-":
        return _both(lambda u, v: u - v, a, b)
    if op == "*":
        return _both(lambda u, v: u * v, a, b)
    if op == "/":
        return _both(lambda u, v: u / (1 + v * v), a, b)
    if op == "exp":
        u = draw(expressions(depth - 1, polynomial=True))
        return terms.exp(u[0]), sympy.exp(u[1])
    if op == "log":  # as the algorithm's logs occur: lse = m + log ℓ inside e^{s − lse}
        u = draw(expressions(depth - 1, polynomial=True))
        functions = (terms.exp, sympy.exp), (terms.log, sympy.log)
        return _both(lambda e, ln, s, w: e(s - ln(1 + w * w)), *functions, u, a)
    if op == "pow":
        n = draw(st.integers(-2, 3))
        positive = _both(lambda u: 1 + u * u, a)
        return _both(lambda u: u**n, positive)
    return _both(lambda u: -u, a)


@settings(max_examples=150, deadline=None)
@given(expressions())
def test_a_term_is_the_value_sympy_builds(pair):
    term, expr = pair
    at = {X: sympy.Rational(3, 4), Y: sympy.Rational(-5, 4), Z: sympy.Integer(2)}
    at[POSITIVE] = sympy.Rational(1, 2)
    assert float(counterexamples.evaluate(term, at)) == pytest.approx(
        float(counterexamples.evaluate(expr, at)), rel=1e-12, abs=1e-12
    )


@settings(max_examples=80, deadline=None)
@given(expressions(depth=3))
def test_the_zero_test_proves_a_term_equal_to_sympys_expression(pair):
    term, expr = pair
    assert zero_test.equal(term, expr)


def test_an_exponent_reads_minus_log_l_as_a_term_of_its_own():
    """``e^{s − (m + log ℓ)}`` is ``e^{s−m}/ℓ`` to the zero test: the reverse's frozen lse."""
    s, m, l_ = (terms.as_term(v) for v in (X, Y, 1 + Z**2))
    shifted = terms.exp(s - (m + terms.log(l_)))
    assert zero_test.equal(shifted, sympy.exp(X - Y) / (1 + Z**2))


@pytest.mark.parametrize(
    ("built", "value"),
    [
        (lambda t: terms.NEG_INF + t, -sympy.oo),
        (lambda t: terms.exp(terms.NEG_INF - t), 0),
        (lambda t: 0 * t, 0),
        (lambda t: terms.exp(terms.log(1 + t * t)), 1 + X**2),
        (lambda t: terms.log(terms.ONE), 0),
        (lambda t: t - t, 0),
        (lambda t: (t * 3) / t, 3),
        (lambda t: terms.NEG_INF * t, -sympy.oo * X),  # no term rule: sympy decides
        (lambda t: terms.NEG_INF - terms.NEG_INF, sympy.nan),
        (lambda t: 2**t * t**0.5, 2**X * sympy.sqrt(X)),  # no term rule: sympy decides
    ],
    ids=[
        "-inf+t",
        "e^-inf",
        "0*t",
        "e^log u",
        "log 1",
        "t-t",
        "3t/t",
        "-inf*t",
        "-inf-(-inf)",
        "2^t*sqrt(t)",
    ],
)
def test_the_folding_rules(built, value):
    got = built(terms.as_term(X))
    assert sympy.sympify(got) == value


def test_floats_are_the_rationals_they_denote():
    assert terms.as_term(0.1) == sympy.Rational(0.1)
    assert terms.as_term(np.float32(0.25)).data == sympy.Rational(1, 4)


def test_the_context_rejects_a_complex_input_and_keeps_finiteness():
    ctx = terms.TermContext()
    with pytest.raises(TypeError, match="real"):
        ctx.asarray(np.array([X + sympy.I], dtype=object))
    entries = ctx.asarray(np.array([X, 1], dtype=object))
    assert ctx.all_finite(entries)
    assert not ctx.all_finite(np.array([entries[0], ctx.neg_inf], dtype=object))
    assert ctx.is_neg_inf(np.array([ctx.neg_inf, entries[0]], dtype=object)).tolist() == [
        True,
        False,
    ]


def test_l_is_positive_by_its_form_and_a_negated_one_is_not():
    ctx = terms.TermContext()
    l_ = ctx.exp(ctx.asarray(np.array([X, Y], dtype=object))).sum()
    assert ctx.nonpositive(np.array([l_, -l_, terms.ZERO], dtype=object)).tolist() == [
        False,
        True,
        True,
    ]


def test_a_wrong_term_rule_is_caught_by_the_forward_proofs(monkeypatch):
    """A power rule that reads ``t⁻¹`` as ``t⁻²``: the library's ``Y = z/ℓ`` is then built
    wrong, and the forward obligation refutes it."""
    ob = next(o for o in forward.obligations(2) if "symbolic c" in o.name and "n_q=3" in o.sizes)
    assert ledger.check(ob).status == ledger.PROVED
    original = terms.power.__wrapped__
    monkeypatch.setattr(terms, "_MEMO", {})
    monkeypatch.setattr(terms, "power", terms._memo(lambda t, n: original(t, n - (n < 0))))
    assert ledger.check(ob).status == ledger.REFUTED
