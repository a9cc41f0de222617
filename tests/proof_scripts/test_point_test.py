"""The second identity decider (:mod:`exactattn.proofs.engine.point_test`): its normal form,
its bound, its agreement with the zero test, and a broken zero test caught by it."""

from __future__ import annotations

import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from exactattn.proofs.engine import deciders, ledger, point_test, zero_test
from tests.optional import requires

requires("flint")

X, Y, L = sympy.symbols("x y l", real=True)
EXP = lambda a: sympy.exp(a, evaluate=False)  # noqa: E731  (as the library's terms build it)


def _equal(a, b) -> bool:
    return not point_test.decide([(a, b)]).different


def test_the_normal_form_knows_the_rules_of_exponentials():
    assert _equal(EXP(X + Y), EXP(X) * EXP(Y))  # e^{a+b} = e^a e^b
    assert _equal(EXP(X + sympy.log(L)), L * EXP(X))  # e^{log ℓ} = ℓ
    assert _equal(EXP(X - 2 * sympy.log(L)), EXP(X) / L**2)
    assert _equal(EXP(X / 2) ** 2, EXP(X))  # one E per monomial, E = e^{x/2}
    assert _equal(sympy.tanh(X), (EXP(2 * X) - 1) / (EXP(2 * X) + 1))
    assert _equal(sympy.E * EXP(X), EXP(X + 1))


def test_false_identities_differ_at_the_point():
    for a, b in [
        (EXP(2 * X), EXP(X)),
        (EXP(X) + 1, EXP(X)),
        ((X + 1) ** 2, X**2 + 1),
        (EXP(X + sympy.log(L)), EXP(X) * L**2),
        (sympy.log(L), sympy.log(L**2)),  # each log u is its own indeterminate: stricter
    ]:
        assert not _equal(a, b), (a, b)


def _shortcut_equal(a, b) -> bool:
    """The unsound shortcut: each exponential an unknown of its own, named by the score it
    reads (E_ij for e^{s_ij}: the free symbols of its argument), not by its normal form."""
    names: dict = {}

    def unknowns(e):
        if isinstance(e, sympy.exp):
            key = frozenset(e.args[0].free_symbols)
            return names.setdefault(key, sympy.Symbol(f"E{len(names)}", positive=True))
        return e.func(*map(unknowns, e.args)) if e.args else e

    return sympy.expand(unknowns(a) - unknowns(b)) == 0


def test_the_shortcut_of_unrelated_unknowns_accepts_a_false_identity():
    a, b = EXP(2 * X), EXP(X)  # e^{2x} ≠ e^x (at x = 1: e² ≠ e)
    assert a.subs(X, 1).evalf() != b.subs(X, 1).evalf()
    assert _shortcut_equal(a, b)  # the shortcut proves it
    assert not _equal(a, b)  # the normal form does not
    assert not zero_test.equal(a, b)


def test_the_bound_is_below_two_to_the_minus_64():
    decision = point_test.decide([(EXP(3 * X) / (1 + EXP(X)) ** 2, EXP(X) * X**4)])
    assert decision.degree >= 1
    assert 2**decision.bits >= 2**65 * decision.degree  # (d/s)/(1 − q/s) < 2^-64
    assert "2^-64" in decision.bound


def test_outside_the_fragment_it_says_unsupported():
    for e in (sympy.sqrt(X), sympy.Float(0.5) * X, EXP(X * sympy.log(L)), sympy.Function("f")(X)):
        try:
            point_test.decide([(e, X)])
        except point_test.Unsupported:
            continue
        raise AssertionError(f"{e} was evaluated")


class _FirstTwoEqual:
    """A generator whose first two draws are equal (x = y, a pole of 1/(x − y)), then not."""

    def __init__(self, seed):
        self.calls = 0

    def getrandbits(self, bits):
        self.calls += 1
        return 5 if self.calls <= 2 else self.calls


def test_a_point_that_is_a_pole_is_drawn_again(monkeypatch):
    monkeypatch.setattr(point_test.random, "Random", _FirstTwoEqual)
    ratio = sympy.Mul(X - Y, sympy.Pow(X - Y, -1, evaluate=False), evaluate=False)
    point = point_test._Point(point_test.Normaliser(), _FirstTwoEqual(0), 8)
    try:
        point(ratio)
    except point_test.Pole:
        pass
    else:
        raise AssertionError("x = y is a pole of 1/(x − y)")
    assert point_test.decide([(ratio, sympy.S.One)], seed=1).different == ()


@st.composite
def exponential_expressions(draw, depth: int = 3):
    if depth == 0 or draw(st.booleans()):
        return draw(st.sampled_from([X, Y, L, sympy.Rational(draw(st.integers(-3, 3)), 2)]))
    a, b = draw(exponential_expressions(depth - 1)), draw(exponential_expressions(depth - 1))
    return draw(
        st.sampled_from([a + b, a * b, a - b, EXP(a + b), EXP(a) * EXP(-b), 1 / (1 + EXP(a))])
    )


@settings(max_examples=60, deadline=None)
@given(exponential_expressions(), exponential_expressions())
def test_it_agrees_with_the_zero_test(a, b):
    for rhs in (a, sympy.expand(a), a + b):
        expected = zero_test.equal(a, rhs)
        assert _equal(a, rhs) == expected, (a, rhs)


def test_check_equal_records_both_deciders():
    with deciders.collecting() as tally:
        ledger.check_equal("e^{x+y}", EXP(X + Y), EXP(X) * EXP(Y))
    assert tally == {deciders.IDENTITY: 1}


def test_a_broken_zero_test_is_caught_by_the_evaluation(monkeypatch):
    """A zero test that proves everything: check_equal is then DISAGREED, never PROVED."""
    monkeypatch.setattr(zero_test, "first_difference", lambda lhs, rhs: None)
    ob = ledger.Obligation(
        "t", "e^{2x} = e^x", "-", lambda: ledger.check_equal("e", EXP(2 * X), EXP(X))
    )
    verdict = ledger.check(ob)
    assert verdict.status == ledger.DISAGREED
    assert "the zero test proved lhs = rhs" in verdict.detail


def test_a_broken_evaluation_is_caught_by_the_zero_test(monkeypatch):
    """An evaluation that finds every difference zero: a false identity is DISAGREED."""
    real = point_test.decide
    monkeypatch.setattr(
        point_test, "decide", lambda pairs, seed=None: real([(a, a) for a, _ in pairs], seed)
    )
    ob = ledger.Obligation(
        "t", "e^{2x} = e^x", "-", lambda: ledger.check_equal("e", EXP(2 * X), EXP(X))
    )
    verdict = ledger.check(ob)
    assert verdict.status == ledger.DISAGREED
    assert "the zero test did not prove" in verdict.detail


def test_without_python_flint_one_decider_is_reported_and_the_extra_named(monkeypatch):
    from exactattn.proofs import agreement
    from exactattn.proofs.engine import dual
    from exactattn.proofs.families import general

    monkeypatch.setattr(point_test, "flint", None)
    monkeypatch.setattr(dual, "flint", None)
    outcomes = ledger.run(general.obligations(2)[:6], stream=None)
    assert all(o.status == ledger.PROVED for o in outcomes)
    labels = {label for o in outcomes for label, _ in o.deciders}
    assert deciders.IDENTITY not in labels and deciders.DERIVATIVE not in labels
    text = agreement.line(outcomes)
    assert "sympy's zero test alone" in text and "pip install 'exactattn[flint]'" in text
