"""Small calls: ``exactattn.torch`` against torch SDPA per call, side by side in one run.

Small problems are where per-call validation and planning could dominate the arithmetic.
Cases (B, H, n_q, d) against n_k keys, float32 on the CPU:

* ``decode`` — one query per head against a 4096-key cache, the forward of a decode step
  (target: within 3x SDPA);
* ``self-256`` — (1, 8, 256, 64) self-attention, the forward and forward + backward
  (target: within 2x SDPA);
* ``tiny`` — one query against 64 keys: the fixed per-call cost on its own.

Each case times ``torch.nn.functional.scaled_dot_product_attention``,
:func:`exactattn.torch.scaled_dot_product_attention` (the drop-in) and
:func:`exactattn.torch.attention` (the strict API, checks on), their calls interleaved so
machine noise hits all three; reported: the median CPU time per call of the process
(``time.process_time``, immune to other processes on a shared machine with one torch
thread), the median wall time, and the ratios to SDPA.

    python -m exactattn.torch_bench_small --threads 1 --repeats 200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

CASES = {
    "tiny": ((1, 8, 1, 64), 64, ("fwd",)),
    "decode": ((1, 8, 1, 64), 4096, ("fwd",)),
    "self-256": ((1, 8, 256, 64), 256, ("fwd", "fwd+bwd")),
}
IMPLS = ("sdpa", "exact_sdpa", "attention")


def _calls(case: str, seed: int = 0) -> dict[tuple[str, str], Callable[[], Any]]:
    import torch
    import torch.nn.functional as F

    import exactattn.torch as et

    (b, h, n_q, d), n_k, passes = CASES[case]
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n_q, d, generator=generator)
    k, v = (torch.randn(b, h, n_k, d, generator=generator) for _ in range(2))
    g = torch.randn(b, h, n_q, d, generator=generator)
    functions = {
        "sdpa": F.scaled_dot_product_attention,
        "exact_sdpa": et.scaled_dot_product_attention,
        "attention": et.attention,
    }
    calls = {}
    for name, fn in functions.items():
        if "fwd" in passes:
            calls[name, "fwd"] = _forward(fn, q, k, v)
        if "fwd+bwd" in passes:
            calls[name, "fwd+bwd"] = _forward_backward(fn, q, k, v, g)
    return calls


def _forward(fn, q, k, v) -> Callable[[], Any]:
    import torch

    def call() -> Any:
        with torch.no_grad():
            return fn(q, k, v)

    return call


def _forward_backward(fn, q, k, v, g) -> Callable[[], Any]:
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]

    def call() -> Any:
        for x in leaves:
            x.grad = None
        fn(*leaves).backward(g)
        return [x.grad for x in leaves]

    return call


def time_case(case: str, repeats: int) -> list[dict[str, Any]]:
    """One row per pass: median CPU and wall microseconds per call, ratios to SDPA."""
    calls = _calls(case)
    for fn in calls.values():  # warm-up: first-call allocations, caches
        fn()
    samples: dict[Any, list[tuple[float, float]]] = {key: [] for key in calls}
    for _ in range(repeats):
        for key, fn in calls.items():
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            samples[key].append((time.perf_counter() - wall, time.process_time() - cpu))
    rows = []
    for pass_ in CASES[case][2]:
        row: dict[str, Any] = {"case": case, "pass": pass_}
        for impl in IMPLS:
            runs = samples[impl, pass_]
            row[f"{impl}_cpu_us"] = 1e6 * statistics.median(s[1] for s in runs)
            row[f"{impl}_wall_us"] = 1e6 * statistics.median(s[0] for s in runs)
        for impl in IMPLS[1:]:
            row[f"{impl}_ratio_cpu"] = row[f"{impl}_cpu_us"] / row["sdpa_cpu_us"]
            row[f"{impl}_ratio_wall"] = row[f"{impl}_wall_us"] / row["sdpa_wall_us"]
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], threads: int, repeats: int) -> str:
    lines = [
        f"float32 CPU, torch threads = {threads}, median of {repeats} interleaved calls; "
        "µs per call as CPU time (wall in brackets); ratio = ours / SDPA (CPU time)",
        "",
        "| case | pass | SDPA µs | exact SDPA µs | ratio | attention µs | ratio |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        cells = [f"{r[f'{i}_cpu_us']:.0f} ({r[f'{i}_wall_us']:.0f})" for i in IMPLS]
        lines.append(
            f"| {r['case']} | {r['pass']} | {cells[0]} | {cells[1]} "
            f"| {r['exact_sdpa_ratio_cpu']:.2f}x | {cells[2]} | {r['attention_ratio_cpu']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m exactattn.torch_bench_small", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    import torch

    torch.set_num_threads(args.threads)
    rows = [row for case in args.cases for row in time_case(case, args.repeats)]
    print(markdown(rows, args.threads, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
