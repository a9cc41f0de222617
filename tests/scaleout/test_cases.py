"""``exactattn difftest``, ``check`` and ``sweep`` spread out: the same table and report
serially, in processes and on Dask; a worker that dies fails its cases and the run goes
on; an interrupted difftest resumes to the same table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exactattn.commands import check, difftest
from exactattn.commands import sweep as sweep_cli
from exactattn.precision.grid import expand
from exactattn.precision.presets import PRESETS
from exactattn.testing import search
from tests.optional import requires
from tests.scaleout import tasks

DIFFTEST = ["--examples", "16", "--backends", "numpy", "--seed", "5", "--max-n", "6"]
USER = "tests.scaleout.user_targets"
CHECK = ["--examples", "10", "--max-n", "5", "--dtypes", "float32", "--no-grads", "--seed", "2"]
CHECK += ["--no-probes", "--no-determinism", "--convention", "sdpa"]


def _timeless(text: str) -> str:
    """Output with the wall times and the where-it-ran words blanked."""
    text = re.sub(r"\d+\.\d+ s\b", "T s", text)
    return re.sub(r", (workers \d+|scheduler \S+)$", "", text, flags=re.M)


def _difftest(argv: list[str], capsys) -> tuple[int, str]:
    status = difftest.main([*DIFFTEST, "--no-progress", *argv])
    return status, _timeless(capsys.readouterr().out)


def _check(argv: list[str], tmp_path: Path, capsys) -> tuple[int, str]:
    status = check.main([*CHECK, "--save-failures", str(tmp_path / "failures"), *argv])
    out = capsys.readouterr().out.replace(str(tmp_path), "TMP")
    return status, _timeless(out)


# --- difftest ------------------------------------------------------------------------------
def test_difftest_gives_the_same_table_serially_in_processes_and_on_dask(capsys):
    distributed = requires("dask.distributed")
    serial = _difftest(["--workers", "1"], capsys)
    assert serial[0] == 0 and "difftest: 16 examples, 6 targets" in serial[1]
    assert _difftest(["--workers", "2"], capsys) == serial
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        assert _difftest(["--scheduler", cluster.scheduler_address], capsys) == serial


class _Interrupting:
    """The chunk task, but Ctrl-C arrives at call ``at`` (0: never); counts the cases."""

    def __init__(self, at: int = 0):
        self.at, self.calls, self.cases = at, 0, 0

    def __call__(self, source, draws, only=None):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        self.cases += len(draws)
        return _JUDGE(source, draws, only)


_JUDGE = search.judge_chunk


def test_an_interrupted_difftest_resumes_to_the_same_table(tmp_path, monkeypatch, capsys):
    requires("flint")  # the difftest's certified reference
    journal = str(tmp_path / "journal.jsonl")
    whole = _difftest(["--workers", "1"], capsys)
    monkeypatch.setattr(search, "judge_chunk", _Interrupting(at=7))
    status, out = _difftest(["--workers", "1", "--journal", journal], capsys)
    assert status == 130 and "difftest: 6 examples" in out and "INTERRUPTED" in out
    again = _Interrupting()
    monkeypatch.setattr(search, "judge_chunk", again)
    assert _difftest(["--workers", "1", "--journal", journal, "--resume"], capsys) == whole
    assert again.cases == 16 - 6
    status = difftest.main([*DIFFTEST, "--examples", "17", "--journal", journal, "--resume"])
    assert status == 2 and "other settings (examples differ)" in capsys.readouterr().err


# --- check ---------------------------------------------------------------------------------
@pytest.mark.slow  # three checks of a failing target, each with its shrink (~15 s)
def test_check_gives_the_same_report_serially_in_processes_and_on_dask(tmp_path, capsys):
    requires("torch")
    distributed = requires("dask.distributed")
    argv = [f"{USER}:skewed"]
    serial = _check(argv, tmp_path, capsys)
    assert serial[0] == 1 and "FAIL" in serial[1]  # found, shrunk here, the same each way
    assert _check([*argv, "--workers", "2"], tmp_path, capsys) == serial
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        assert _check([*argv, "--scheduler", cluster.scheduler_address], tmp_path, capsys) == (
            serial
        )


@pytest.mark.slow  # each death restarts a worker, which imports torch again
def test_a_check_worker_that_dies_fails_its_cases_and_the_run_goes_on(tmp_path, capsys):
    requires("torch")
    status, out = _check([f"{USER}:dies_on_odd_queries", "--workers", "2"], tmp_path, capsys)
    assert status == 1 and "check: 10 examples" in out
    assert "died (killed by SIGKILL)" in out and "judged case" in out
    assert re.search(r"\d+ \(case, unit\) pair\(s\) died again", out)
    assert "the worker process died judging this case" in out
    (replay,) = (tmp_path / "failures").glob("*.json")  # judging it here could crash us
    assert "not shrunk: it crashed its worker" in replay.read_text()


def test_objects_do_not_travel_to_workers():
    requires("torch")  # the user's target module imports it
    from exactattn import targets
    from exactattn.testing import session

    target = targets.get(f"{USER}:skewed", convention="sdpa")
    with pytest.raises(ValueError, match="need the targets' names"):
        session.run([target], session.Settings(examples=1, workers=2))


# --- sweep ---------------------------------------------------------------------------------
def test_a_sweep_worker_that_dies_leaves_its_rows_missing_and_the_run_goes_on(
    tmp_path, monkeypatch
):
    requires("flint", "pandas", "matplotlib")  # the certified reference, the sweep's outputs
    from exactattn.precision import sweep_run as sweep_runner

    honest = sweep_runner.run_task
    monkeypatch.setattr(sweep_runner, "run_task", tasks.sweep_run_or_dies)
    result = sweep_runner.run_sweep("tiny", tmp_path, workers=2, progress=False)
    (lost,) = [k for k in result.skipped if "config=mp11" in k]
    assert "n=24" in lost and "mask=causal" in lost
    assert "killed by SIGKILL" in result.skipped[lost] and "--resume" in result.skipped[lost]
    points = len(expand(PRESETS["tiny"]))
    assert result.rows_written == 2 * (points - 1)  # every other point: tiled and naive
    monkeypatch.setattr(sweep_runner, "run_task", honest)
    again = sweep_runner.run_sweep("tiny", tmp_path, workers=1, resume=True, progress=False)
    assert (again.rows_written, again.skipped) == (2, {})


def test_sweep_reports_an_unreachable_scheduler(monkeypatch, tmp_path, capsys):
    requires("dask")
    from exactattn.infra import executors

    monkeypatch.setattr(executors, "CONNECT_TIMEOUT_S", 1)
    argv = ["--preset", "tiny", "--out", str(tmp_path), "--scheduler", "tcp://127.0.0.1:1"]
    assert sweep_cli.main(argv) == 2
    assert "exactattn sweep: cannot reach a Dask scheduler at 'tcp://127.0.0.1:1'" in (
        capsys.readouterr().err
    )
