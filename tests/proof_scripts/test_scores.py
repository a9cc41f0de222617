"""Score modification in the proofs: tanh in the zero test, the scores family, its mutants,
and the certificate's rows for bias and soft-cap."""

from __future__ import annotations

import sympy

from exactattn.proofs import certificate
from exactattn.proofs.engine import coverage_matrix, ledger, zero_test
from exactattn.proofs.families import general, mutants, score_mods

X, Y = sympy.symbols("x y", real=True)
T = sympy.tanh(X)


def test_zero_test_reads_tanh_through_exp():
    assert zero_test.equal(T, (sympy.exp(2 * X) - 1) / (sympy.exp(2 * X) + 1))
    assert zero_test.equal(sympy.diff(T, X), 1 - T**2)
    assert zero_test.equal(sympy.tanh(2 * X), 2 * T / (1 + T**2))
    assert zero_test.equal(sympy.exp(3 * T + Y) * sympy.exp(-Y), sympy.exp(3 * T))


def test_zero_test_rejects_false_tanh_identities():
    assert not zero_test.equal(T, sympy.tanh(Y))
    assert not zero_test.equal(2 * T, sympy.tanh(2 * X))
    assert not zero_test.equal(sympy.diff(T, X), 1 + T**2)
    assert not zero_test.equal(sympy.exp(T), sympy.exp(sympy.tanh(2 * X)))


def _one(name: str, direction: str) -> ledger.Obligation:
    case = score_mods.BY_NAME[name]
    return score_mods.forward(case) if direction == "forward" else score_mods.reverse(case)


WINDOW = "softcap then bias, window(1, 0) bottom-right, n_q = n_k − 1"


def test_softcap_then_bias_under_a_window_is_proved_forward_and_reverse():
    outcomes = ledger.run([_one(WINDOW, "forward"), _one(WINDOW, "reverse")], stream=None)
    assert [o.status for o in outcomes] == [ledger.PROVED] * 2, [o.detail for o in outcomes]


def _killed_by(mutant: str, obligation: ledger.Obligation) -> ledger.Outcome:
    with mutants.BY_NAME[mutant].applied():
        (outcome,) = ledger.run([obligation], stream=None)
    return outcome


def test_softcap_after_the_bias_is_refuted_by_the_forward():
    outcome = _killed_by("chain: softcap applied after the bias", _one(WINDOW, "forward"))
    assert outcome.status == ledger.REFUTED and "tiled Y" in outcome.counterexample.what


def test_the_softcap_derivative_and_the_pullback_order_are_refuted_by_the_reverse():
    outcome = _killed_by(
        "chain pullback: forward order (dB gets the softcap factor)", _one(WINDOW, "reverse")
    )
    assert outcome.status == ledger.REFUTED and "dB" in outcome.counterexample.what
    outcome = _killed_by("softcap pullback: the factor 1 − tanh² dropped", _one(WINDOW, "reverse"))
    assert outcome.status == ledger.REFUTED


def test_a_broadcast_bias_gradient_must_be_summed():
    rows = "softcap then a bias broadcast over the rows (1, n_k), causal"
    outcome = _killed_by(
        "bias pullback: a broadcast bias's dB takes one entry, not the sum",
        _one(rows, "reverse"),
    )
    assert outcome.status == ledger.REFUTED and "dB" in outcome.counterexample.what


def test_lemma_s_is_proved_and_refutes_a_dropped_softcap_factor():
    (lemma,) = [o for o in general.obligations() if "Lemma S" in o.name]
    assert ledger.run([lemma], stream=None)[0].status == ledger.PROVED
    outcome = _killed_by("softcap pullback: the factor 1 − tanh² dropped", lemma)
    assert outcome.status == ledger.REFUTED


def test_the_coverage_matrix_has_rows_for_bias_and_softcap():
    covered = [c for case in score_mods.CASES for c in case.coverage("forward")]
    covered += [coverage_matrix.Coverage("reverse", "causal", "top-left", 3)]
    lines = coverage_matrix.matrix(covered, lambda row: f"<{row}>")
    rows = {line.split(" | ")[0].lstrip("| ") for line in lines[2:]}
    assert {"none + bias", "causal + softcap", "window + softcap+bias", "causal"} <= rows
    assert any("<causal + softcap>" in line for line in lines)


def test_the_for_all_n_column_names_the_solver_and_the_lemmas():
    def outcome(family: str, name: str, status: str = ledger.PROVED) -> ledger.Outcome:
        return ledger.Outcome(ledger.Obligation(family, name, "", lambda: None), status, 0.0)

    from exactattn.proofs.families import smt

    proved = [outcome("smt", name) for name in smt.FOR_ALL_N["and"]]
    proved += [outcome("general", "Lemma S: softcap then bias"), outcome("general", "Lemma A")]
    cell = certificate._all_n(proved)
    assert "iterator ✓ (smt" in cell("and") and "arithmetic ✓" in cell("and")
    assert "bias (Lemma S) ✓" in cell("causal + bias")
    skipped = [outcome("smt", name, ledger.SKIPPED) for name in smt.FOR_ALL_N["and"]]
    assert "iterator not checked" in certificate._all_n(skipped)("and")
    failed = [*proved[:-1], outcome("smt", smt.LOOP[0], ledger.REFUTED)]
    assert "iterator ✗" in certificate._all_n(failed)("causal")
