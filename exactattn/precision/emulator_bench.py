"""Speed of the emulated format against mpmath emulation at the same width, in one run.

Times the tiled forward + backward (``attention`` then ``attention_backward``) on
:class:`~exactattn.backends.emulated_backend.EmulatedContext` (both granularities) and on
:class:`~exactattn.backends.MpmathContext` at ``prec = bits``, interleaved over repeats so
machine noise hits all three, and reports medians and the ratio mpmath / emulator. The
input checks (``check_finite``) are off on every side: this measures the arithmetic.
:func:`largest_n` doubles ``n`` while the predicted next run (4× the last: the work grows
as n²) stays within a time budget. :func:`exp_log_agreement` counts how often the
emulator's ``exp``/``log`` (libm in float64, then rounded) and mpmath's at ``prec = p``
miss the correctly rounded value (mpmath 64 bits wider, rounded once).

    python -m exactattn.precision.emulator_bench --n 64 --d 16 --bits 11 --budget 60
    python -m exactattn.precision.emulator_bench --n --budget 0 --agreement 20000
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import mpmath
import numpy as np

from ..api import attention, attention_backward
from ..backends import MpmathContext
from ..backends.emulated_backend import GRANULARITIES, EmulatedContext
from ..backends.protocol import ArrayContext


def forward_backward_seconds(ctx: ArrayContext, n: int, d: int, block_size: int) -> float:
    """Wall time of one tiled forward + backward on N(0,1) inputs of shape (n, d)."""
    q, k, v, g = np.random.default_rng(0).standard_normal((4, n, d))
    keywords = dict(block_size=block_size, backend=ctx, check_finite=False)
    start = time.perf_counter()
    y, stats = attention(q, k, v, return_stats=True, **keywords)
    attention_backward(q, k, v, y, stats, g, **keywords)
    return time.perf_counter() - start


def compare(n: int, d: int, bits: int, block_size: int, repeats: int) -> list[dict[str, Any]]:
    """One row per system: median seconds over ``repeats`` and mpmath's time / its time."""
    systems = {f"emulated {g}": EmulatedContext(bits, granularity=g) for g in GRANULARITIES}
    systems["mpmath"] = MpmathContext(bits)
    times: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(repeats):
        for name, ctx in systems.items():
            times[name].append(forward_backward_seconds(ctx, n, d, block_size))
    mpmath_s = statistics.median(times["mpmath"])
    return [
        {
            "n": n,
            "d": d,
            "bits": bits,
            "system": name,
            "seconds": statistics.median(ts),
            "mpmath / this": mpmath_s / statistics.median(ts),
        }
        for name, ts in times.items()
    ]


def largest_n(
    d: int, bits: int, block_size: int, budget_s: float, granularity: str, start: int = 64
) -> dict[str, Any]:
    """The largest ``n = start·2^j`` whose forward + backward ran within ``budget_s``."""
    ctx = EmulatedContext(bits, granularity=granularity)
    n, seconds = start, forward_backward_seconds(ctx, start, d, block_size)
    while 4 * seconds <= budget_s:
        n, seconds = 2 * n, forward_backward_seconds(ctx, 2 * n, d, block_size)
    return {"d": d, "bits": bits, "system": f"emulated {granularity}", "n": n, "seconds": seconds}


def exp_log_agreement(bits: int, count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Per function: distinct ``p``-bit arguments, and how many of them the emulator and
    mpmath at ``prec = p`` round differently from the correctly rounded value (worst
    emulator distance in ulps of the format)."""
    rng = np.random.default_rng(seed)
    ctx = EmulatedContext(bits)
    rows = []
    for name, fn, raw in (
        ("exp", np.exp, rng.uniform(-40, 10, count)),
        ("log", np.log, np.exp2(rng.uniform(-60, 60, count))),
    ):
        args = np.unique(ctx.asarray(raw).view(np.ndarray))
        emulated = np.asarray(fn(ctx.asarray(args)))
        mp_fn = getattr(mpmath, name)
        with mpmath.workprec(bits + 64):
            wide = [mp_fn(mpmath.mpf(float(x))) for x in args]
        with mpmath.workprec(bits):
            correct = np.array([float(+w) for w in wide])
            by_mpmath = np.array([float(mp_fn(mpmath.mpf(float(x)))) for x in args])
        missed = emulated != correct
        ulps = np.abs(emulated - correct)[missed] / np.exp2(
            np.floor(np.log2(np.abs(correct[missed]))) - bits + 1
        )
        rows.append(
            {
                "bits": bits,
                "function": name,
                "arguments": args.size,
                "emulator misrounded": int(missed.sum()),
                "worst (ulps)": float(ulps.max(initial=0.0)),
                "mpmath misrounded": int((by_mpmath != correct).sum()),
            }
        )
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{row[k]:.3g}" if isinstance(row[k], float) else str(row[k]) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="*", default=[64], help="sizes mpmath finishes")
    parser.add_argument("--d", type=int, default=16)
    parser.add_argument("--bits", type=int, default=11, help="significand bits p")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds for largest_n")
    parser.add_argument(
        "--agreement", type=int, default=0, help="exp/log arguments per width 2..52 (0: skip)"
    )
    args = parser.parse_args(argv)
    rows = [r for n in args.n for r in compare(n, args.d, args.bits, args.block_size, args.repeats)]
    if rows:
        print(_table(rows), flush=True)
    if args.budget > 0:
        largest = [
            largest_n(args.d, args.bits, args.block_size, args.budget, g) for g in GRANULARITIES
        ]
        print(f"\nlargest n within {args.budget:g} s (forward + backward):\n" + _table(largest))
    if args.agreement:
        agreement = [r for p in range(2, 53) for r in exp_log_agreement(p, args.agreement)]
        print("\nexp/log against the correctly rounded value:\n" + _table(agreement))


if __name__ == "__main__":
    main()
