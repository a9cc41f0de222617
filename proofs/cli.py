"""``exactattn prove [FAMILY ...] [--max-n N] [--report FILE] [--mutants] [--mutation-tests]``.

Runs the selected theorem families (every family but ``reach`` by default, the mutants
included), prints one line per obligation, writes a markdown certificate with ``--report``
and returns 1 if any obligation is not PROVED or any mutant is not killed (2 for a usage
error). ``--mutation-tests`` also runs the default test suite against every mutant and puts
the mutation table in the certificate.
"""

from __future__ import annotations

import argparse
import sys
import time
from types import ModuleType

from . import (
    dropout,
    engine,
    forward,
    general,
    monoid,
    mutants,
    mutation,
    overflow,
    reach,
    reverse,
    tiles,
)
from .certificate import certificate

FAMILIES: dict[str, ModuleType] = {
    "monoid": monoid,
    "forward": forward,
    "reverse": reverse,
    "general": general,
    "overflow": overflow,
    "tiles": tiles,
    "dropout": dropout,
    "mutants": mutants,
    "reach": reach,
}
NOT_BY_DEFAULT = ("reach",)
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
        help=f"families to run (default: all but reach): {', '.join(FAMILIES)}",
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
    parser.add_argument(
        "--mutation-tests",
        action="store_true",
        help="also run the default tests against every mutant (minutes); table in --report",
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
    selected = selected or [f for f in FAMILIES if f not in NOT_BY_DEFAULT]
    start = time.perf_counter()
    outcomes: list[engine.Outcome] = []
    for name in selected:
        outcomes += engine.run(FAMILIES[name].obligations(args.max_n))
    tested = mutation.run_all() if args.mutation_tests else None
    seconds = time.perf_counter() - start
    print(engine.summary(outcomes, seconds))
    if tested is not None:
        print(mutation.summary(tested))
    if args.report:
        theorems = {name: FAMILIES[name].__doc__ or "" for name in selected}
        command = "exactattn prove " + " ".join(sys.argv[1:] if argv is None else argv)
        text = certificate(outcomes, seconds, theorems, command.strip(), tested)
        with open(args.report, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"certificate written to {args.report}")
    survived = tested is not None and not all(t.killed for t in tested)
    return 0 if all(o.ok for o in outcomes) and not survived else 1
