"""Module-level tasks for the executor tests: worker processes import them by name."""

from __future__ import annotations

import os
import signal


def square(x: int) -> int:
    return x * x


def die(how: str) -> None:
    """End this (worker) process: killed by SIGKILL, or exiting with status 3."""
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)


def fail(text: str) -> None:
    raise ValueError(text)


def pid() -> int:
    return os.getpid()


def nested_pool(x: int) -> int:
    """Square ``x`` in a process pool of its own (as the certified reference splits rows)."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1) as pool:
        return pool.submit(square, x).result()


def sweep_run_or_dies(point, *rest):
    """The sweep's run task, except that the run of ``mp11`` on the causal n = 24 problem
    kills its (worker) process."""
    from exactattn.precision import tasks as sweep_tasks

    if (point.config, point.mask, point.n) == ("mp11", "causal", 24):
        die("kill")
    return sweep_tasks.run_task(point, *rest)


def set_then_read(value: int) -> int:
    """Set mpmath's (process-wide) precision, let other threads run, read it back."""
    import time

    import mpmath

    mpmath.mp.prec = value
    time.sleep(0.02)
    return mpmath.mp.prec
