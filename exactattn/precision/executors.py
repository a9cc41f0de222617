"""One executor interface for the sweep's independent tasks: local processes or Dask.

``submit(fn, *args)`` returns a future (``result()``); ``wait_first(futures)`` returns
``(done, pending)`` once at least one has finished. :class:`LocalExecutor` runs tasks in
this process (``workers <= 1``) or in a ``concurrent.futures`` process pool;
:class:`DaskExecutor` hands them to a Dask distributed scheduler at ``address`` (the
optional ``dask`` extra), so a sweep spreads over a cluster without new code. The workers
need the same ``exactattn`` installed: tasks are module-level functions pickled by name,
with their grid point (and the problem's reference) as arguments.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Iterable
from typing import Any

from ..optional import needs


class LocalExecutor:
    """Serial in-process execution for one worker, a process pool for more."""

    def __init__(self, workers: int = 1):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive integer; got {workers!r}")
        self.workers = workers
        self._pool = cf.ProcessPoolExecutor(max_workers=workers) if workers > 1 else None

    def submit(self, fn: Callable[..., Any], *args: Any) -> cf.Future:
        if self._pool is not None:
            return self._pool.submit(fn, *args)
        future: cf.Future = cf.Future()
        try:
            future.set_result(fn(*args))
        except Exception as error:  # surfaced by result(), as a pool would
            future.set_exception(error)
        return future

    def wait_first(self, futures: Iterable[Any]) -> tuple[set, set]:
        done, pending = cf.wait(list(futures), return_when=cf.FIRST_COMPLETED)
        return set(done), set(pending)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)


class DaskExecutor:
    """Tasks on a Dask distributed cluster (``address``: ``tcp://host:port`` or a Client)."""

    def __init__(self, address: Any):
        with needs("a Dask scheduler (--scheduler)"):
            from dask.distributed import Client
        self._own = not isinstance(address, Client)
        self.client = Client(address) if self._own else address

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.client.submit(fn, *args, pure=False)

    def wait_first(self, futures: Iterable[Any]) -> tuple[set, set]:
        from dask.distributed import wait

        done, pending = wait(list(futures), return_when="FIRST_COMPLETED")
        return set(done), set(pending)

    def close(self) -> None:
        if self._own:
            self.client.close()


def make_executor(workers: int = 1, scheduler: Any = None) -> LocalExecutor | DaskExecutor:
    """Dask when a scheduler address is given, local processes otherwise."""
    return DaskExecutor(scheduler) if scheduler else LocalExecutor(workers)
