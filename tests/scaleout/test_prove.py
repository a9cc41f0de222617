"""``exactattn prove`` spread out: the same lines and certificate serially, in processes and on
Dask; a dead worker leaves its obligation LOST; timeouts; an interrupted run resumes."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from exactattn.commands import prove as cli
from exactattn.infra.journal import Journal
from exactattn.proofs import proof_run
from exactattn.proofs.engine import ledger
from exactattn.proofs.families import decider_mutants, monoid, mutants
from tests.optional import requires

FAMILIES = ["monoid", "general", "dropout"]  # fast, and enough obligations to interleave
PROGRAM = "tests/scaleout/programs.py"


def _timeless(text: str) -> str:
    """Certificate or log text with the timings blanked (they differ from run to run)."""
    text = re.sub(r" *\d+\.\d+s\b", " T", text)  # the padding too: 9.9s, 10.1s
    return re.sub(r"\| \d+\.\d+ \|", "| T |", text)


def _prove(argv: list[str], report: Path, capsys) -> tuple[int, str, str]:
    status = cli.main([*argv, "--report", str(report)])
    out = capsys.readouterr().out.replace(str(report), "REPORT")
    return status, _timeless(out), _timeless(report.read_text())


def test_lines_and_certificate_are_the_same_serially_and_in_processes(tmp_path, capsys):
    report = tmp_path / "certificate.md"
    serial = _prove(FAMILIES, report, capsys)
    spread = _prove([*FAMILIES, "--workers", "2"], report, capsys)
    assert serial[0] == 0 and "32 obligations" not in serial[1]
    assert spread == serial


def test_lines_and_certificate_are_the_same_on_dask(tmp_path, capsys):
    distributed = requires("dask.distributed")
    report = tmp_path / "certificate.md"
    serial = _prove(FAMILIES, report, capsys)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=2, processes=False, dashboard_address=None
    ) as cluster:
        on_dask = _prove([*FAMILIES, "--scheduler", cluster.scheduler_address], report, capsys)
    assert on_dask == serial


@pytest.mark.slow  # the mutants: ~12 s serially, then again in processes
def test_the_mutants_verdicts_are_the_same_spread_out(tmp_path, capsys):
    argv = ["overflow", "mutants", "--max-n", "1"]
    report = tmp_path / "certificate.md"
    serial = _prove(argv, report, capsys)
    count = len(mutants.MUTANTS) + 1 + len(decider_mutants.MUTANTS)  # + the ctx's min-for-max
    assert serial[0] == 0 and f"{count}/{count} mutants killed" in serial[1]
    spread = _prove([*argv, "--workers", "2"], report, capsys)
    assert spread[0] == serial[0] and _unseeded(spread[1]) == _unseeded(serial[1])
    assert _unseeded(spread[2]) == _unseeded(serial[2])


def _unseeded(text: str) -> str:
    """Text with the fresh random points' seeds and values blanked: the zero test and the dual
    numbers draw a new point each run (the seed is printed so that a disagreement can be
    replayed), so a mutant's refutation quotes other numbers each time."""
    return "\n".join(
        re.sub(r"-?\d+(/\d+)?", "N", line) if "random point" in line else line
        for line in text.splitlines()
    )


def _verdicts(text: str) -> list[str]:
    """The obligation lines (name, what refuted it, status), the counterexamples' values aside."""
    return [line for line in _unseeded(text).splitlines() if "counterexample:" not in line]


@pytest.mark.slow  # threads of one process: the tasks take turns while a mutant is patched in
def test_the_mutants_verdicts_are_the_same_on_dask(tmp_path, capsys):
    """Every verdict as serially (the same counterexample values are not promised here: on
    a cluster of threads z3 picked other models for some refutations)."""
    distributed = requires("dask.distributed")
    argv = ["overflow", "mutants", "--max-n", "1"]
    report = tmp_path / "certificate.md"
    serial = _prove(argv, report, capsys)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        on_dask = _prove([*argv, "--scheduler", cluster.scheduler_address], report, capsys)
    assert on_dask[0] == serial[0] == 0 and _verdicts(on_dask[1]) == _verdicts(serial[1])


def test_a_mutant_task_carries_the_unmutated_verdicts_reached_before_it():
    sources = [proof_run.Source("monoid", 1), proof_run.Source("mutants", 1)]
    planned = [(s, i, ob) for s in sources for i, ob in enumerate(s.obligations())]
    proved = ledger.Verdict(ledger.PROVED, 0.0)
    verdicts = {p: proved for p, (s, _, _) in enumerate(planned) if s.family == "monoid"}
    todo = [p for p in range(len(planned)) if p not in verdicts]
    fn, (source, index, key, timeout, unmutated) = next(
        proof_run._tasks(planned, todo, verdicts, timeout=2.0)
    )
    assert fn is proof_run.prove and source.family == "mutants" and timeout == 2.0
    assert key == proof_run.key_of(planned[todo[0]][2]) and index == 0
    assert {k for k, _ in unmutated} == {
        proof_run.key_of(ob) for _, _, ob in planned[: len(verdicts)]
    }
    assert {status for _, status in unmutated} == {ledger.PROVED}


@pytest.mark.slow  # several seconds: the default run stays within its budget
def test_a_worker_that_dies_leaves_its_obligation_lost_and_the_run_goes_on(capsys):
    argv = ["--mask-mod", f"{PROGRAM}:causal_dies_at_two", "--max-n", "2", "--workers", "2"]
    assert cli.main(argv) == 1
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("program")]
    assert [line.split()[-1] for line in lines] == ["PROVED", "PROVED", "LOST", "LOST"]
    assert out.count("died (killed by SIGKILL) while running exactattn.proofs.proof_run.prove") == 2
    assert "4 obligations: 2 proved" in out and "2 FAILED" in out


# --- timeouts ------------------------------------------------------------------------------
def _spin(seconds: float = 1.0) -> str:
    """Busy Python for ``seconds`` (then a verdict: a limit that does not work shows)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return "spun to the end"


def _swallowing() -> str:
    try:
        return _spin()
    except Exception:  # the code under test may catch broadly: the limit still holds
        return "swallowed"


@pytest.mark.parametrize("check", [_spin, _swallowing])
def test_an_obligation_past_its_limit_times_out_in_any_thread(check):
    ob = ledger.Obligation("monoid", "spins", "", check)
    start = time.perf_counter()
    assert ledger.check(ob, timeout=0.2).status == ledger.TIMEOUT
    found = []
    thread = threading.Thread(target=lambda: found.append(ledger.check(ob, timeout=0.2)))
    thread.start()
    thread.join()
    assert found[0].status == ledger.TIMEOUT and "no verdict within 0.2 s" in found[0].detail
    assert time.perf_counter() - start < 1.2  # two limits, not two full spins
    assert ledger.check(ob, timeout=None).status == ledger.PROVED  # no limit: it ends


def test_a_mutant_that_timed_out_or_was_lost_was_not_killed():
    ob = ledger.Obligation("mutants", "broken", "", _spin, expect_refuted=True)
    for status in (ledger.TIMEOUT, ledger.LOST):
        outcome = ledger.Outcome(ob, status, 1.0)
        assert not outcome.ok and "MUTANT NOT KILLED" in outcome.line()
    assert ledger.Outcome(ob, ledger.REFUTED, 1.0).ok


def test_the_command_times_out_one_obligation_and_goes_on(monkeypatch, capsys):
    spins = ledger.Obligation("monoid", "spins", "", _spin)
    monkeypatch.setattr(monoid, "obligations", lambda max_n: [spins, *_original(max_n)[:2]])
    assert cli.main(["monoid", "--timeout", "0.3"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"spins .* TIMEOUT\n +no verdict within 0.3 s \(--timeout\)", out)
    assert "3 obligations: 2 proved" in out


_original = monoid.obligations


# --- resume --------------------------------------------------------------------------------
class _Interrupting:
    """runner.prove, but Ctrl-C arrives at call ``at`` (0: never); counts the calls."""

    def __init__(self, at: int = 0):
        self.at, self.calls = at, 0

    def __call__(self, *args):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return _PROVE(*args)


_PROVE = proof_run.prove


def test_an_interrupted_run_resumes_to_the_same_certificate(tmp_path, monkeypatch, capsys):
    journal, report = tmp_path / "journal.jsonl", tmp_path / "certificate.md"
    whole = _prove(FAMILIES, report, capsys)
    total = int(re.search(r"(\d+) obligations", whole[1]).group(1))
    monkeypatch.setattr(proof_run, "prove", _Interrupting(at=6))
    assert cli.main([*FAMILIES, "--journal", str(journal)]) == 130
    assert f"interrupted: 5 of {total} obligations checked; {journal} keeps them" in (
        capsys.readouterr().out
    )
    assert len(journal.read_text().splitlines()) == 1 + 5  # the settings, five verdicts
    again = _Interrupting()
    monkeypatch.setattr(proof_run, "prove", again)
    resumed = _prove([*FAMILIES, "--journal", str(journal), "--resume"], report, capsys)
    assert again.calls == total - 5
    assert resumed == whole


def test_a_journal_of_other_settings_is_refused(tmp_path, capsys):
    journal = tmp_path / "journal.jsonl"
    assert cli.main(["monoid", "--journal", str(journal)]) == 0
    capsys.readouterr()
    assert cli.main(["monoid", "--max-n", "3", "--journal", str(journal), "--resume"]) == 2
    assert "other settings (max_n differ)" in capsys.readouterr().err


def test_a_journal_drops_a_torn_last_line_and_keeps_the_rest(tmp_path):
    path = tmp_path / "journal.jsonl"
    log = Journal(path, {"a": 1})
    log.add("one", {"x": 1.5})
    log.add("two", [1, 2])
    log.close()
    path.write_text(path.read_text() + '{"key": "three", "val')  # killed mid-line
    assert Journal(path, {"a": 1}, resume=True).kept == {"one": {"x": 1.5}, "two": [1, 2]}
    with pytest.raises(ValueError, match=r"other settings \(a, b differ\)"):
        Journal(path, {"a": 2, "b": 0}, resume=True)
    assert Journal(path, {"a": 2}).kept == {}  # without resume: a fresh journal


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "0"], "--workers must be >= 1; got 0"),
        (["--timeout", "0"], "--timeout must be a positive number of seconds; got 0.0"),
        (["--resume"], "--resume needs --journal FILE"),
    ],
)
def test_bad_running_options_are_usage_errors(argv, message, capsys):
    assert cli.main(["monoid", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_certificate_names_what_was_proved_not_where(tmp_path, capsys):
    report = tmp_path / "certificate.md"
    argv = ["monoid", "--workers", "2", "--no-progress", "--journal", str(tmp_path / "j")]
    assert cli.main([*argv, "--report", str(report)]) == 0
    assert f"Command: `exactattn prove monoid --report {report}`" in report.read_text()


# --- progress ------------------------------------------------------------------------------
def test_the_progress_bar_counts_to_the_end_with_the_time_left(capsys):
    requires("rich")  # the bar; without it there is none
    assert proof_run.run(["monoid"], 1, progress=True) == 0
    captured = capsys.readouterr()
    count = captured.out.count("PROVED")
    assert re.search(rf"obligations .* {count}/{count} .*ETA", captured.err), captured.err
    assert "ETA" not in captured.out and "━" not in captured.out  # the lines stay clean
