"""``exactattn main``: the project's main job — the symbolic proofs, then the quick sweep.

1. ``exactattn prove`` (every family, mutants included): the library's tiled code over
   sympy equals naive attention and its derivative, and every broken variant is refuted;
2. ``exactattn sweep --preset quick``: how far float arithmetic drifts from the certified
   reference, written as CSV, plots and a markdown report under ``--out``.

Exits non-zero if either step fails.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="exactattn main", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="sweep-results", help="folder for the sweep's output")
    parser.add_argument("--report", default=None, help="also write the proof certificate here")
    args = parser.parse_args(argv)

    from .prove import main as prove
    from .sweep import main as sweep

    print("== exactattn prove ==", flush=True)
    proved = prove([] if args.report is None else ["--report", args.report])
    print("\n== exactattn sweep --preset quick ==", flush=True)
    swept = sweep(["--preset", "quick", "--out", args.out])
    print(
        "\n== results ==\nproofs: the lines above"
        + (f", certificate {args.report}" if args.report else "")
        + f"\nsweep: {Path(args.out).resolve()}/ (results.csv, report.md, plots)"
    )
    return 1 if proved or swept else 0


if __name__ == "__main__":
    raise SystemExit(main())
