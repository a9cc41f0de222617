"""``exactattn bench-torch``: exactattn.torch.attention vs torch SDPA on the CPU, one run.

Both run at the same shape (default (1, 8, 4096, 64) float32) in the same process, their
repeats interleaved so machine noise hits both: the forward (under ``no_grad``) and the
forward + backward (``y.backward(G)``). SDPA on the CPU dispatches to its flash kernel
(``_scaled_dot_product_flash_attention_for_cpu``). Reported per pass: the median wall time,
the median CPU time of the process (``time.process_time``; with one thread it is immune
to other processes sharing the cores), their ratios ours / SDPA, and the peak memory.

Peak memory: tracemalloc does not see torch's allocations, so each (impl, pass) runs once
more in a fresh Python process (Linux) that makes glibc serve every allocation of 128 KiB
or more by ``mmap`` (``mallopt(M_MMAP_THRESHOLD)``, so freed buffers leave the resident
set at once), warms up, trims the heap, resets the resident-set high-water mark
(``/proc/self/clear_refs``) and reports ``VmHWM`` after the call minus ``VmRSS`` before it:
the most memory the call held at once beyond its inputs, outputs and gradients included.

    exactattn bench-torch --threads 1 --repeats 5 --md bench.md --csv bench.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

IMPLS = ("sdpa", "exactattn")
PASSES = ("fwd", "fwd+bwd")


def _inputs(shape: tuple[int, int, int, int], dtype: str, seed: int = 0):
    import torch

    generator = torch.Generator().manual_seed(seed)
    q, k, v, g = (
        torch.randn(shape, generator=generator, dtype=getattr(torch, dtype)) for _ in range(4)
    )
    return q, k, v, g


def _call(impl: str, pass_: str, q, k, v, g, block_size: int | None) -> Callable[[], Any]:
    """A closure running one pass of one implementation on fresh leaf tensors."""
    import torch
    import torch.nn.functional as F

    import exactattn.torch as et

    def attend(q, k, v):
        if impl == "sdpa":
            return F.scaled_dot_product_attention(q, k, v)
        return et.attention(q, k, v, block_size=block_size)

    if pass_ == "fwd":

        def forward() -> Any:
            with torch.no_grad():
                return attend(q, k, v)

        return forward

    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]

    def forward_backward() -> Any:
        for x in leaves:
            x.grad = None
        y = attend(*leaves)
        y.backward(g)
        return [x.grad for x in leaves]

    return forward_backward


def _clock(fn: Callable[[], Any]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def time_passes(
    shape: tuple[int, int, int, int], dtype: str, repeats: int, block_size: int | None
) -> dict[tuple[str, str], dict[str, float]]:
    """Median wall and CPU seconds of every (impl, pass), repeats interleaved."""
    q, k, v, g = _inputs(shape, dtype)
    calls = {(i, p): _call(i, p, q, k, v, g, block_size) for p in PASSES for i in IMPLS}
    for fn in calls.values():  # warm-up: first-call allocations and dispatch caches
        fn()
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {key: [] for key in calls}
    for _ in range(repeats):
        for key, fn in calls.items():
            samples[key].append(_clock(fn))
    return {
        key: {
            "wall_s": statistics.median(s[0] for s in runs),
            "cpu_s": statistics.median(s[1] for s in runs),
        }
        for key, runs in samples.items()
    }


def _proc_status(key: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key):
                return int(line.split()[1]) * 1024  # reported in kB
    raise KeyError(key)


def _memory_child(spec: dict[str, Any]) -> int:
    """In a fresh process: the resident-set peak of one call above its start, as JSON."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 1 << 17)  # M_MMAP_THRESHOLD: big buffers are mmapped, freed at once
    import torch

    torch.set_num_threads(spec["threads"])
    fn = _call(spec["impl"], spec["pass"], *_inputs(tuple(spec["shape"]), spec["dtype"]),
               spec["block_size"])  # fmt: skip
    fn()  # warm-up; its results are dropped before the measurement
    libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # reset VmHWM to the current resident set
    before = _proc_status("VmRSS:")
    result = fn()
    print(json.dumps({"peak_bytes": _proc_status("VmHWM:") - before}))
    del result
    return 0


def peak_memory(
    impl: str, pass_: str, shape: tuple[int, ...], dtype: str, threads: int,
    block_size: int | None,
) -> int:  # fmt: skip
    """Run :func:`_memory_child` in a fresh interpreter; returns the bytes it reports."""
    spec = dict(impl=impl, shape=list(shape), dtype=dtype, threads=threads, block_size=block_size)
    spec["pass"] = pass_
    root = str(Path(__file__).resolve().parents[2])
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    )
    child = [sys.executable, "-m", "exactattn.commands.bench_torch", "--memory-child"]
    child.append(json.dumps(spec))
    out = subprocess.run(child, capture_output=True, text=True, env=env, check=True)
    return int(json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"])


def _peak_or_nan(*args: Any) -> float:
    """:func:`peak_memory` in MiB, or NaN where the method is unavailable (not Linux)."""
    if not sys.platform.startswith("linux"):
        return float("nan")
    return peak_memory(*args) / 2**20


def run(
    shape: tuple[int, int, int, int], dtype: str, repeats: int, threads: int,
    block_size: int | None, memory: bool = True,
) -> list[dict[str, Any]]:  # fmt: skip
    """One row per pass: both implementations' times and peaks, and the ratios."""
    import torch

    torch.set_num_threads(threads)
    times = time_passes(shape, dtype, repeats, block_size)
    rows = []
    for pass_ in PASSES:
        row: dict[str, Any] = {"shape": "x".join(map(str, shape)), "dtype": dtype}
        row.update(pass_=pass_, threads=threads, repeats=repeats)
        for impl in IMPLS:
            row[f"{impl}_wall_s"] = times[impl, pass_]["wall_s"]
            row[f"{impl}_cpu_s"] = times[impl, pass_]["cpu_s"]
            row[f"{impl}_peak_mib"] = (
                _peak_or_nan(impl, pass_, shape, dtype, threads, block_size)
                if memory
                else float("nan")
            )
        row["ratio_wall"] = row["exactattn_wall_s"] / row["sdpa_wall_s"]
        row["ratio_cpu"] = row["exactattn_cpu_s"] / row["sdpa_cpu_s"]
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = rows[0]
    lines = [
        f"shape (B, H, N, D) = {head['shape']}, {head['dtype']}, torch threads = "
        f"{head['threads']}, median of {head['repeats']}; ratio = exactattn / SDPA",
        "",
        "| pass | SDPA wall s | ours wall s | ratio | SDPA CPU s | ours CPU s | ratio "
        "| SDPA peak MiB | ours peak MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['pass_']} | {r['sdpa_wall_s']:.3f} | {r['exactattn_wall_s']:.3f} "
            f"| {r['ratio_wall']:.2f}x | {r['sdpa_cpu_s']:.3f} | {r['exactattn_cpu_s']:.3f} "
            f"| {r['ratio_cpu']:.2f}x | {r['sdpa_peak_mib']:.1f} | {r['exactattn_peak_mib']:.1f} |"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exactattn bench-torch", description="exactattn.torch.attention vs torch SDPA (CPU)"
    )
    parser.add_argument("--shape", type=int, nargs=4, default=[1, 8, 4096, 64],
                        metavar=("B", "H", "N", "D"))  # fmt: skip
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--block-size", type=int, default=None, help="our key block b")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    parser.add_argument("--md", default=None, help="also write the table to this file")
    parser.add_argument("--csv", default=None, help="also write the rows to this CSV")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.memory_child:
        return _memory_child(json.loads(args.memory_child))
    import torch

    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    threads = args.threads or torch.get_num_threads()
    rows = run(tuple(args.shape), args.dtype, args.repeats, threads, args.block_size,
               memory=not args.no_memory)  # fmt: skip
    table = markdown(rows)
    print(table)
    if args.md:
        Path(args.md).write_text(table + "\n")
    if args.csv:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
