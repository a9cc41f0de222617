"""Validate :func:`exactattn.error.bounds.bounds` against real runs: ``python -m
tests.bounds.validate``.

Every target (NumPy fp16/fp32/fp64 and the FA-2 policy, naive attention in the same types,
mpmath at 8–24 bits, torch fp16/bf16/fp32, the torch path with its FA-2 policy and lse
statistics, FP8 p) runs on cases drawn from a seeded grid (input distributions N(0,1),
FA-3 outliers and large logits; no mask, causal, sliding window, key padding and random
masks; dropout, bias with −∞ entries, soft-cap, GQA, cross attention; block sizes from 1
to beyond n_k), and every output's error against the certified reference is divided by its
bound. Prints, per target, the worst and median ratio of Y, lse and the gradients (worst
over dQ, dK, dV) and how many runs had a vacuous (infinite) bound somewhere, writes every
run to a CSV, and exits 1 if any ratio exceeds 1.

Presets: ``quick`` (n ≤ 64, ~2 min on 2 cores) and ``full`` (adds n = 256 and 1024).
``--time N D`` only compares the bound's cost with the run it bounds and the reference.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

from exactattn.error.bounds import bounds

from .runs import GRADS, TARGETS, Case, Measurement, held_inputs, measure, reference

PRESETS = {  # n → cases drawn at that size
    "quick": {17: 24, 64: 12},
    "full": {17: 24, 64: 12, 256: 6, 1024: 3},
}
MAX_N_SLOW = 64  # mpmath emulations above this size take minutes per run
FEATURES = ("plain", "dropout", "bias", "softcap", "all", "gqa")


def draw_case(rng: random.Random, n: int, seed: int) -> Case:
    """One case at size ``n``: cross attention, odd block sizes and every feature appear."""
    n_k = n if rng.random() < 0.7 else max(1, n + rng.choice((-5, 7)))
    d = rng.choice((8, 16, 64)) if n >= 64 else rng.choice((4, 8, 16))
    feature = rng.choice(FEATURES)
    blocks = sorted({1, 3, 16, 64, 100, n_k, 2 * n_k})
    if n >= 256:
        blocks = [b for b in blocks if b >= 16]  # b = 1 at n = 1024 is a 1024-step loop
    heads, kv_heads = (4, 2) if feature == "gqa" else (1, 1)
    return Case(
        n_q=n,
        n_k=n_k,
        d=d,
        dv=rng.choice((d, 8)),
        heads=heads,
        kv_heads=kv_heads,
        dist=rng.choice(("normal", "outliers", "large")),
        mask=rng.choice(("none", "causal", "window", "padding", "random")),
        dropout=0.15 if feature in ("dropout", "all") else 0.0,
        bias=feature in ("bias", "all"),
        softcap=rng.choice((4.0, 20.0)) if feature in ("softcap", "all") else None,
        block=rng.choice(blocks),
        seed=seed,
    )


def cases(preset: str, seed: int) -> list[Case]:
    rng = random.Random(seed)
    out = []
    for n, count in PRESETS[preset].items():
        out += [draw_case(rng, n, seed * 1000 + len(out)) for _ in range(count)]
    return out


def _cell(xs: list[float], f) -> str:
    return f"{f(xs):.3g}" if xs else "-"


def summarise(runs: list[Measurement]) -> tuple[list[str], bool]:
    """Lines of the per-target table and whether every ratio is at most 1."""
    lines = [
        f"{'target':18s} {'runs':>4s} {'Y worst':>8s} {'Y med':>7s} {'lse worst':>9s} "
        f"{'lse med':>7s} {'grad worst':>10s} {'grad med':>8s} {'vacuous':>7s}"
    ]
    ok = True
    for name in TARGETS:
        mine = [m for m in runs if m.target == name]
        if not mine:
            continue
        y = [m.forward for m in mine]
        lse = [m.ratios["lse"] for m in mine if "lse" in m.ratios]
        grads = [m.grads for m in mine]
        worst = max(max(m.ratios.values()) for m in mine)
        ok &= worst <= 1
        lines.append(
            f"{name:18s} {len(mine):4d} {_cell(y, max):>8s} {_cell(y, statistics.median):>7s} "
            f"{_cell(lse, max):>9s} {_cell(lse, statistics.median):>7s} "
            f"{_cell(grads, max):>10s} {_cell(grads, statistics.median):>8s} "
            f"{sum(m.vacuous > 0 for m in mine):>7d}"
        )
    return lines, ok


def time_bound(n: int, d: int) -> None:
    """The bound's cost beside the run it bounds and the certified reference, same inputs."""
    case = Case(n_q=n, n_k=n, d=d, dv=d, mask="causal", block=64)
    target = TARGETS["np-fa2-fp16"]
    held = held_inputs(case, target)
    arith = target.make_arith(case)

    def bound() -> None:
        bounds(arith, *(held[x] for x in "qkvg"), allowed=held["allowed"], row_block=n)

    steps = {"bound": bound, "FA-2 run": lambda: target.run(case, held)}
    if n <= 1024:
        steps["reference"] = lambda: reference(case, held)
    seconds = {}
    for name, step in steps.items():
        t0 = time.perf_counter()
        step()
        seconds[name] = time.perf_counter() - t0
    others = {k: v for k, v in seconds.items() if k != "bound"}
    ratios = ", ".join(f"bound / {k} = {seconds['bound'] / v:.3g}" for k, v in others.items())
    print(f"n={n} d={d} forward+reverse, causal: {ratios}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--targets", nargs="*", default=None, help="default: all")
    parser.add_argument("--out", type=Path, default=Path("sweep-results/bound-validation.csv"))
    parser.add_argument(
        "--time", nargs=2, type=int, metavar=("N", "D"), help="only time the bound at n, d"
    )
    args = parser.parse_args(argv)
    if args.time:
        time_bound(*args.time)
        return 0
    names = args.targets or list(TARGETS)
    unknown = set(names) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; choose from {sorted(TARGETS)}")
    grid = cases(args.preset, args.seed)
    runs: list[Measurement] = []
    fields = [*asdict(Case()), "target", "ratio_y", "ratio_lse", *(f"ratio_{g}" for g in GRADS)]
    fields += ["ratio_dbias", "error_y", "radius", "vacuous", "seconds"]
    start = time.perf_counter()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for index, case in enumerate(grid):
            cache: dict = {}
            for name in names:
                target = TARGETS[name]
                if not target.supports(case) or (target.slow and case.n_k > MAX_N_SLOW):
                    continue
                t0 = time.perf_counter()
                m = measure(target, case, cache=cache)
                runs.append(m)
                row = {**asdict(case), "target": name, "radius": m.radius, "vacuous": m.vacuous}
                row.update({f"ratio_{k}": v for k, v in m.ratios.items()})
                row.update(error_y=m.errors.get("y"), seconds=time.perf_counter() - t0)
                writer.writerow(row)
                handle.flush()
                worst = max(m.ratios.values())
                if worst > 1 or not math.isfinite(worst):
                    print(f"BOUND EXCEEDED {name} {case} {m.ratios}", flush=True)
            print(
                f"[{index + 1}/{len(grid)}] {case.label()} ({time.perf_counter() - start:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    lines, ok = summarise(runs)
    print("\n".join(lines))
    print(f"{len(runs)} runs, every ratio <= 1: {ok}; CSV: {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
