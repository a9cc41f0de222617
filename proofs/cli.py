"""``exactattn prove [FAMILY ...] [--max-n N] [--report FILE] [--mutants]``.

Runs the selected theorem families (all six by default, the mutants included), prints
one line per obligation, writes a markdown certificate with ``--report`` and returns 1
if any obligation is not PROVED or any mutant is not REFUTED (2 for a usage error).
"""

from __future__ import annotations

import argparse
import sys
import time
from types import ModuleType

from . import engine, forward, general, monoid, mutants, overflow, reverse

FAMILIES: dict[str, ModuleType] = {
    "monoid": monoid,
    "forward": forward,
    "reverse": reverse,
    "general": general,
    "overflow": overflow,
    "mutants": mutants,
}
DEFAULT_MAX_N = 4


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exactattn prove",
        description="Symbolic proofs that the library's tiled attention is exact.",
    )
    parser.add_argument(
        "families",
        nargs="*",
        metavar="FAMILY",
        help=f"families to run (default: all): {', '.join(FAMILIES)}",
    )
    parser.add_argument(
        "--max-n",
        type=int,
        default=DEFAULT_MAX_N,
        metavar="N",
        help=f"largest n for the forward and reverse grids (default {DEFAULT_MAX_N})",
    )
    parser.add_argument("--report", metavar="FILE", help="write a markdown certificate here")
    parser.add_argument(
        "--mutants",
        action="store_true",
        help="run the refutations of broken variants (alone, or with the FAMILYs named)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        print(
            f"exactattn prove: unknown family {unknown}; choose from {list(FAMILIES)}",
            file=sys.stderr,
        )
        return 2
    if args.max_n < 1:
        print(f"exactattn prove: --max-n must be >= 1; got {args.max_n}", file=sys.stderr)
        return 2
    selected = list(dict.fromkeys(args.families + (["mutants"] if args.mutants else [])))
    selected = selected or list(FAMILIES)
    start = time.perf_counter()
    outcomes: list[engine.Outcome] = []
    for name in selected:
        outcomes += engine.run(FAMILIES[name].obligations(args.max_n))
    seconds = time.perf_counter() - start
    print(engine.summary(outcomes, seconds))
    if args.report:
        theorems = {name: FAMILIES[name].__doc__ or "" for name in selected}
        command = "exactattn prove " + " ".join(sys.argv[1:] if argv is None else argv)
        with open(args.report, "w", encoding="utf-8") as fh:
            fh.write(engine.certificate(outcomes, seconds, theorems, command.strip()))
        print(f"certificate written to {args.report}")
    return 0 if all(o.ok for o in outcomes) else 1
