"""``exactattn check``: any attention implementation against the certified reference.

    exactattn check TARGET [TARGET ...] [--profile smoke|default|deep] [--examples N]
                    [--dtypes D [D ...]] [--max-n N]
                    [--grads | --no-grads] [--seed S] [--device cpu|cuda]
                    [--workers N | --scheduler ADDRESS] [--journal FILE [--resume]]
                    [--report DIR] [--save-failures DIR] [--convention C] [--claim TEXT]
                    [--supports TEXT] [--list] [--replay FILE]
                    [--mask-mod MODULE:FN] [--score-mod MODULE:FN]

TARGET is a registry name (``--list``), ``mpN``, or your own function as
``package.module:function`` or ``path/to/file.py:function`` (``--convention sdpa|flash|
exactattn|hf``, ``--claim input=fp16,scores=fp32,stats=fp32,p=fp16,acc=fp32,block=128``,
``--supports masks=none+causal,gqa=no,...`` for what it takes). Prints one line per variant
(target × dtype): cases run, skipped, failed, the forward error, the ratio to naive attention
in the same dtype and to the FlashAttention-2 policy, the vacuous-bound share; a coverage
table (cases per calling path, n_q != n_k, decode, GQA, >= 2 and >= 8 claimed blocks,
n_k % b != 0, largest n, vacuous share, which reference served); a known upstream bug as
KNOWN-UPSTREAM; each failure as a shrunk counterexample with its replay file.
``--mask-mod`` / ``--score-mod`` (``module:fn`` or ``file.py:fn``, FlexAttention's
signatures): every case runs the user's program — the reference evaluates the mask_mod on
the whole index grid and the score_mod over arb balls — and the targets that run a program
themselves (``flex``, exactattn's own) are judged on it; the others skip with the reason.
``--report DIR`` writes ``report.md`` and ``report.json``. Exit status 0 only when nothing
failed (1: a failure; 2: bad usage; 130: interrupted, the report then holds what was seen).

The cases are drawn from ``--seed`` before any is judged, then judged in this process, in
``--workers N`` local processes or on the Dask cluster of ``--scheduler ADDRESS`` (the
workers rebuild the targets by name: a ``file.py:function`` must be readable there): the
same report either way; failures are shrunk in this process. ``--journal FILE`` writes each
judged case as it arrives; after an interruption the same command with ``--resume`` judges
only the rest.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

from ..backends.formats import format_names
from ..infra import executors
from ..testing.profiles import PROFILES

DEFAULT_FAILURES = "check-failures"


EPILOG = """your own function (MODULE:FUNCTION or path/to/file.py:FUNCTION):
  its signature decides what it is given: without enable_gqa, GQA cases get K, V expanded
  over each group; without dropout_p, no dropout case and no dropout probe (said once).
  --claim states its arithmetic, from which the tolerance is derived (default: the input
  dtype throughout, key blocks unstated = the worst case); --supports says what it takes
  (anything else is skipped with the reason). For example:

  exactattn check mykernels.py:attention --convention sdpa \\
      --claim scores=fp32,stats=fp32,acc=fp32,block=128 \\
      --supports masks=none+causal,gqa=no,dropout=no,bias=yes,empty_rows=no

  --claim keys: input, scores, stats, p, acc (formats: fp16, bf16, fp32, fp64, ...);
  unstated ones follow input, and an unstated input is each run's dtype (with --dtypes
  float32 float16: fp32 in the float32 run, fp16 in the float16 one), while a stated
  input=fp16 holds for every dtype run (a kernel that casts whatever it gets to fp16).
  block: the key-block size the bound assumes (an integer, naive for one block over all
  keys; unstated: one key per block, the worst case). For a merge (fa4-combine,
  xformers-merge, flashinfer-merge) leave block unstated: the parts are the case's drawn
  split boundaries, which fall inside blocks as well as on their edges, and the worst case
  charges a merge at any of them. group=input (a GQA backward that sums each group's per-head
  dK, dV in the input dtype), dp=input (a backward that rounds dP = G·Vᵀ to the input
  dtype, as autodiff through a P·V product in it does). --supports keys: dtypes (joined by
  + or spaces, as --dtypes), devices, masks (joined by +); grads, dropout (yes/no/own),
  lse, gqa, cross, empty_rows, bias, softcap, program, equal_head_dims (yes/no). The
  defaults follow the convention's library: under sdpa a row with no allowed key is judged
  (torch SDPA returns 0 there; empty_rows=no for a kernel that leaves it NaN), a bias and a
  soft-cap are not given unless told.
"""


def _parser(prog: str = "exactattn check") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("targets", nargs="*", metavar="TARGET")
    parser.add_argument(
        "--profile", default="default", choices=tuple(PROFILES),
        help="cases, sizes and budget: smoke (CI, <= 20 s), default (200 cases, n <= 2048, "
        "<= 2 min), deep (n_q = n_k <= 4096 with gradients, <= 20 min), long (n = 16384 "
        "with gradients, 65536, 131072 the forward on strips of rows, <= 1 h a case, with "
        "an ETA; --max-n caps the lengths)",
    )  # fmt: skip
    parser.add_argument("--examples", type=int, default=None, help="cases (default: profile's)")
    parser.add_argument(
        "--dtypes", nargs="+", default=None,
        help="names, by spaces or + (float32+fp16); default: each target's own",
    )  # fmt: skip
    parser.add_argument(
        "--max-n", type=int, default=None, help="largest n_q, n_k (default: the profile's)"
    )
    parser.add_argument("--grads", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    executors.add_arguments(parser)
    parser.add_argument("--journal", metavar="FILE", help="write each judged case here")
    parser.add_argument("--resume", action="store_true", help="keep the cases --journal holds")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--report", metavar="DIR", default=None)
    parser.add_argument("--save-failures", metavar="DIR", default=None)
    parser.add_argument("--convention", default=None, help="for MODULE:FUNCTION targets")
    parser.add_argument(
        "--claim", default=None, help="claimed arithmetic of your target, e.g. "
        "scores=fp32,stats=fp32,acc=fp32,block=128 (see below)",
    )  # fmt: skip
    parser.add_argument(
        "--supports", default=None, help="what your target takes, e.g. "
        "masks=none+causal,gqa=no,dropout=no (see below)",
    )  # fmt: skip
    parser.add_argument("--list", action="store_true", help="list the targets and exit")
    parser.add_argument(
        "--discover",
        action="store_true",
        help="call each TARGET on tiny cases (dtypes, v != d, GQA, n_q != n_k, each mask "
        "kind, bias, negative scale, dropout, gradients) and print the --convention and "
        "--supports it takes, ready to paste",
    )
    parser.add_argument(
        "--zoo",
        action="store_true",
        help="every available foreign target (TARGETs: only these) at the profile, and write "
        "the zoo page (--zoo-out)",
    )
    parser.add_argument(
        "--zoo-out", metavar="FILE", default="zoo.md", help="the zoo page (default zoo.md)"
    )
    parser.add_argument("--replay", metavar="FILE", default=None, help="re-run a replay file")
    parser.add_argument("--no-determinism", action="store_true", help="skip the second run")
    parser.add_argument("--no-baselines", action="store_true", help="skip naive / FA-2 runs")
    parser.add_argument("--no-probes", action="store_true", help="skip the dropout probe")
    parser.add_argument("--progress", action="store_true", help="progress lines on stderr")
    parser.add_argument("--mask-mod", metavar="MODULE:FN", help="mask_mod(b, h, q_idx, kv_idx)")
    parser.add_argument(
        "--score-mod", metavar="MODULE:FN", help="score_mod(score, b, h, q_idx, kv_idx)"
    )
    return parser


def _error(text: str) -> int:
    print(f"exactattn check: {text}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None, prog: str = "exactattn check") -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(prog).parse_args(argv)
    args.argv = argv
    import importlib.util

    from .. import targets

    if importlib.util.find_spec("hypothesis") is None:
        return _error("the check draws cases with hypothesis: pip install 'exactattn[check]'")
    if args.list:
        return _list(args.device)
    try:
        spec = _spec(args)
    except ValueError as error:
        return _error(str(error))
    if args.replay:
        return _replay(args, spec)
    if args.zoo and not args.targets:
        from ..testing import zoo_page

        args.targets = zoo_page.targets()
    if not args.targets:
        return _error("name at least one TARGET (see --list)")
    profile = PROFILES[args.profile]
    args.examples = profile.examples if args.examples is None else args.examples
    args.max_n = profile.max_n if args.max_n is None else args.max_n
    if args.max_n < 1:
        return _error(f"--max-n must be >= 1; got {args.max_n}")
    if args.examples < 1:
        return _error(f"--examples must be >= 1; got {args.examples}")
    wrong = executors.check_arguments(args)
    if wrong is None and args.resume and not args.journal:
        wrong = "--resume needs --journal FILE (the journal of the run to resume)"
    if wrong is not None:
        return _error(wrong)
    try:
        chosen = [targets.get(name, **(spec if ":" in name else {})) for name in args.targets]
        dtypes = format_names(args.dtypes) if args.dtypes else None
        program = _program(args)
    except (ValueError, TypeError, IndexError) as error:
        return _error(str(error))
    if args.discover:
        return _discover(args, chosen, dtypes)
    if args.profile == "long":
        return _long(args, chosen, dtypes)
    return _check(args, chosen, dtypes, spec, program)


def _discover(args, chosen, dtypes) -> int:
    """``--discover``: each target's probes, then the flags that leave out what it refused."""
    from ..targets.target import FLOAT_DTYPES
    from ..testing.discover import discover, supports_text

    for target in chosen:
        outcomes = discover(target, dtypes or FLOAT_DTYPES)
        print(f"discover {target.name} ({target.convention} convention):")
        for o in outcomes:
            detail = f"  {o.detail}" if o.detail else ""
            print(f"  {o.probe.feature:<40} {o.status}{detail}")
        flags = f"--convention {target.convention}"
        text = supports_text(outcomes)
        flags += f" --supports {text}" if text else ""
        print(f"  flags: exactattn check {target.name} {flags}")
        failing = [o for o in outcomes if o.status == "fails"]
        if failing:
            print(
                f"  {len(failing)} probe(s) ran and FAILED: check reports them (no flag hides them)"
            )
    return 0


def _long(args, chosen, dtypes) -> int:
    """``--profile long`` (:mod:`exactattn.testing.long`): its own few cases, one line each."""
    from ..testing import long, session
    from ..testing.search import single_thread

    settings = session.Settings(dtypes=dtypes, device=args.device)
    variants, unavailable, unsupported = session.plan(chosen, settings)
    for name, why in unavailable.items():
        print(f"  unavailable: {name} ({why})")
    for name, missing in unsupported.items():
        print(f"  {name} does not take {', '.join(missing)}")
    sizes = tuple(n for n in long.SIZES if n <= args.max_n) or (args.max_n,)
    with single_thread():
        results = long.run_long(variants, sizes=sizes)
    failed = [r for r in results if r.finding.status == "fail"]
    counts = {s: sum(r.finding.status == s for r in results) for s in ("ok", "skip", "fail")}
    print(f"long: {counts['ok']} ok, {counts['skip']} skipped, {counts['fail']} failed")
    return 1 if failed else 0


def _program(args: argparse.Namespace) -> tuple[str | None, str | None] | None:
    """The user's ``(mask_mod, score_mod)`` references, tried once on the largest grid the
    check draws (B = 2, H = 6, n = --max-n): a reference that names nothing, a mask_mod that
    gives no booleans, a score_mod that calls torch on the score, an index out of range —
    each a clear error before any case is drawn."""
    from ..testing.user_program import try_program

    if args.mask_mod is None and args.score_mod is None:
        return None
    program = (args.mask_mod, args.score_mod)
    try_program(*program, args.max_n or PROFILES[args.profile].max_n)
    return program


def _spec(args: argparse.Namespace) -> dict:
    """Keywords for :func:`exactattn.targets.get` of a ``MODULE:FUNCTION`` target."""
    from .. import targets

    spec: dict = {}
    if args.convention:
        spec["convention"] = args.convention
    elif args.discover:
        spec["convention"] = _inferred_convention(args.targets)
    if args.claim:
        spec["claim"] = targets.Claim.parse(args.claim)
    if args.supports:
        base = targets.user_capabilities(args.convention or "sdpa")
        spec["supports"] = targets.Capabilities.parse(args.supports, base)
    return spec


def _inferred_convention(names: list[str]) -> str:
    """flash for a function with flash-attn's keywords (``causal``, ``softmax_scale``), else
    sdpa: what ``--discover`` assumes when ``--convention`` is not given."""
    from .. import targets
    from ..targets.signature import keywords_taken

    for name in names:
        if ":" in name:
            taken = keywords_taken(targets.load_callable(name)) or frozenset()
            if {"causal", "softmax_scale"} & taken and "is_causal" not in taken:
                return "flash"
    return "sdpa"


def _check(args, chosen, dtypes, spec, program) -> int:
    from ..infra.journal import Journal, code_fingerprint
    from ..testing import check_report, session

    profile = PROFILES[args.profile]
    settings = session.Settings(
        examples=args.examples,
        dtypes=dtypes,
        max_n=args.max_n,
        max_d=profile.max_d,
        budget=profile.budget,
        grads=args.grads,
        seed=args.seed,
        device=args.device,
        workers=args.workers,
        scheduler=args.scheduler,
        determinism=not args.no_determinism,
        baselines=not args.no_baselines,
        probes=not args.no_probes,
        progress=args.progress,
        program=program,
    )
    names = [(t.name, spec if ":" in t.name else {}) for t in chosen]
    journal = None
    try:
        if args.journal:
            what = dataclasses.asdict(settings)
            for running in ("workers", "scheduler", "progress"):
                del what[running]
            what = {"command": "check", **what, "targets": repr(names), "code": code_fingerprint()}
            journal = Journal(args.journal, what, args.resume)
        result = session.run(chosen, settings, names=names, journal=journal)
    except KeyboardInterrupt:  # outside the search (a reference, a probe): nothing to report
        print("exactattn check: interrupted", file=sys.stderr)
        return 130
    except (executors.SchedulerUnreachable, ValueError) as error:
        return _error(str(error))
    finally:
        if journal is not None:
            journal.close()
    folder = args.save_failures or args.report or DEFAULT_FAILURES
    failures = []
    seen = set()
    for finding, text in result.report.failures:
        if (finding.target, text) in seen:  # two workers shrank to the same counterexample
            continue
        seen.add((finding.target, text))
        target = result.targets.get(finding.target.split("[")[0])
        saved = _target_spec(target, spec)
        path = check_report.save_failure(finding, text, folder, saved)
        failures.append(check_report.counterexample(finding, text, path))
    failures += [f"FAIL dropout probe {p.target}: {p.detail}" for p in result.probes if not p.ok]
    _print(result, check_report.summary(result), failures)
    if seen:
        print(
            f"replay files: {len(seen)} in {Path(folder).resolve()}/ "
            "(exactattn check --replay FILE re-runs one)"
        )
    if args.report:
        md, js = check_report.write(result, args.report, failures)
        print(f"report: {md}, {js}")
    if args.zoo:
        _write_zoo(result, args)
    if result.report.interrupted:
        return 130
    return 1 if result.failed else 0


def _write_zoo(result, args) -> None:
    import os
    import shlex

    from ..testing import zoo_page

    command = "exactattn zoo " + shlex.join(a for a in args.argv if a != "--zoo")
    load = "load {:.1f}/{:.1f}/{:.1f} over 1/5/15 min".format(*os.getloadavg())
    times = os.times()  # this process and its finished worker processes
    cpu = times.user + times.system + times.children_user + times.children_system
    text = zoo_page.page(result, command.strip(), result.seconds, cpu, load)
    Path(args.zoo_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.zoo_out).write_text(text)
    print(f"zoo: {args.zoo_out}")


def _target_spec(target, spec: dict) -> dict | None:
    """What a replay needs to rebuild a user's target (None for registered ones)."""
    if target is None or ":" not in target.name:
        return None
    out = {"name": target.name, "convention": target.convention}
    if "claim" in spec:
        out["claim"] = spec["claim"].as_text()
    return out


def _print(result, rows, failures: list[str]) -> None:
    from ..testing import check_report, coverage, skips

    s = result.settings
    print(
        f"check: {result.report.examples} examples, {len(result.variants)} variants, "
        f"{result.seconds:.1f} s, seed {s.seed}, max n {s.max_n}, "
        f"gradients {'on' if s.grads else 'off'}, device {s.device}"
        + (" — INTERRUPTED (partial)" if result.report.interrupted else "")
    )
    for name, why in result.unavailable.items():
        print(f"  unavailable: {name} ({why})")
    for name, missing in result.unsupported_dtypes.items():
        print(f"  {name} does not take {', '.join(missing)}")
    for note in result.report.notes:
        print(f"  note: {note}")
    head = (
        f"  {'variant':<26} {'run':>5} {'skip':>5} {'fail':>4} {'fwd max':>9} {'ulps max':>9}"
        f" {'grad max':>9} {'/naive':>7} {'/FA-2':>7} {'vacuous':>8} {'/exp max':>8}"
        f" {'susp':>4}"
    )
    print(head)
    print(f"  {coverage.TABLE_LEGEND}")
    for r in rows:
        print(
            f"  {r['variant']:<26} {r['run']:>5} {r['skipped']:>5} {r['failed']:>4}"
            f" {_num(r['y_max']):>9} {_num(r['ulps_max']):>9} {_num(r['grads_max']):>9}"
            f" {_num(r['naive_median']):>7} {_num(r['fa2_median']):>7} {_num(r['vacuous']):>8}"
            f" {_num(r['expected_max']):>8} {r['suspicious']:>4}"
        )
    if result.compile:
        c = result.compile
        print(
            f"  flex: {c['compiles']} compiles {c['compile_seconds']:.1f} s, "
            f"{c['runs']} compiled runs {c['run_seconds']:.2f} s"
        )
    for p in result.probes:
        if not p.ran:
            print(f"  dropout probe {p.target}: not run, the target has no dropout ({p.detail})")
            continue
        state = "ok" if p.ok else f"FAIL: {p.detail}"
        print(f"  dropout probe {p.target}: keep rate {p.keep_rate:.4f} (p={p.p}) {state}")
    for line in coverage.table(result.report.coverage, result.variants):
        print(line)
    for line in skips.terminal(result):
        print(line)
    for line in check_report.known_upstream(result) + check_report.suspicious(rows):
        print(line)
    for text in failures:
        print(text)


def _num(x: float) -> str:
    return "–" if isinstance(x, float) and math.isnan(x) else f"{x:.3g}"


def _list(device: str) -> int:
    from .. import targets

    for name, target in targets.registry().items():
        why = targets.unavailable(target, device, quick=True)
        state = "available" if why is None else f"unavailable: {why}"
        print(f"{name:<18} {target.convention:<10} {state}")
        print(f"{'':<18} {target.description}")
    print("mpN                api        mpmath at N bits (any N >= 2)")
    print("MODULE:FUNCTION    --convention sdpa|flash|exactattn|hf, --claim, --supports")
    return 0


def _replay(args, spec: dict) -> int:
    from .. import targets
    from ..cases import Case
    from ..testing.case_check import Options, check_case
    from ..testing.check_report import counterexample
    from ..testing.known import UPSTREAM, UPSTREAM_STATUS, reclassify

    path = Path(args.replay)
    try:
        data = json.loads(path.read_text())
        case = Case.from_json(path.read_text())
    except (OSError, ValueError, TypeError) as error:
        return _error(f"cannot read replay file {path}: {error}")
    expect = data.get("expect", {})
    saved = expect.get("spec") or {}
    names = args.targets or [expect.get("target")]
    if saved:
        spec = {"convention": saved["convention"], **spec}
        if "claim" in saved:
            spec.setdefault("claim", targets.Claim.parse(saved["claim"]))
    try:
        units = [
            targets.variant(name, args.device, case.dtype, **(spec if ":" in name else {}))
            for name in names
        ]
    except (ValueError, TypeError) as error:
        return _error(str(error))
    by_name = {u.name: u for u in units}
    findings = [
        reclassify(by_name[f.target], case, f)
        for f in check_case(case, units, Options(grads=args.grads))
    ]
    bad = [f for f in findings if f.status == "fail"]
    for f in findings:
        if f.status == "fail":
            print(counterexample(f, case.to_json()))
        elif f.status == UPSTREAM_STATUS:
            print(f"KNOWN-UPSTREAM {f.target}: {UPSTREAM[f.detail].line()}")
        else:
            print(f"{f.target}: {f.status} {f.detail}".rstrip())
    if not findings:
        return _error(f"{names} did not take the case (dtype {case.dtype})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
