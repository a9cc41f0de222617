"""``exactattn difftest``: every available backend against the certified reference.

    exactattn difftest [--examples N] [--backends NAME ...] [--seed S] [--max-n N]
                       [--workers N | --scheduler ADDRESS] [--journal FILE [--resume]]
                       [--save-failures DIR] [--no-progress] [--list]

Prints one line per target (cases judged; ok, refused with the API's overflow error where
the case's magnitudes reach the type's range, known (a reported bug, listed), failed; the
worst ``|error| / allowed``), the failures with their replay files, and exits 1 on any failure
(130 when interrupted). The cases are drawn from ``--seed`` before any is judged and are
judged in this process, in ``--workers N`` local processes or on the Dask cluster of
``--scheduler ADDRESS``: the same table either way; failures are shrunk in this process.
``--journal FILE`` writes each judged case as it arrives; after an interruption the same
command with ``--resume`` judges only the rest.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..difftest.campaign import run, save_failures
from ..difftest.targets import discover
from ..infra import executors
from ..testing.known import KNOWN_BUGS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exactattn difftest", description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=300, help="cases to draw (default 300)")
    parser.add_argument(
        "--backends",
        nargs="+",
        default=None,
        help="families (numpy mpmath sympy flint torch triton) or target names; default all",
    )
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    executors.add_arguments(parser, default_workers=min(2, os.cpu_count() or 1))
    parser.add_argument("--max-n", type=int, default=12, help="largest n_q, n_k (default 12)")
    parser.add_argument("--journal", metavar="FILE", help="write each judged case here")
    parser.add_argument("--resume", action="store_true", help="keep the cases --journal holds")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--save-failures", metavar="DIR", default=None)
    parser.add_argument("--list", action="store_true", help="list the available targets")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    wrong = executors.check_arguments(args)
    if args.examples < 1:
        wrong = f"--examples must be >= 1; got {args.examples}"
    if args.resume and not args.journal:
        wrong = "--resume needs --journal FILE (the journal of the run to resume)"
    if wrong is not None:
        print(f"exactattn difftest: {wrong}", file=sys.stderr)
        return 2
    if args.list:
        targets, missing = discover(args.backends)
        for t in targets:
            print(t.name)
        for family, why in missing.items():
            print(f"(absent) {family}: {why}")
        return 0
    try:
        report, names, missing = run(
            args.examples, args.backends, args.seed, args.workers, args.max_n,
            scheduler=args.scheduler, journal=args.journal, resume=args.resume,
            progress=not args.no_progress and sys.stderr.isatty(),
        )  # fmt: skip
    except (executors.SchedulerUnreachable, ValueError) as error:
        print(f"exactattn difftest: {error}", file=sys.stderr)
        return 2
    where = f"scheduler {args.scheduler}" if args.scheduler else f"workers {args.workers}"
    print(
        f"difftest: {report.examples} examples, {len(names)} targets, "
        f"{report.seconds:.1f} s, seed {args.seed}, {where}"
        + (" — INTERRUPTED (partial)" if report.interrupted else "")
    )
    for family, why in missing.items():
        print(f"  absent: {family} ({why})")
    print(
        f"  {'target':<48} {'judged':>7} {'ok':>7} {'refused':>8} {'known':>6} {'failed':>7}"
        f" {'worst':>8}"
    )
    for name in names:
        c = report.counts.get(name)
        if c is None:
            print(f"  {name:<48} {0:>7}")
            continue
        counts = f"{c['ok']:>7} {c['refused']:>8} {c['known']:>6} {c['fail']:>7}"
        print(f"  {name:<48} {c.total():>7} {counts} {report.worst.get(name, 0.0):>8.3g}")
    if any(c["known"] for c in report.counts.values()):
        for bug, text in KNOWN_BUGS.items():
            print(f"  known bug {bug}: {text}")
    for finding, _ in report.failures:
        print(f"FAIL {finding.target}: {finding.detail}")
    for note in report.notes:
        print(f"  note: {note}")
    if report.failures and args.save_failures:
        for path in save_failures(report, args.save_failures):
            print(f"  replay file: {path}")
    if report.interrupted:
        return 130
    return 1 if report.failures else 0
