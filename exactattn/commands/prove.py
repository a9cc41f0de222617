"""``exactattn prove [FAMILY ...] [--max-n N] [--report FILE] [--mutants] [--mutation-tests]``
``[--workers N | --scheduler ADDRESS] [--timeout S] [--journal FILE [--resume]] [--no-progress]``
and ``exactattn prove --mask-mod module:fn [--score-mod module:fn] [--batch B] [--heads H]``.

Runs the selected theorem families of :mod:`exactattn.proofs` (every family but ``reach``
by default, the mutants included), prints one line per obligation, writes a markdown
certificate with ``--report`` and returns 1 if any obligation is not PROVED (SKIPPED, for a
missing optional solver, is not a failure) or any mutant is not killed, 2 for a usage
error. ``--mutation-tests`` also runs the default test suite against every mutant and puts
the mutation table in the certificate. ``--mask-mod`` / ``--score-mod`` prove a user's
FlexAttention program instead (forward and reverse, every n ≤ N and every block size; see
:mod:`exactattn.proofs.families.flex_program`). ``python -m exactattn.proofs`` (or ``python -m
proofs`` in a checkout) is the same command.

The obligations run in this process, in ``--workers N`` local processes or on the Dask
cluster of ``--scheduler ADDRESS``, with the same lines and certificate (timings aside); a
program given as ``file.py:fn`` must be readable at that path on the workers.
``--timeout S`` ends an obligation that has no verdict after S seconds (TIMEOUT, a
failure). ``--journal FILE`` writes each verdict as it is reached; after an interruption
(exit status 130) the same command with ``--resume`` checks only the rest. A progress bar
with the time left is drawn on a terminal (``--no-progress``: none).
"""

from __future__ import annotations

import argparse
import sys

from ..infra import executors


def _parser(
    families: list[str], default_max_n: int, tiles_n: tuple[int, int]
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exactattn prove",
        description="Symbolic proofs that the library's tiled attention is exact.",
    )
    parser.add_argument(
        "families",
        nargs="*",
        metavar="FAMILY",
        help=f"families to run (default: all but reach): {', '.join(families)}",
    )
    parser.add_argument(
        "--max-n",
        type=int,
        default=default_max_n,
        metavar="N",
        help=f"largest n for the forward and reverse grids (default {default_max_n}); the "
        f"tiles family's exhaustive check goes to max({tiles_n[0]}, N) for single masks and "
        f"max({tiles_n[1]}, N) for compositions",
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
    program = parser.add_argument_group("a user's FlexAttention program (runs it alone)")
    program.add_argument("--mask-mod", metavar="MODULE:FN", help="mask_mod(b, h, q_idx, kv_idx)")
    program.add_argument(
        "--score-mod", metavar="MODULE:FN", help="score_mod(score, b, h, q_idx, kv_idx)"
    )
    program.add_argument(
        "--all-n",
        action="store_true",
        help="also prove the mask_mod for every length (traced into z3)",
    )
    program.add_argument(
        "--assume",
        action="append",
        default=[],
        metavar="ARRAY:nondecreasing",
        help="what holds of an array the mask_mod reads (for --all-n; repeatable)",
    )
    program.add_argument(
        "--block-mod",
        metavar="MODULE:FN",
        help="a block structure fn(b, h, q_block, kv_block) -> 0 EMPTY / 1 PARTIAL / 2 FULL "
        "to prove sound for every length (with --all-n)",
    )
    program.add_argument("--batch", type=int, default=1, metavar="B", help="batch size (1)")
    program.add_argument("--heads", type=int, default=1, metavar="H", help="heads (1)")
    running = parser.add_argument_group("where and how the obligations run")
    executors.add_arguments(running)
    running.add_argument(
        "--timeout", type=float, default=None, metavar="S", help="seconds per obligation"
    )
    running.add_argument(
        "--journal", metavar="FILE", help="write each verdict here as it is reached"
    )
    running.add_argument(
        "--resume", action="store_true", help="keep the verdicts --journal FILE already holds"
    )
    running.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _program(args: argparse.Namespace) -> object:
    """The user's program from ``--mask-mod`` / ``--score-mod``, or None; ValueError if bad."""
    from ..proofs import proof_run

    if args.mask_mod is None and args.score_mod is None:
        return None
    if args.families:
        raise ValueError("--mask-mod/--score-mod run the program alone; name no FAMILY")
    if args.batch < 1 or args.heads < 1:
        raise ValueError(f"--batch and --heads must be >= 1; got {args.batch}, {args.heads}")
    assume = []
    for item in args.assume:
        name, _, constraint = item.partition(":")
        if not name or constraint != "nondecreasing":
            raise ValueError(f"--assume takes ARRAY:nondecreasing; got {item!r}")
        assume.append((name, constraint))
    if (args.assume or args.block_mod) and not args.all_n:
        raise ValueError("--assume and --block-mod are for --all-n; add --all-n")
    if args.all_n and args.mask_mod is None:
        raise ValueError("--all-n proves a mask_mod for every length; give --mask-mod")
    ref = proof_run.ProgramRef(
        args.mask_mod,
        args.score_mod,
        (args.batch, args.heads),
        args.all_n,
        tuple(assume),
        args.block_mod,
    )
    ref.load()  # a bad reference is a usage error here, not a LOST obligation per worker
    return ref


# options that say where and how a run goes, and the number of values each takes
RUNNING = {
    "--workers": 1, "--jobs": 1, "--scheduler": 1, "--journal": 1, "--resume": 0,
    "--no-progress": 0,
}  # fmt: skip


def _what_is_proved(argv: list[str]) -> list[str]:
    """``argv`` without the options that say only where and how the run went (workers,
    scheduler, journal, progress): the certificate is the same however it was reached."""
    out, skip = [], 0
    for arg in argv:
        name = arg.split("=", 1)[0]
        if skip:
            skip -= 1
        elif name in RUNNING:
            skip = RUNNING[name] if "=" not in arg else 0
        else:
            out.append(arg)
    return out


def _usage(args: argparse.Namespace) -> str | None:
    """What is wrong with the running options, or None."""
    wrong = executors.check_arguments(args)
    if wrong is None and args.timeout is not None and not args.timeout > 0:
        wrong = f"--timeout must be a positive number of seconds; got {args.timeout}"
    if wrong is None and args.resume and not args.journal:
        wrong = "--resume needs --journal FILE (the journal of the run to resume)"
    return wrong


def main(argv: list[str] | None = None) -> int:
    from ..proofs import proof_run
    from ..proofs.families import tiles

    argv = sys.argv[1:] if argv is None else argv
    parser = _parser(
        list(proof_run.FAMILIES), proof_run.DEFAULT_MAX_N, (tiles.SINGLE_N, tiles.COMPOSITE_N)
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    unknown = [f for f in args.families if f not in proof_run.FAMILIES]
    if unknown:
        print(
            f"exactattn prove: unknown family {unknown}; choose from {list(proof_run.FAMILIES)}",
            file=sys.stderr,
        )
        return 2
    if args.max_n < 1:
        print(f"exactattn prove: --max-n must be >= 1; got {args.max_n}", file=sys.stderr)
        return 2
    wrong = _usage(args)
    if wrong is not None:
        print(f"exactattn prove: {wrong}", file=sys.stderr)
        return 2
    try:
        program = _program(args)
    except (ValueError, ImportError) as error:
        print(f"exactattn prove: {error}", file=sys.stderr)
        return 2
    selected = list(dict.fromkeys(args.families + (["mutants"] if args.mutants else [])))
    try:
        return proof_run.run(
            selected or proof_run.default_families(),
            args.max_n,
            report=args.report,
            mutation_tests=args.mutation_tests,
            command=" ".join(["exactattn prove", *_what_is_proved(argv)]),
            program=program,
            workers=args.workers,
            scheduler=args.scheduler,
            timeout=args.timeout,
            journal=args.journal,
            resume=args.resume,
            progress=not args.no_progress and sys.stderr.isatty(),
        )
    except (executors.SchedulerUnreachable, ValueError) as error:
        print(f"exactattn prove: {error}", file=sys.stderr)
        return 2
