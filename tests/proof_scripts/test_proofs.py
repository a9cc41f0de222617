"""The proof machinery: it proves a true obligation, refutes a broken step, reports, exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import sympy

from proofs import cli, engine, forward, monoid, mutants, symbolic

ROOT = Path(__file__).resolve().parents[2]


def test_zero_test_proves_shift_identity_and_rejects_a_false_one():
    s, m = sympy.Symbol("s", real=True), sympy.Symbol("m", real=True)
    assert symbolic.equal(sympy.exp(s - m) * sympy.exp(m), sympy.exp(s))
    assert not symbolic.equal(sympy.exp(s - m), sympy.exp(s))


def test_small_forward_obligation_is_proved():
    (outcome,) = engine.run([forward.cross_attention(2)], stream=None)
    assert outcome.status == engine.PROVED, outcome.detail


def test_unrescaled_merge_is_refuted_with_a_numeric_counterexample():
    name, sizes, check = mutants.MUTANTS[0]
    ob = engine.Obligation("mutants", name, sizes, check, expect_refuted=True)
    (outcome,) = engine.run([ob], stream=None)
    assert outcome.status == engine.REFUTED and outcome.ok
    cex = outcome.counterexample
    assert cex is not None and cex.lhs != cex.rhs and cex.point


def test_min_instead_of_max_is_caught_by_the_overflow_family():
    check = dict((name, check) for name, _, check in mutants.MUTANTS)["ctx: min instead of max"]
    (outcome,) = engine.run([engine.Obligation("m", "min", "", check, True)], stream=None)
    assert outcome.status == engine.REFUTED


def test_cli_writes_certificate_and_exits_zero(tmp_path):
    report = tmp_path / "cert.md"
    assert cli.main(["monoid", "--report", str(report)]) == 0
    text = report.read_text(encoding="utf-8")
    assert "⋆ is associative" in text and "PROVED" in text and "## Theorems" in text


def test_cli_exits_nonzero_when_a_mutant_survives(monkeypatch, capsys):
    harmless = mutants._forward_check("merge", mutants.ORIGINAL_MERGE)
    monkeypatch.setattr(mutants, "MUTANTS", [("not broken at all", "n=2", harmless)])
    assert cli.main(["--mutants"]) == 1
    assert "MUTANT SURVIVED" in capsys.readouterr().out


def test_cli_exits_nonzero_when_an_obligation_is_not_proved(monkeypatch):
    def broken(max_n):
        return [
            engine.Obligation(
                "monoid",
                "false claim",
                "",
                lambda: engine.check_equal("x vs x+1", sympy.Symbol("x"), sympy.Symbol("x") + 1),
            )
        ]

    monkeypatch.setattr(monoid, "obligations", broken)
    assert cli.main(["monoid"]) == 1


def test_cli_usage_errors():
    assert cli.main(["no-such-family"]) == 2
    assert cli.main(["--max-n", "0"]) == 2


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
