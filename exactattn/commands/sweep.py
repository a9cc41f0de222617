"""``exactattn sweep --preset NAME --out DIR [--targets NAME ...] [--resume] [--workers N]``.

Runs the preset's grid (:mod:`exactattn.precision.presets`), writes ``DIR/results.csv``
(one row per run), PNG plots and ``DIR/report.md``. ``--targets`` runs registry names
instead of the preset's configurations on its grid: exactattn's (``np-fa2-fp16``,
``emu8-rz``…) and foreign ones (``sdpa``, ``sdpa-math``, ``flex``, ``sdpa[bfloat16]``…), so
a foreign kernel's drift lands in the same CSV, plots and report. ``--list`` prints the
presets, ``--scheduler ADDRESS`` sends the tasks to a Dask cluster, ``--time-reference N D``
times the certified references (arb, float64).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..infra import executors
from ..precision.presets import PRESETS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exactattn sweep", description=__doc__.split("\n")[2])
    parser.add_argument("--preset", default="quick", help=f"one of {sorted(PRESETS)}")
    parser.add_argument("--out", default="sweep-out", help="output directory")
    parser.add_argument(
        "--targets",
        nargs="+",
        metavar="NAME",
        help="registry names to run on the preset's grid instead of its configurations",
    )
    parser.add_argument("--resume", action="store_true", help="keep the rows already in the CSV")
    executors.add_arguments(parser, default_workers=2)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--list", action="store_true", help="list the presets and exit")
    parser.add_argument(
        "--time-reference",
        nargs=2,
        type=int,
        metavar=("N", "D"),
        help="time each certified reference a sweep would use at n=N, d=D (arb where "
        "affordable, with --workers processes, and float64), forward + backward up to "
        "n=8192 and the forward beyond: one line 'reference NAME n=N d=D PASS: S s wall, "
        "radius R' each",
    )
    return parser


def _time_reference(n: int, d: int, workers: int) -> int:
    from ..precision.timing import time_reference

    for t in time_reference(n, d, workers=workers):
        print(
            f"reference {t['name']} n={t['n']} d={t['d']} {t['pass']}: "
            f"{t['seconds']:.2f} s wall, radius {t['radius']:.3g}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.time_reference:
        return _time_reference(*args.time_reference, max(args.workers, 1))
    if args.list:
        for name, preset in PRESETS.items():
            print(f"{name:<8} {preset['description']}")
        return 0
    if args.preset not in PRESETS:
        print(
            f"exactattn sweep: unknown preset {args.preset!r}; choose one of {sorted(PRESETS)}",
            file=sys.stderr,
        )
        return 2
    wrong = executors.check_arguments(args)
    if wrong is not None:
        print(f"exactattn sweep: {wrong}", file=sys.stderr)
        return 2
    chosen = None
    if args.targets:
        from .. import targets
        from ..precision.configs import sweep_names

        try:
            chosen = sweep_names(args.targets)
        except (targets.UnknownTarget, ValueError) as error:
            print(f"exactattn sweep: {error}", file=sys.stderr)
            return 2
    import pandas as pd

    from ..precision.plots import all_plots
    from ..precision.sweep_report import write_report
    from ..precision.sweep_run import run_sweep

    try:
        result = run_sweep(
            args.preset,
            args.out,
            resume=args.resume,
            workers=args.workers,
            scheduler=args.scheduler,
            progress=not args.no_progress,
            targets=chosen,
        )
    except executors.SchedulerUnreachable as error:
        print(f"exactattn sweep: {error}", file=sys.stderr)
        return 2
    df = pd.read_csv(result.csv_path)
    plots = all_plots(df, args.out)
    report = write_report(
        df,
        args.out,
        preset=args.preset,
        description=PRESETS[args.preset]["description"],
        seconds=result.seconds,
        plots=plots,
        skipped=result.skipped,
    )
    print(
        f"{result.rows_written} rows written ({result.rows_kept} kept) in "
        f"{result.seconds:.1f} s -> {result.csv_path}, {report}, {len(plots)} plots"
    )
    for config, why in result.skipped.items():
        print(f"skipped {config}: {why}")
    print(f"results in {Path(args.out).resolve()}/ (results.csv, report.md, plots)")
    return 0
