"""The device check: the library's own pieces, run where a CUDA device is.

One command, sized to finish in under 8 minutes on one H200::

    python gpu/check.py                 # on a CUDA machine, from the checkout
    python gpu/check.py --dry-run       # the whole script on the CPU, Triton interpreter

Three parts, written to ``$EXACTATTN_GPU_RESULTS`` (default ``./gpu-results``):

1. **check** (``check/report.md``, ``check/report.json``, replay files): ``exactattn check``
   (:mod:`exactattn.testing`) over every CUDA target of the registry that is available —
   SDPA's backends (default dispatch, math, flash, memory-efficient, cuDNN), FlexAttention,
   flash-attn, xformers, exactattn's generic torch path and its Triton kernels, then every
   other GPU target of the zoo (:func:`zoo_gpu_targets`), each one not installed listed
   unavailable with its reason — in fp32, fp16 and bf16, forward and gradients judged
   against the certified reference within each target's claimed arithmetic, with each one's
   error next to naive attention's in the same dtype and the FlashAttention-2 policy's.
2. **sweep** (``sweep/``): the precision sweep (:func:`exactattn.precision.sweep_run.run_sweep`)
   of a preset (``quick``; ``tiny`` for the dry run), its CSV and report.
3. **bench** (``bench.csv``): bf16, n ∈ {1k, 4k, 16k}, d ∈ {64, 128}, causal and not,
   batch·n = 16k tokens and H = 16 heads: forward and backward times (median of CUDA event
   timings after warm-up) of SDPA and exactattn's kernels, TFLOP/s (4·n²·d per head
   forward, 2.5× backward, halved when causal), ratio to SDPA, peak memory. (The library's
   torch benchmark, ``exactattn bench-torch``, times the CPU; this part is its CUDA side.)

``check.md`` collects the environment and the three parts. ``--dry-run`` sets
``TRITON_INTERPRET=1`` before triton is imported and runs every part on the CPU at tiny
sizes, listing the zoo's CUDA-only targets unavailable (CI runs it:
``tests/check/test_gpu_check.py``). Exit status 1 when the check failed.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CUDA_TARGETS = (
    "sdpa",
    "sdpa-math",
    "sdpa-flash",
    "sdpa-efficient",
    "sdpa-cudnn",
    "flex",
    "flash-attn",
    "xformers",
    "exactattn",
    "exactattn-triton",
)
DRY_TARGETS = ("exactattn-triton", "exactattn", "sdpa")


def zoo_gpu_targets() -> tuple[str, ...]:
    """Every other registered target that runs on CUDA: the zoo's GPU libraries (FlashInfer's,
    SageAttention's, JAX's cuDNN and XLA paths, ...), each checked where it is installed and
    listed unavailable, with its reason, where it is not."""
    from exactattn.targets.resolve import registry

    found = [name for name, target in registry().items() if "cuda" in target.caps.devices]
    return tuple(name for name in found if name not in CUDA_TARGETS)


def needing_cuda() -> tuple[str, ...]:
    """The registered targets that run only on CUDA (flash-attn, xformers, the zoo's GPU
    libraries): the dry run lists each unavailable with its reason, as the device check does
    where a library is not installed."""
    from exactattn.targets.resolve import registry

    return tuple(name for name, target in registry().items() if target.needs_cuda)


@dataclass(frozen=True)
class Sizes:
    """Everything the dry run shrinks."""

    targets: tuple[str, ...]
    dtypes: tuple[str, ...]
    examples: int
    max_n: int
    max_d: int
    preset: str
    bench_ns: tuple[int, ...]
    bench_ds: tuple[int, ...]
    bench_tokens: int
    bench_heads: int
    bench_dtype: str
    warmup: int
    repeats: int


def sizes(dry_run: bool, examples: int | None) -> Sizes:
    if dry_run:
        dry = (*DRY_TARGETS, *needing_cuda())
        return Sizes(dry, ("float32",), examples or 12, 12, 8, "tiny",
                     (32,), (16,), 64, 2, "float32", 1, 1)  # fmt: skip
    every = (*CUDA_TARGETS, *zoo_gpu_targets())
    return Sizes(every, ("float32", "float16", "bfloat16"), examples or 150, 96, 64,
                 "quick", (1024, 4096, 16384), (64, 128), 16384, 16, "bfloat16", 3, 10)  # fmt: skip


# --- 1. check -----------------------------------------------------------------------------------
def check(size: Sizes, device: str, out: Path, log: Callable[[str], None]) -> tuple[Any, list]:
    from exactattn import targets
    from exactattn.testing import check_report, session

    chosen = [targets.get(name) for name in size.targets]
    settings = session.Settings(
        examples=size.examples,
        dtypes=size.dtypes,
        max_n=size.max_n,
        max_d=size.max_d,
        device=device,
        sampled=device == "cuda",  # the dry run's interpreter takes every small case
    )
    result = session.run(chosen, settings)
    failures = []
    for finding, text in result.report.failures:
        path = check_report.save_failure(finding, text, out / "check", None)
        failures.append(check_report.counterexample(finding, text, path))
    rows = check_report.summary(result)
    check_report.write(result, out / "check", failures)
    for name, why in result.unavailable.items():
        log(f"check: {name} unavailable ({why})")
    for row in rows:
        log(
            f"check {row['variant']:<28} run {row['run']:>4} skip {row['skipped']:>4} "
            f"fail {row['failed']:>3} fwd max {row['y_max']:.2e} /naive {row['naive_median']:.2g}"
        )
    for text in failures:
        log(text)
    return result, rows


# --- 2. sweep -----------------------------------------------------------------------------------
def sweep(size: Sizes, out: Path, log: Callable[[str], None]) -> str:
    try:
        import pandas as pd

        from exactattn.precision.sweep_report import write_report
        from exactattn.precision.sweep_run import run_sweep
    except ImportError as error:
        log(f"sweep skipped: {error}")
        return f"(skipped: {error})"
    result = run_sweep(size.preset, out / "sweep", workers=min(8, os.cpu_count() or 1),
                       progress=False)  # fmt: skip
    df = pd.read_csv(result.csv_path)
    path = write_report(df, out / "sweep", preset=size.preset, description=size.preset,
                        seconds=result.seconds, plots=[], skipped=result.skipped)  # fmt: skip
    log(f"sweep {size.preset}: {result.rows_written} rows in {result.seconds:.0f} s -> {path}")
    return f"preset `{size.preset}`: {result.rows_written} rows, report `sweep/{Path(path).name}`"


# --- 3. bench -----------------------------------------------------------------------------------
def _timer(device: Any) -> Callable[[Callable[[], Any]], float]:
    import torch

    if device.type == "cuda":

        def cuda_time(fn: Callable[[], Any]) -> float:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            torch.cuda.synchronize()
            return start.elapsed_time(stop) / 1e3

        return cuda_time

    def cpu_time(fn: Callable[[], Any]) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return cpu_time


def flops(n: int, d: int, heads: int, batch: int, causal: bool, backward: bool) -> float:
    """4·n²·d per head for the forward, 2.5× for the backward, halved when causal."""
    work = 4.0 * n * n * d * heads * batch * (2.5 if backward else 1.0)
    return work / 2 if causal else work


def bench(size: Sizes, device: Any, log: Callable[[str], None]) -> list[dict[str, Any]]:
    import torch
    import torch.nn.functional as F

    import exactattn.torch as et

    measure = _timer(device)
    rows = []
    for d in size.bench_ds:
        for n in size.bench_ns:
            batch = max(1, size.bench_tokens // n)
            shape = (batch, size.bench_heads, n, d)
            dtype = getattr(torch, size.bench_dtype)
            for causal in (False, True):
                impls = {
                    "sdpa": lambda q, k, v, c=causal: F.scaled_dot_product_attention(
                        q, k, v, is_causal=c
                    ),
                    "exactattn": lambda q, k, v, c=causal: et.attention(
                        q, k, v, is_causal=c, check_finite=False
                    ),
                }
                base = None
                for impl, fn in impls.items():
                    row = _bench_one(fn, shape, dtype, device, measure, size)
                    row.update(impl=impl, n=n, d=d, batch=batch, causal=causal)
                    for part in ("fwd", "bwd"):
                        work = flops(n, d, size.bench_heads, batch, causal, part == "bwd")
                        row[f"{part}_tflops"] = work / row[f"{part}_s"] / 1e12
                    base = base or row
                    row["fwd_ratio"] = row["fwd_s"] / base["fwd_s"]
                    row["bwd_ratio"] = row["bwd_s"] / base["bwd_s"]
                    rows.append(row)
                    log(
                        f"bench n={n:<5} d={d:<3} causal={causal!s:<5} {impl:<9} "
                        f"fwd {row['fwd_s'] * 1e3:8.2f} ms x{row['fwd_ratio']:.2f} | "
                        f"bwd {row['bwd_s'] * 1e3:8.2f} ms x{row['bwd_ratio']:.2f}"
                    )
    return rows


def _bench_one(fn, shape, dtype, device, measure, size) -> dict[str, Any]:
    import torch

    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v, g = (
        torch.randn(shape, generator=generator, device=device, dtype=dtype) for _ in range(4)
    )
    leaves = [x.requires_grad_(True) for x in (q, k, v)]
    state: dict[str, Any] = {}

    def forward() -> Any:
        with torch.no_grad():
            return fn(q, k, v)

    def make_graph() -> None:
        state["y"] = fn(*leaves)

    def backward() -> None:
        torch.autograd.grad(state["y"], leaves, g)

    for _ in range(size.warmup):
        forward()
        make_graph()
        backward()
    fwd, bwd = [], []
    for _ in range(size.repeats):
        fwd.append(measure(forward))
        make_graph()
        bwd.append(measure(backward))
    peak = math.nan
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        make_graph()
        backward()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    state.clear()
    return {"fwd_s": statistics.median(fwd), "bwd_s": statistics.median(bwd), "peak_mib": peak}


# --- outputs --------------------------------------------------------------------------------------
def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    if rows:
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def _table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    if not rows:
        return ["(none)"]

    def cell(x: Any) -> str:
        if isinstance(x, float):
            return "nan" if math.isnan(x) else f"{x:.3g}"
        return str(x)

    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    return lines + ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]


def environment(device: Any, dry_run: bool) -> list[str]:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return [
        f"- date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"- device: {name or device}{' (dry run: CPU, TRITON_INTERPRET=1)' if dry_run else ''}",
        f"- torch {torch.__version__}, triton {triton_version}, CUDA {torch.version.cuda}",
        f"- python {platform.python_version()}",
    ]


def summary(env, check_rows, swept: str, timed, seconds: float) -> str:
    from exactattn.testing.check_report import table

    lines = ["# exactattn device check", "", *env, f"- wall time: {seconds:.0f} s", ""]
    lines += ["## Check (details: check/report.md)", "", *table(check_rows), ""]
    lines += ["## Precision sweep", "", swept, ""]
    lines += ["## Benchmarks (ratio = time / SDPA's)", ""]
    lines += _table(timed, ["n", "d", "causal", "impl", "fwd_s", "fwd_tflops", "fwd_ratio",
                            "bwd_s", "bwd_tflops", "bwd_ratio", "peak_mib"])  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, tiny")
    parser.add_argument("--skip-bench", action="store_true", help="check and sweep only")
    parser.add_argument("--skip-sweep", action="store_true", help="check and bench only")
    parser.add_argument("--examples", type=int, default=None, help="cases per check")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton decorates the kernels
    sys.path.insert(0, str(ROOT))
    import torch

    if args.dry_run:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        print("gpu/check.py: no CUDA device; use --dry-run on a CPU machine", file=sys.stderr)
        return 2
    out = Path(os.environ.get("EXACTATTN_GPU_RESULTS", "gpu-results"))
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    size = sizes(args.dry_run, args.examples)

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {line}", flush=True)

    result, rows = check(size, device.type, out, log)
    swept = "(skipped)" if args.skip_sweep else sweep(size, out, log)
    timed = [] if args.skip_bench else bench(size, device, log)
    _write_csv(out / "bench.csv", timed)
    text = summary(environment(device, args.dry_run), rows, swept, timed,
                   time.perf_counter() - start)  # fmt: skip
    (out / "check.md").write_text(text)
    log(f"wrote {out}/check.md; check {'FAILED' if result.failed else 'passed'}")
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
