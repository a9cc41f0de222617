"""One way to run independent tasks: in this process, in local worker processes or on Dask.

Every long command (``prove``, ``difftest``, ``check``, ``sweep``) splits its work into
tasks — a module-level function and picklable arguments — and hands them to an executor
from :func:`make_executor` (``--workers N`` / ``--scheduler ADDRESS``, see
:func:`add_arguments`). An executor offers ``submit(fn, *args)`` (a future),
``wait_first(futures)`` (``(done, pending)`` once one has finished), ``result(future)``
(the value, or the task's exception), ``capacity`` (how many tasks keep it busy) and
``close()``:

* :class:`LocalExecutor` with one worker runs each task in this process at submission;
  with more it keeps that many worker processes (started with ``spawn``, so the same code
  runs on every platform), each running one task at a time. A worker that dies (a crash, a
  kill, out of memory) fails only the task it was running, with :class:`WorkerDied` naming
  the signal or exit code, and is replaced: the run goes on.
* :class:`Isolated` is one such worker for calls that may crash or hang it (a foreign
  library's native code): a death or a timeout fails that call alone.
* :class:`DaskExecutor` submits to a Dask distributed scheduler (the optional ``dask``
  extra); the workers need the same ``exactattn`` installed. An address where no scheduler
  answers is a :class:`SchedulerUnreachable` within ``connect_timeout`` seconds
  (:data:`CONNECT_TIMEOUT_S` by default); a task whose workers died (Dask's
  ``KilledWorker``) is a :class:`WorkerDied`. Tasks in one worker process run one at a
  time (:func:`one_at_a_time`: mpmath's and flint's precision are process-wide), so a
  cluster's parallelism is its worker processes (``dask worker --nworkers N
  --nthreads 1``).

:func:`as_completed` drives an executor over a stream of tasks: at most ``capacity`` in
flight, the next task built only when there is room (so a task can be given what the tasks
before it found), each result yielded with the task's index. Callers gather by index, so
what a run reports does not depend on where or in which order its tasks ran.
"""

from __future__ import annotations

import argparse
import atexit
import concurrent.futures as cf
import multiprocessing
import multiprocessing.connection
import pickle
import signal
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .optional import needs

CONNECT_TIMEOUT_S = 5.0
STARTUP_S = 120.0  # a fresh Isolated worker's imports (torch, a foreign library), not timed
IN_FLIGHT_PER_WORKER = 2  # queued tasks per worker: no worker idles between two tasks


class WorkerDied(RuntimeError):
    """The process running a task died before the task returned (the message says how)."""


class SchedulerUnreachable(ConnectionError):
    """No Dask scheduler answered at the address given."""


class LocalExecutor:
    """Tasks in this process (``workers == 1``) or in ``workers`` local processes."""

    def __init__(self, workers: int = 1):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive integer; got {workers!r}")
        self.workers = workers
        self.capacity = 1 if workers == 1 else workers * IN_FLIGHT_PER_WORKER
        self._pool = _Pool(workers) if workers > 1 else None

    def submit(self, fn: Callable[..., Any], *args: Any) -> cf.Future:
        if self._pool is not None:
            return self._pool.submit(fn, args)
        future: cf.Future = cf.Future()
        try:
            future.set_result(fn(*args))
        except Exception as error:  # surfaced by result(), as from a worker
            future.set_exception(error)
        return future

    def wait_first(self, futures: Iterable[cf.Future]) -> tuple[set, set]:
        futures = list(futures)
        if self._pool is not None:
            self._pool.wait_any(futures)
        done = {f for f in futures if f.done()}
        return done, set(futures) - done

    def result(self, future: cf.Future) -> Any:
        return future.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()


def _probe(address: str, timeout: float) -> None:
    """Open (and close) a TCP connection to a ``tcp://`` scheduler address first: a Client
    whose connection fails can deadlock in its own clean-up (``Client.__del__`` stopping
    the event loop that is still starting), so a refused or silent address never gets one."""
    from distributed.comm.addressing import parse_address, parse_host_port

    scheme, location = parse_address(address)
    if scheme == "tcp":
        with socket.create_connection(parse_host_port(location), timeout=timeout):
            pass


class DaskExecutor:
    """Tasks on a Dask distributed cluster (``address``: ``tcp://host:port`` or a Client)."""

    def __init__(self, address: Any, connect_timeout: float | None = None):
        connect_timeout = CONNECT_TIMEOUT_S if connect_timeout is None else connect_timeout
        with needs("a Dask scheduler (--scheduler)"):
            from dask.distributed import Client
        self._own = not isinstance(address, Client)
        if self._own:
            if not isinstance(address, str) or not address:
                raise ValueError(
                    f"scheduler must be an address like tcp://host:8786; got {address!r}"
                )
            try:
                _probe(address, connect_timeout)
                address = Client(address, timeout=connect_timeout)
            except Exception as error:  # a refused, silent or malformed address alike
                raise SchedulerUnreachable(
                    f"cannot reach a Dask scheduler at {address!r} (waited at most "
                    f"{connect_timeout:g} s): {type(error).__name__}: {error}"
                ) from None
        self.client = address
        threads = sum(self.client.nthreads().values())
        self.capacity = max(1, threads) * IN_FLIGHT_PER_WORKER

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.client.submit(one_at_a_time, fn, *args, pure=False)

    def wait_first(self, futures: Iterable[Any]) -> tuple[set, set]:
        from dask.distributed import wait

        done, pending = wait(list(futures), return_when="FIRST_COMPLETED")
        return set(done), set(pending)

    def result(self, future: Any) -> Any:
        from dask.distributed import KilledWorker

        try:
            return future.result()
        except KilledWorker as error:
            raise WorkerDied(f"the Dask workers running it died ({error})") from None

    def close(self) -> None:
        if self._own:
            self.client.close()


Executor = LocalExecutor | DaskExecutor


def make_executor(
    workers: int = 1, scheduler: Any = None, connect_timeout: float | None = None
) -> Executor:
    """Dask when a scheduler address (or Client) is given, local processes otherwise."""
    if scheduler:
        return DaskExecutor(scheduler, connect_timeout)
    return LocalExecutor(workers)


def add_arguments(parser: argparse.ArgumentParser, default_workers: int = 1) -> None:
    """``--workers N`` and ``--scheduler ADDRESS``, the same on every command."""
    parser.add_argument(
        "--workers",
        "--jobs",
        type=int,
        default=default_workers,
        metavar="N",
        help=f"local worker processes (default {default_workers}; 1 runs in this process)",
    )
    parser.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="run the tasks on the Dask cluster of this scheduler (tcp://host:8786)",
    )


def check_arguments(args: argparse.Namespace) -> str | None:
    """The usage error in ``--workers`` / ``--scheduler``, or None."""
    if args.workers < 1:
        return f"--workers must be >= 1; got {args.workers}"
    return None


# Tasks in one process run one at a time: the working precision of mpmath and flint, and a
# mutant's patch of the library, are the whole process's. A Dask worker with several threads
# (or ``processes=False``) would otherwise run two tasks on one precision; give it processes.
_ONE_AT_A_TIME = threading.Lock()


def one_at_a_time(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` while no other task of this process runs (how Dask runs a task)."""
    with _ONE_AT_A_TIME:
        return fn(*args)


# --- driving an executor over many tasks ---------------------------------------------------
@dataclass
class Done:
    """Task ``index`` finished with ``value``, or raised ``error``."""

    index: int
    value: Any = None
    error: BaseException | None = None


def as_completed(
    executor: Executor, tasks: Iterable[tuple[Callable[..., Any], tuple]]
) -> Iterator[Done]:
    """Run ``(fn, args)`` tasks, at most ``executor.capacity`` in flight, yielding each as it
    finishes. ``tasks`` is read lazily: the next one is built only when there is room."""
    tasks = iter(tasks)
    pending: dict[Any, int] = {}
    count = 0
    more = True
    while True:
        while more and len(pending) < executor.capacity:
            task = next(tasks, None)
            if task is None:
                more = False
                break
            fn, args = task
            pending[executor.submit(fn, *args)] = count
            count += 1
        if not pending:
            return
        finished, _ = executor.wait_first(pending)
        for future in sorted(finished, key=pending.__getitem__):
            index = pending.pop(future)
            try:
                done = Done(index, executor.result(future))
            except Exception as error:
                done = Done(index, error=error)
            yield done


# --- the local process pool ----------------------------------------------------------------
class _Worker:
    """One worker process and the pipe it takes tasks from and answers on."""

    def __init__(self, context: Any):
        self.conn, child = context.Pipe()
        # not a daemon: a task may start processes of its own (the certified reference's
        # row blocks); the pool stops its workers on close() or at exit
        self.process = context.Process(target=_serve, args=(child,), daemon=False)
        self.process.start()
        child.close()
        self.future: cf.Future | None = None
        self.task = ""

    def died(self) -> str:
        self.process.join(timeout=1)
        code = self.process.exitcode
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exit code {code}"
        return f"worker process {self.process.pid} died ({how}) while running {self.task}"


class _Pool:
    """``workers`` processes; each task goes to an idle one, and a dead one is replaced."""

    def __init__(self, workers: int):
        self._context = multiprocessing.get_context("spawn")
        self._workers = [_Worker(self._context) for _ in range(workers)]
        self._queue: deque[tuple[cf.Future, bytes, str]] = deque()
        atexit.register(self.close)  # before multiprocessing joins its children at exit

    def submit(self, fn: Callable[..., Any], args: tuple) -> cf.Future:
        future: cf.Future = cf.Future()
        try:
            payload = pickle.dumps((fn, args))
        except Exception as error:  # e.g. a lambda: it cannot reach another process
            future.set_exception(
                TypeError(f"task {_name(fn)} cannot be sent to a worker process: {error}")
            )
            return future
        self._queue.append((future, payload, _name(fn)))
        self._dispatch()
        return future

    def _dispatch(self) -> None:
        for worker in self._workers:
            if not self._queue:
                return
            if worker.future is None:
                if not worker.process.is_alive():  # died between tasks: replace it
                    worker = self._replace(worker)
                worker.future, payload, worker.task = self._queue.popleft()
                worker.future.set_running_or_notify_cancel()
                worker.conn.send_bytes(payload)

    def wait_any(self, futures: list[cf.Future]) -> None:
        """Collect answers (and deaths) until one of ``futures`` is done."""
        while not any(f.done() for f in futures):
            busy = [w for w in self._workers if w.future is not None]
            if not busy:
                raise RuntimeError("waiting on tasks no worker runs")
            ready = multiprocessing.connection.wait(
                [w.conn for w in busy] + [w.process.sentinel for w in busy]
            )
            for worker in busy:
                if worker.conn in ready or worker.process.sentinel in ready:
                    self._collect(worker)
            self._dispatch()

    def _collect(self, worker: _Worker) -> None:
        future = worker.future
        try:
            kind, value = pickle.loads(worker.conn.recv_bytes())
        except (EOFError, OSError):  # the pipe closed: the process is gone
            future.set_exception(WorkerDied(worker.died()))
            self._replace(worker)
            return
        worker.future = None
        if kind == "ok":
            future.set_result(value)
        else:
            future.set_exception(value)

    def _replace(self, worker: _Worker) -> _Worker:
        worker.conn.close()
        fresh = _Worker(self._context)
        self._workers[self._workers.index(worker)] = fresh
        return fresh

    def close(self) -> None:
        """Stop the workers (idle ones hold nothing; busy ones belong to an interrupted run)
        and cancel what is still queued."""
        atexit.unregister(self.close)
        for worker in self._workers:
            worker.process.terminate()
        for worker in self._workers:
            worker.process.join(timeout=5)
            if worker.process.is_alive():
                worker.process.kill()
            worker.conn.close()
        for future, _, _ in self._queue:
            future.cancel()


class Isolated:
    """One worker process for calls that may crash or hang the process running them (a
    foreign library's native code): :meth:`call` runs ``fn(*args)`` there and returns its
    value or raises its exception. A worker that dies raises :class:`WorkerDied` naming the
    signal; one that gives no answer within ``timeout`` seconds (a fresh worker: plus
    :data:`STARTUP_S` for its imports) is killed and raises :class:`TimeoutError`. Either way
    the next call gets a fresh worker."""

    def __init__(self) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._worker: _Worker | None = None
        atexit.register(self.close)

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        allowed = timeout
        if self._worker is None or not self._worker.process.is_alive():
            self._worker = _Worker(self._context)
            allowed = None if timeout is None else timeout + STARTUP_S
        worker = self._worker
        worker.task = _name(fn)
        worker.conn.send_bytes(pickle.dumps((fn, args)))
        if not multiprocessing.connection.wait([worker.conn, worker.process.sentinel], allowed):
            self._stop()
            raise TimeoutError(f"{worker.task} gave no answer within {timeout:g} s (killed)")
        try:
            kind, value = pickle.loads(worker.conn.recv_bytes())
        except (EOFError, OSError):  # the pipe closed: the process is gone
            self._worker = None
            raise WorkerDied(worker.died()) from None
        if kind == "ok":
            return value
        raise value

    def _stop(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.process.kill()
            worker.process.join(timeout=5)
            worker.conn.close()

    def close(self) -> None:
        atexit.unregister(self.close)
        self._stop()


def _name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _serve(conn: multiprocessing.connection.Connection) -> None:
    """A worker's loop: run each task received, answer ``("ok", value)`` or ``("error", e)``.

    Ctrl-C goes to the parent (the whole process group gets it): the parent decides.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        except Exception as error:  # the task's function or arguments do not import here
            conn.send_bytes(pickle.dumps(("error", _portable(error))))
            continue
        fn, args = message
        try:
            answer = ("ok", fn(*args))
        except Exception as error:
            answer = ("error", error)
        try:
            conn.send_bytes(pickle.dumps(answer))
        except Exception as error:  # an unpicklable result or exception
            conn.send_bytes(pickle.dumps(("error", _portable(error, answer[1]))))


def _portable(error: BaseException, original: Any = None) -> Exception:
    """An exception that surely pickles, saying what happened."""
    what = f"{type(original).__name__}: {original}; " if original is not None else ""
    return RuntimeError(f"{what}{type(error).__name__}: {error}")
