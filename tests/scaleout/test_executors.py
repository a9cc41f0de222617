"""The executors: tasks come back by index, a dead worker fails only its task, a task that
cannot travel says so, an unreachable scheduler is an error within seconds."""

from __future__ import annotations

import time

import pytest

from exactattn.infra import executors
from exactattn.infra.executors import LocalExecutor, WorkerDied, as_completed, make_executor
from tests.optional import requires
from tests.scaleout import tasks


def _run(executor, calls) -> dict[int, object]:
    try:
        return {
            d.index: d.value if d.error is None else d.error for d in as_completed(executor, calls)
        }
    finally:
        executor.close()


def test_a_worker_that_dies_fails_only_its_task_and_the_run_goes_on():
    calls = [
        (tasks.square, (2,)),
        (tasks.die, ("kill",)),
        (tasks.square, (3,)),
        (tasks.die, ("exit",)),
        (tasks.fail, ("no",)),
        *[(tasks.square, (x,)) for x in range(4, 9)],
    ]
    got = _run(LocalExecutor(2), calls)
    assert [got[i] for i in (0, 2, *range(5, 10))] == [4, 9, 16, 25, 36, 49, 64]
    assert isinstance(got[1], WorkerDied) and "killed by SIGKILL" in str(got[1])
    assert "while running tests.scaleout.tasks.die" in str(got[1])
    assert isinstance(got[3], WorkerDied) and "exit code 3" in str(got[3])
    assert isinstance(got[4], ValueError) and str(got[4]) == "no"  # an error is not a death


def test_tasks_run_in_other_processes_and_in_this_one():
    import os

    elsewhere = _run(LocalExecutor(2), [(tasks.pid, ())] * 4)
    assert os.getpid() not in elsewhere.values()
    assert set(_run(LocalExecutor(1), [(tasks.pid, ())] * 2).values()) == {os.getpid()}


def test_a_task_that_cannot_travel_is_a_clear_error():
    (error,) = _run(LocalExecutor(2), [(lambda: 1, ())]).values()
    assert isinstance(error, TypeError) and "cannot be sent to a worker process" in str(error)


def test_the_next_task_is_built_when_the_last_has_come_back():
    seen: list[int] = []

    def calls():
        for x in range(4):
            yield tasks.square, (x + len(seen),)  # built knowing what came back before

    executor = LocalExecutor(1)
    for done in as_completed(executor, calls()):
        seen.append(done.value)
    assert seen == [0, 4, 16, 36]


def test_bad_worker_counts_are_refused():
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match=rf"workers must be a positive integer; got {bad!r}"):
            LocalExecutor(bad)


def test_an_unreachable_scheduler_is_an_error_within_seconds():
    requires("dask")
    for address in ("tcp://127.0.0.1:1", "no-port-here"):
        start = time.perf_counter()
        with pytest.raises(executors.SchedulerUnreachable, match=address):
            make_executor(scheduler=address, connect_timeout=1)
        assert time.perf_counter() - start < 10


@pytest.mark.parametrize("command", ["prove", "difftest", "check"])
def test_each_command_reports_an_unreachable_scheduler(command, monkeypatch, capsys):
    requires("dask")
    from exactattn import cli

    monkeypatch.setattr(executors, "CONNECT_TIMEOUT_S", 1)
    argv = {"prove": ["monoid"], "difftest": ["--examples", "2"], "check": ["np-fp64"]}[command]
    start = time.perf_counter()
    assert cli.main([command, *argv, "--scheduler", "tcp://127.0.0.1:1"]) == 2
    assert time.perf_counter() - start < 15
    err = capsys.readouterr().err
    assert f"exactattn {command}: cannot reach a Dask scheduler at 'tcp://127.0.0.1:1'" in err


@pytest.mark.slow  # a process cluster starts, and restarts its dead worker, in seconds
def test_a_dask_worker_that_dies_fails_its_task_and_the_run_goes_on():
    """Dask also fails the tasks queued on the dying worker when no retry is allowed (by
    default it retries them elsewhere): every task is a value or a WorkerDied, and the tasks
    handed out after the death run on the restarted worker."""
    distributed = requires("dask.distributed")
    import dask

    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
    ):
        calls = [(tasks.die, ("kill",)), *[(tasks.square, (x,)) for x in range(6)]]
        got = _run(make_executor(scheduler=cluster.scheduler_address), calls)
    assert isinstance(got[0], WorkerDied) and "died" in str(got[0])
    assert all(got[i] == (i - 1) ** 2 or isinstance(got[i], WorkerDied) for i in range(1, 7))
    assert got[6] == 25


def test_a_task_may_start_processes_of_its_own():
    """The certified reference splits its rows over a process pool inside a sweep's task."""
    assert _run(LocalExecutor(2), [(tasks.nested_pool, (3,))]) == {0: 9}


def test_workers_left_running_are_stopped_at_exit(tmp_path):
    """A program that never closes its executor still ends (its workers are not daemons)."""
    import subprocess
    import sys

    script = (
        "from exactattn.infra.executors import LocalExecutor, as_completed\n"
        "from tests.scaleout import tasks\n"
        "ex = LocalExecutor(2)\n"
        "print([d.value for d in as_completed(ex, [(tasks.square, (4,))])])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == b"[16]", done.stderr


def test_tasks_in_one_dask_worker_process_do_not_share_a_precision():
    """Threads of one Dask worker would run two tasks on one mpmath (or flint) precision."""
    distributed = requires("dask.distributed")
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=4, processes=False, dashboard_address=None
    ) as cluster:
        calls = [(tasks.set_then_read, (53 + k,)) for k in range(16)]
        got = _run(make_executor(scheduler=cluster.scheduler_address), calls)
    assert got == {k: 53 + k for k in range(16)}
