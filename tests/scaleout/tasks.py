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
