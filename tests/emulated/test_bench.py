"""The emulator benchmark runs and reports what it says (no timings are asserted)."""

from __future__ import annotations

from exactattn.precision import emulator_bench


def test_compare_reports_every_system_against_mpmath():
    rows = emulator_bench.compare(n=6, d=3, bits=8, block_size=4, repeats=1)
    assert [r["system"] for r in rows] == ["emulated scalar", "emulated op", "mpmath"]
    assert rows[-1]["mpmath / this"] == 1.0 and all(r["seconds"] > 0 for r in rows)


def test_largest_n_stops_when_the_next_run_would_exceed_the_budget():
    assert emulator_bench.largest_n(4, 8, 4, budget_s=0.0, granularity="op", start=8)["n"] == 8


def test_exp_log_agreement_counts_per_function():
    rows = emulator_bench.exp_log_agreement(bits=8, count=200)
    assert [r["function"] for r in rows] == ["exp", "log"]
    assert all(r["emulator misrounded"] == 0 and r["arguments"] > 0 for r in rows)


def test_the_command_prints_its_tables(capsys):
    emulator_bench.main(["--n", "6", "--d", "3", "--repeats", "1", "--budget", "0"])
    assert "| emulated scalar |" in capsys.readouterr().out
