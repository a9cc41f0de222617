"""The mutants against the default tests: a pytest plugin and the runner that uses it.

``EXACTATTN_MUTANT='<name>' python -m pytest -p exactattn.proofs.mutation`` runs pytest
with that mutant of :data:`proofs.mutants.MUTANTS` applied for the whole session (the
same ``mock.patch`` the proofs use). :func:`run_all` does so for every mutant, one
subprocess each, on the default test run minus ``tests/proof_scripts`` (those test the
proof machinery itself and would count the proofs twice), stopping at the first failing
test (``-x``): a mutant is *killed by the tests* when pytest exits 1. A mutant of the
proofs' own code (the mask_mod tracer, the all-n example) runs against the program
family's tests instead.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "EXACTATTN_MUTANT"
ROOT = Path(__file__).resolve().parents[1]
TEST_ARGS = ("-x", "-q", "-rfE", "-p", "no:cacheprovider", "--ignore=tests/proof_scripts")
TIMEOUT_S = 900
# A mutant of the proofs' own tracer or example is judged by the program family's tests
# (the library's tests never run that code).
PROOFS_TESTS = ("tests/proof_scripts/test_program.py",)


@dataclass(frozen=True)
class Tested:
    """One mutant against the tests: killed (True), survived (False) or not run (None)."""

    mutant: str
    killed: bool | None
    detail: str
    seconds: float


# --- the plugin ----------------------------------------------------------------------------
_STACK = contextlib.ExitStack()


def pytest_configure(config: Any) -> None:
    name = os.environ.get(ENV)
    if name:
        from .families.mutants import BY_NAME

        _STACK.enter_context(BY_NAME[name].applied())


def pytest_unconfigure(config: Any) -> None:
    _STACK.close()


def pytest_report_header(config: Any) -> str | None:
    name = os.environ.get(ENV)
    return f"exactattn mutant applied: {name}" if name else None


# --- the runner ----------------------------------------------------------------------------
def run_one(name: str, root: Path = ROOT, tests: tuple[str, ...] = ("tests",)) -> Tested:
    """``name`` against ``tests`` (paths under the checkout ``root``), in a subprocess."""
    if not (root / "tests").is_dir():
        return Tested(name, None, f"no tests folder under {root} (an installed package)", 0.0)
    command = [sys.executable, "-m", "pytest", *TEST_ARGS, "-p", __name__, *tests]
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=root, env={**os.environ, ENV: name}, capture_output=True, text=True,
            timeout=TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return Tested(name, None, f"pytest ran past {TIMEOUT_S} s", time.perf_counter() - start)
    seconds = time.perf_counter() - start
    if done.returncode == 0:
        return Tested(name, False, "every test passed", seconds)
    if done.returncode != 1:
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
        return Tested(name, None, f"pytest exit {done.returncode}: {tail[0]}", seconds)
    first = re.search(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.MULTILINE)
    return Tested(name, True, first.group(1) if first else "a test failed", seconds)


def run_all(names: list[str] | None = None, stream: Any = sys.stdout) -> list[Tested]:
    """Every mutant (or those named) against the tests, one line each as they finish."""
    from .families.mutants import BY_NAME, MUTANTS

    out = []
    for name in names or [m.name for m in MUTANTS]:
        tested = run_one(name, tests=PROOFS_TESTS if BY_NAME[name].of_the_proofs else ("tests",))
        out.append(tested)
        if stream is not None:
            verdict = {True: "killed", False: "SURVIVED", None: "not run"}[tested.killed]
            print(f"tests     {name:<58} {tested.seconds:7.1f}s  {verdict}: {tested.detail}",
                  file=stream, flush=True)  # fmt: skip
    return out


def summary(tested: list[Tested]) -> str:
    killed = sum(t.killed is True for t in tested)
    return f"mutants against the tests: {killed}/{len(tested)} killed"
