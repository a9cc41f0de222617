"""Column (a) of the side-by-side measurement: ``exactattn check`` at its default profile.

Each row is checked in its own process, exactly as an author would run it::

    python -m exactattn.cli check MODULE:FUNCTION --convention C --claim ... \\
        --supports ... --no-probes

(``--profile default``: 200 cases, n ≤ 2048, the determinism rerun and the baselines on).
Exit 1 is "caught", exit 0 "passed"; anything else is recorded as an error with its tail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from side_by_side_rows import ROWS, Row


def command(row: Row) -> list[str]:
    """The ``exactattn check`` command line of ``row`` at the default profile."""
    return [sys.executable, "-m", "exactattn.cli", "check", row.target, "--convention",
            row.convention, "--claim", row.claim, "--supports", row.supports,
            "--profile", "default", "--no-probes"]  # fmt: skip


def check(row: Row, folder: str, timeout: float = 900) -> dict:
    """Run ``row``'s check; its verdict, exit code, seconds and the output's last lines."""
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command(row), capture_output=True, text=True, timeout=timeout,
            cwd=folder, env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )  # fmt: skip
        rc, tail = done.returncode, (done.stdout + done.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        rc, tail = None, f"timed out after {timeout} s"
    verdict = {1: "caught", 0: "missed"}.get(rc, "error")
    return {"row": row.name, "column": "exactattn", "verdict": verdict, "rc": rc,
            "seconds": round(time.perf_counter() - start, 1), "tail": tail}  # fmt: skip


def main(argv: list[str]) -> None:
    """``python docs/side_by_side_exactattn.py OUT.jsonl [ROW-SUBSTRING ...]``."""
    out, wanted = argv[0], argv[1:]
    folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(out, "a") as sink:
        for row in ROWS:
            if wanted and not any(w in row.name for w in wanted):
                continue
            record = check(row, folder)
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            print(record["row"], record["verdict"], record["seconds"], flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
