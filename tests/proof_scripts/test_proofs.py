"""The proof machinery: it proves true obligations, kills broken variants, reports, exits.

The proofs are imported as ``exactattn.proofs`` — the package the command runs — so that a
test's monkeypatch reaches what the command runs (``proofs`` from the checkout would be a
second copy of the same files).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sympy

from exactattn.commands import prove
from exactattn.proofs import mutation
from exactattn.proofs.engine import context, ledger, mask_grid, symbolic_spec, zero_test
from exactattn.proofs.families import forward, general, monoid, mutants, reverse, tiles

ROOT = Path(__file__).resolve().parents[2]
S, M = sympy.Symbol("s", real=True), sympy.Symbol("m", real=True)


# --- the zero test ------------------------------------------------------------------------
def test_zero_test_proves_the_shift_identity_and_rejects_a_false_one():
    assert zero_test.equal(sympy.exp(S - M) * sympy.exp(M), sympy.exp(S))
    assert zero_test.equal(sympy.exp(M + sympy.log(S**2 + 1)), sympy.exp(M) * (S**2 + 1))
    assert not zero_test.equal(sympy.exp(S - M), sympy.exp(S))


def test_zero_test_compares_constants_exactly():
    """e^{−1000} is not 0 (a numeric comparison would accept it): not proved, not refuted."""
    assert not zero_test.equal(sympy.exp(-1000), 0)
    assert not zero_test.equal(sympy.exp(1) * sympy.exp(1), sympy.exp(3))
    with pytest.raises(ledger.Undecided):
        ledger.check_equal("e^-1000 vs 0", sympy.exp(-1000), 0)
    with pytest.raises(zero_test.Unsupported, match="inexact"):
        zero_test.equal(sympy.Float(0.5) * S, S / 2)


def test_zero_test_indeterminates_cannot_collide_with_input_symbols():
    """The stand-ins for exponentials are not symbols: an input named w0 stays itself."""
    for name in ("w0", "w1", "v0", "E0"):
        w = sympy.Symbol(name, positive=True)
        assert not zero_test.equal(sympy.exp(S), w)
        assert not zero_test.equal(sympy.exp(S) * w, w**2)


def test_zero_test_without_python_flint_uses_the_sympy_ring(monkeypatch):
    monkeypatch.setattr(zero_test, "flint", None)
    assert zero_test.backend_name() == "sympy sparse ring"
    x = sympy.exp(S) / (sympy.exp(S) + sympy.exp(M))
    assert zero_test.equal(x, 1 / (1 + sympy.exp(M - S)))
    assert not zero_test.equal(x, 1 / (1 + sympy.exp(S - M)))
    assert not zero_test.equal(sympy.exp(-1000), 0)


# --- the proofs' context --------------------------------------------------------------------
def test_free_max_is_a_flattened_set_with_bottom_as_identity():
    ctx, a, b, c = context.ProofContext(), *sympy.symbols("a b c", real=True)
    ab_c, a_bc = ctx.free_max(ctx.free_max(a, b), c), ctx.free_max(a, ctx.free_max(b, c))
    assert ab_c == a_bc == ctx.free_max(c, ctx.free_max(b, a))
    assert ctx.max_set(ab_c) == {a, b, c} and ab_c.name not in ("a", "b", "c", "M")
    assert ctx.free_max(-sympy.oo, a) == a == ctx.free_max(a, -sympy.oo)
    assert ctx.free_max(-sympy.oo, -sympy.oo) == -sympy.oo
    assert ctx.scalar(0.25) == sympy.Rational(1, 4)


# --- obligations ----------------------------------------------------------------------------
def test_a_forward_and_a_masked_reverse_with_dq_are_proved():
    case = mask_grid.BY_NAME["causal bottom-right, n_q = n_k − 1"]
    outcomes = ledger.run([forward.cross_attention(2), reverse.structured(case, 3)], stream=None)
    assert [o.status for o in outcomes] == [ledger.PROVED] * 2, [o.detail for o in outcomes]


def test_the_spec_masks_are_the_inequalities():
    allowed = symbolic_spec.window(1, 0, "bottom-right").grid((), 2, 4)
    assert allowed.tolist() == [[False, True, True, False], [False, False, True, True]]
    lengths = symbolic_spec.padding((2, 0)).grid((2, 1), 1, 3)
    assert lengths.tolist() == [[[[True, True, False]]], [[[False, False, False]]]]


def test_an_exception_in_the_code_is_a_failed_verdict_not_a_crash():
    def raises():
        raise ValueError("could not broadcast")

    ob = ledger.Obligation("forward", "raises", "", raises)
    outcome, after = ledger.run([ob, *general.obligations()[:1]], stream=None)
    assert outcome.status == ledger.FAILED and not outcome.ok
    assert "ValueError: could not broadcast" in outcome.detail
    assert after.status == ledger.PROVED  # the run went on


# --- mutants: each must be killed --------------------------------------------------------------
def _killed_by(mutant_name: str, obligation: ledger.Obligation) -> ledger.Outcome:
    with mutants.BY_NAME[mutant_name].applied():
        (outcome,) = ledger.run([obligation], stream=None)
    return outcome


def test_unrescaled_merge_is_refuted_with_a_numeric_counterexample():
    outcome = _killed_by("merge: old accumulator not rescaled", general.obligations()[1])
    assert outcome.status == ledger.REFUTED
    cex = outcome.counterexample
    assert cex is not None and cex.lhs != cex.rhs and cex.point


def test_a_wrong_dropout_factor_is_refuted_by_the_symbolic_forward():
    """1/(1 + p) instead of 1/(1 − p): the spec's factor is the definition, not the code's."""
    outcome = _killed_by("Dropout.factors: 1/(1+p) instead of 1/(1−p)", forward.dropout())
    assert outcome.status == ledger.REFUTED


def test_dq_dropped_on_partial_tiles_is_refuted_by_a_masked_reverse():
    case = mask_grid.BY_NAME["causal bottom-right, n_q = n_k − 1"]
    outcome = _killed_by(
        "query_gradient: dQ dropped on partially-masked tiles", reverse.structured(case, 3)
    )
    assert outcome.status == ledger.REFUTED and "dQ" in outcome.counterexample.what


def test_overlapping_row_runs_are_refuted_by_the_split_rows_forward():
    outcome = _killed_by("tiles: row runs overlap by one row", forward.split_rows(mask_grid.CAUSAL))
    assert outcome.status == ledger.REFUTED


def test_a_broken_row_span_is_caught_by_the_tile_iterator_check():
    case = tiles.Case("causal", mask_grid.CAUSAL.library(3), symbolic_spec.causal())
    broken = mutants.BY_NAME["SlidingWindow.row_span: one row late"]
    with broken.applied(), pytest.raises(ledger.Refuted, match="counted 0"):
        tiles.check_case(case, 3, 3)
    assert tiles.check_case(case, 3, 3) > 0


def test_min_instead_of_max_is_caught_by_the_overflow_family():
    (ob,) = [o for o in mutants.obligations() if o.name.startswith("ctx: min")]
    (outcome,) = ledger.run([ob], stream=None)
    assert outcome.status == ledger.REFUTED and outcome.ok


def test_every_mutant_target_exists_in_the_library():
    for m in mutants.MUTANTS:
        assert callable(m.resolve()[2]), m.name


def test_a_mutant_whose_target_is_gone_is_a_failure_not_a_kill():
    gone = mutants.Mutant(
        "gone", "nothing", ("exactattn.core.algorithm:no_such_step",), lambda o: o
    )
    ob = ledger.Obligation("mutants", "gone", "", lambda: mutants.kill(gone, {}, {}), True)
    (outcome,) = ledger.run([ob], stream=None)
    assert outcome.status == ledger.NO_TARGET and not outcome.ok


# --- the command ----------------------------------------------------------------------------
def test_cli_writes_a_certificate_with_coverage_and_exits_zero(tmp_path):
    report = tmp_path / "cert.md"
    assert prove.main(["monoid", "general", "--report", str(report)]) == 0
    text = report.read_text(encoding="utf-8")
    for heading in ("## Theorems", "## Coverage", "⋆ is associative", "induction step"):
        assert heading in text
    assert "PROVED" in text


def test_cli_exits_nonzero_when_a_mutant_survives(monkeypatch, capsys, tmp_path):
    harmless = mutants.Mutant(
        "not broken at all", "merge", ("exactattn.core.algorithm:merge",), lambda o: o, ("general",)
    )
    monkeypatch.setattr(mutants, "MUTANTS", [harmless])
    monkeypatch.setattr(
        mutants, "probe_obligations", lambda max_n: {"general": general.obligations()}
    )
    report = tmp_path / "cert.md"
    assert prove.main(["--mutants", "--report", str(report)]) == 1
    assert "MUTANT NOT KILLED" in capsys.readouterr().out
    assert "| not broken at all | merge | **NO** — PROVED" in report.read_text(encoding="utf-8")


def test_cli_exits_nonzero_when_an_obligation_is_not_proved(monkeypatch):
    def broken(max_n):
        x = sympy.Symbol("x")
        return [ledger.Obligation("monoid", "false", "", lambda: ledger.check_equal("", x, x + 1))]

    monkeypatch.setattr(monoid, "obligations", broken)
    assert prove.main(["monoid"]) == 1


def test_cli_records_an_exception_and_exits_nonzero(monkeypatch, capsys):
    def raising(max_n):
        return [ledger.Obligation("monoid", "raises", "", lambda: np.zeros(2) + np.zeros(3))]

    monkeypatch.setattr(monoid, "obligations", raising)
    assert prove.main(["monoid", "general"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "could not be broadcast" in out and "Lemma A" in out


def test_cli_usage_errors():
    assert prove.main(["no-such-family"]) == 2
    assert prove.main(["--max-n", "0"]) == 2


def test_python_dash_m_proofs_runs_from_the_checkout():
    done = subprocess.run(
        [sys.executable, "-m", "proofs", "general"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Lemma A" in done.stdout and "ALL OK" in done.stdout


@pytest.mark.slow
def test_the_mutation_harness_runs_the_tests_against_a_mutant():
    tested = mutation.run_one(
        "Dropout.factors: 1/(1+p) instead of 1/(1−p)",
        tests=("tests/core/test_dropout.py", "tests/core/test_dropout_statistics.py"),
    )
    assert tested.killed is True and "test_dropout_statistics.py" in tested.detail


def test_one_block_size_per_distinct_tiling_and_b_is_read_only_through_tiles():
    from exactattn.proofs.engine import checks
    from exactattn.proofs.engine.symbols import distinct, score_inputs
    from exactattn.proofs.families import general

    pb = checks.Problem(*score_inputs(3, 3, 1), 1)
    assert distinct(range(1, 5), lambda b: checks.tiling(pb, b)) == [1, 2, 3]  # b = 4 is b = 3
    (ok,) = ledger.run([_general(general.B_THROUGH_TILES)], stream=None)
    assert ok.status == ledger.PROVED, ok.detail
    with mutants.BY_NAME["forward: b clamped before the loop (read outside tiles())"].applied():
        (broken,) = ledger.run([_general(general.B_THROUGH_TILES)], stream=None)
    assert broken.status == ledger.UNDECIDED and "block_size" in broken.detail


def _general(name: str) -> ledger.Obligation:
    from exactattn.proofs.families import general

    (ob,) = [ob for ob in general.obligations() if ob.name == name]
    return ob
