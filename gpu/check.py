"""The device check: exactattn's CUDA path against the exact references and against SDPA.

One command, sized to finish in under 8 minutes on one H200::

    python gpu/check.py                 # on a CUDA machine, from the checkout
    python gpu/check.py --dry-run       # the whole script on the CPU, Triton interpreter

Four parts, each written to ``$EXACTATTN_GPU_RESULTS`` (default ``./gpu-results``):

1. **correctness** (``correctness.csv``): the Triton kernels (``impl="triton"``) and the
   generic torch backend on CUDA (``impl="generic"``), forward and the three gradients,
   against the NumPy float64 result of the same (rounded) inputs, for fp32 / fp16 / bf16,
   masks none / causal / bottom-right causal (cross) / sliding window / key padding,
   GQA, ragged sizes and head dims up to 256; plus one size against the certified flint
   (arb ball) reference, which also bounds the float64 reference's own error.
   Error = max |got − ref| / max(1, max |ref|), pass if below the dtype's tolerance.
2. **precision sweep** (``sweep.csv``, when :mod:`exactattn.precision` is importable):
   forward error of the kernels and of SDPA in bf16 / fp16 against float64, over n and
   the input distributions (N(0,1), FlashAttention-3's outliers, large logits), in the
   precision package's metrics (max abs / rel, RMSE, ulps).
3. **benchmarks** (``bench.csv``): bf16, n ∈ {1k, 4k, 16k}, d ∈ {64, 128}, causal and
   not, batch·n = 16k tokens and H = 16 heads: forward and backward times (median of CUDA
   event timings after warm-up) of SDPA (FlashAttention-2 / cuDNN kernels), the Triton
   kernels and, up to n = 4k, the generic torch path; TFLOP/s with the usual convention
   4·n²·d per head for the forward, 2.5× that for the backward, halved when causal;
   ratio to SDPA; peak memory (``torch.cuda.max_memory_allocated`` above the inputs).
4. ``check.md``: the environment and the three tables, for gpu/README.md.

``--dry-run`` sets ``TRITON_INTERPRET=1`` before triton is imported and runs every part
on the CPU at tiny sizes (float32: the interpreter mishandles bf16 dots), timing with
``time.perf_counter`` and no peak memory; CI runs it (tests/torch_path/test_torch_tools.py).
The exit status is 1 when a correctness row fails, else 0.
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
# Relative error bound per dtype: a few units of the format's rounding of an O(1) output.
TOLERANCE = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}
GRAD_FACTOR = 4  # the gradients go through two more rounded products


@dataclass(frozen=True)
class Case:
    """One correctness problem: shapes, dtype and the mask as exactattn.torch keywords."""

    name: str
    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    dtype: str
    mask: str = "none"  # none | causal | causal-br | window | padding
    gqa: bool = False


@dataclass(frozen=True)
class Sizes:
    """Everything the dry run shrinks."""

    cases: list[Case]
    flint_case: Case
    sweep_ns: list[int]
    sweep_d: int
    sweep_dtypes: list[str]
    bench_ns: list[int]
    bench_ds: list[int]
    bench_tokens: int
    bench_heads: int
    bench_dtype: str
    generic_max_n: int
    warmup: int
    repeats: int


def _cases(dtypes: list[str], n: int, big_d: int) -> list[Case]:
    cases = []
    for dtype in dtypes:
        cases += [
            Case("self", (2, 4, n, 64), (2, 4, n, 64), (2, 4, n, 64), dtype),
            Case("causal", (2, 4, n, 64), (2, 4, n, 64), (2, 4, n, 64), dtype, "causal"),
            Case(
                "cross-br-ragged",
                (1, 3, n + 1, 128),
                (1, 3, 2 * n + 3, 128),
                (1, 3, 2 * n + 3, 96),
                dtype,
                "causal-br",
            ),
            Case("gqa-window", (1, 8, n, 64), (1, 2, n, 64), (1, 2, n, 64), dtype, "window", True),
            Case("padding", (2, 2, n, 64), (2, 2, n, 64), (2, 2, n, 64), dtype, "padding"),
            Case(
                "d256",
                (1, 2, n // 2, big_d),
                (1, 2, n // 2, big_d),
                (1, 2, n // 2, big_d),
                dtype,
                "causal",
            ),
        ]
    return cases


def sizes(dry_run: bool) -> Sizes:
    if dry_run:
        return Sizes(
            cases=[
                Case("self", (1, 2, 20, 16), (1, 2, 20, 16), (1, 2, 20, 16), "float32"),
                Case(
                    "cross-br-ragged",
                    (1, 2, 9, 16),
                    (1, 2, 23, 16),
                    (1, 2, 23, 8),
                    "float32",
                    "causal-br",
                ),
                Case(
                    "gqa-window",
                    (1, 4, 18, 16),
                    (1, 2, 18, 16),
                    (1, 2, 18, 16),
                    "float32",
                    "window",
                    True,
                ),
                Case(
                    "padding", (2, 1, 17, 16), (2, 1, 17, 16), (2, 1, 17, 16), "float32", "padding"
                ),
            ],
            flint_case=Case("flint", (1, 1, 8, 4), (1, 1, 8, 4), (1, 1, 8, 4), "float32", "causal"),
            sweep_ns=[16],
            sweep_d=16,
            sweep_dtypes=["float32"],
            bench_ns=[32],
            bench_ds=[16],
            bench_tokens=64,
            bench_heads=2,
            bench_dtype="float32",
            generic_max_n=32,
            warmup=1,
            repeats=1,
        )
    return Sizes(
        cases=_cases(["float32", "float16", "bfloat16"], 200, 256),
        flint_case=Case(
            "flint", (1, 1, 64, 32), (1, 1, 64, 32), (1, 1, 64, 32), "bfloat16", "causal"
        ),
        sweep_ns=[256, 1024, 4096],
        sweep_d=64,
        sweep_dtypes=["bfloat16", "float16"],
        bench_ns=[1024, 4096, 16384],
        bench_ds=[64, 128],
        bench_tokens=16384,
        bench_heads=16,
        bench_dtype="bfloat16",
        generic_max_n=4096,
        warmup=3,
        repeats=10,
    )


# --- helpers ----------------------------------------------------------------------------------
def _masks(case: Case, device: Any) -> tuple[dict[str, Any], Any]:
    """(exactattn.torch keywords, the same mask for the NumPy reference)."""
    import numpy as np
    import torch

    from exactattn import masks

    if case.mask == "none":
        return {}, None
    if case.mask == "causal":
        return {"is_causal": True}, masks.causal()
    if case.mask == "causal-br":
        return {"mask": masks.causal("bottom-right")}, masks.causal("bottom-right")
    if case.mask == "window":
        window = masks.sliding_window(max(2, case.q[2] // 4), 0)
        return {"mask": window}, window
    if case.mask == "padding":
        lengths = [case.k[2], max(1, case.k[2] // 3)][: case.q[0]]
        return (
            {"mask": masks.key_padding(torch.tensor(lengths, device=device))},
            masks.key_padding(np.array(lengths)),
        )
    raise ValueError(case.mask)


def _error(got: Any, ref: Any) -> float:
    import numpy as np

    got = got.detach().double().cpu().numpy()
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(got - ref)) / max(1.0, float(np.max(np.abs(ref)))))


def _reference(case: Case, arrays: list[Any], g: Any, np_mask: Any, backend: Any = None):
    """``(y, dq, dk, dv)`` of exactattn's NumPy (or ``backend``) run on float64 inputs."""
    import numpy as np

    import exactattn

    q, k, v = arrays
    if case.gqa:  # the NumPy API broadcasts heads; group them explicitly
        group = case.q[1] // case.k[1]
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    keywords = dict(mask=np_mask, backend=backend, block_size=64)
    y, stats = exactattn.attention(q, k, v, return_stats=True, **keywords)
    dq, dk, dv = exactattn.attention_backward(q, k, v, y, stats, g, **keywords)
    if case.gqa:
        group = case.q[1] // case.k[1]
        dk = np.asarray(dk).reshape(case.k[0], case.k[1], group, *case.k[2:]).sum(2)
        dv = np.asarray(dv).reshape(case.v[0], case.v[1], group, *case.v[2:]).sum(2)
    return y, dq, dk, dv


def _inputs(case: Case, device: Any, seed: int = 0):
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    dtype = getattr(torch, case.dtype)
    shapes = (case.q, case.k, case.v, (*case.q[:-1], case.v[-1]))
    tensors = [torch.from_numpy(rng.standard_normal(s)).to(dtype).to(device) for s in shapes]
    # the reference sees exactly the rounded values the device computes with
    return tensors, [t.double().cpu().numpy() for t in tensors]


def _run_ours(case: Case, impl: str, tensors: list[Any], keywords: dict[str, Any]):
    import torch

    import exactattn.torch as et

    q, k, v, g = (t.clone().requires_grad_(i < 3) for i, t in enumerate(tensors))
    y = et.attention(q, k, v, enable_gqa=case.gqa, impl=impl, **keywords)
    grads = torch.autograd.grad(y, (q, k, v), g)
    return (y, *grads)


# --- 1. correctness ---------------------------------------------------------------------------
def correctness(size: Sizes, device: Any, log: Callable[[str], None]) -> list[dict[str, Any]]:
    rows = []
    for case in size.cases:
        tensors, arrays = _inputs(case, device)
        keywords, np_mask = _masks(case, device)
        ref = _reference(case, arrays[:3], arrays[3], np_mask)
        for impl in ("triton", "generic"):
            start = time.perf_counter()
            got = _run_ours(case, impl, tensors, keywords)
            rows.append(_row(case, impl, "float64", got, ref, time.perf_counter() - start))
            log(_describe(rows[-1]))
    case = size.flint_case
    tensors, arrays = _inputs(case, device, seed=1)
    keywords, np_mask = _masks(case, device)
    try:
        from exactattn.backends.flint_backend import FlintContext
    except ImportError as error:
        log(f"flint reference skipped: {error}")
        return rows
    balls = _reference(case, arrays[:3], arrays[3], np_mask, backend=FlintContext(200))
    mids = [_midpoints(x) for x in balls]
    f64 = _reference(case, arrays[:3], arrays[3], np_mask)
    rows.append(_row(case, "numpy-float64", "flint", f64, mids, 0.0, tolerance=1e-12))
    log(_describe(rows[-1]))
    for impl in ("triton", "generic"):
        start = time.perf_counter()
        got = _run_ours(case, impl, tensors, keywords)
        rows.append(_row(case, impl, "flint", got, mids, time.perf_counter() - start))
        log(_describe(rows[-1]))
    return rows


def _midpoints(x: Any) -> Any:
    import numpy as np

    return np.vectorize(lambda e: float(e.mid()), otypes=[np.float64])(np.asarray(x, dtype=object))


def _row(case, impl, reference, got, ref, seconds, tolerance=None) -> dict[str, Any]:
    import numpy as np

    errors = [_error(a, b) if hasattr(a, "detach") else _error_np(a, b) for a, b in zip(got, ref)]
    tol = tolerance if tolerance is not None else TOLERANCE[case.dtype]
    ok = errors[0] <= tol and all(e <= GRAD_FACTOR * tol for e in errors[1:])
    return {
        "case": case.name,
        "dtype": case.dtype,
        "mask": case.mask,
        "gqa": case.gqa,
        "q": "x".join(map(str, case.q)),
        "k": "x".join(map(str, case.k)),
        "v": "x".join(map(str, case.v)),
        "impl": impl,
        "reference": reference,
        "err_y": errors[0],
        "err_dq": errors[1],
        "err_dk": errors[2],
        "err_dv": errors[3],
        "tolerance": tol,
        "ok": bool(ok and np.all(np.isfinite(errors))),
        "seconds": round(seconds, 4),
    }


def _error_np(a: Any, b: Any) -> float:
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


def _describe(row: dict[str, Any]) -> str:
    flag = "ok  " if row["ok"] else "FAIL"
    return (
        f"{flag} {row['case']:<16} {row['dtype']:<8} {row['impl']:<13} vs {row['reference']:<7}"
        f" y {row['err_y']:.1e} dq {row['err_dq']:.1e} dk {row['err_dk']:.1e}"
        f" dv {row['err_dv']:.1e} (tol {row['tolerance']:.0e})"
    )


# --- 2. precision sweep -----------------------------------------------------------------------
def sweep(size: Sizes, device: Any, log: Callable[[str], None]) -> list[dict[str, Any]]:
    try:
        from exactattn.precision.formats import get_format
        from exactattn.precision.inputs import DISTRIBUTIONS, make_inputs
        from exactattn.precision.metrics import error_metrics
    except ImportError as error:
        log(f"precision sweep skipped: exactattn.precision is not importable ({error})")
        return []
    import numpy as np
    import torch
    import torch.nn.functional as F

    import exactattn
    import exactattn.torch as et

    rows = []
    for dist in sorted(DISTRIBUTIONS):
        for n in size.sweep_ns:
            data = make_inputs(dist, n, size.sweep_d, seed=0)
            for dtype in size.sweep_dtypes:
                tdtype = getattr(torch, dtype)
                q, k, v = (
                    torch.from_numpy(data[x]).to(tdtype).to(device)[None, None] for x in "qkv"
                )
                exact = exactattn.attention(*(x.double().cpu().numpy() for x in (q, k, v)))
                runs = {
                    "triton": lambda q=q, k=k, v=v: et.attention(q, k, v, impl="triton"),
                    "generic": lambda q=q, k=k, v=v: et.attention(q, k, v, impl="generic"),
                    "sdpa": lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v),
                }
                for impl, fn in runs.items():
                    with torch.no_grad():
                        y = fn().double().cpu().numpy()
                    metrics = error_metrics(y, exact, get_format(dtype))
                    rows.append(
                        {
                            "dist": dist,
                            "n": n,
                            "d": size.sweep_d,
                            "dtype": dtype,
                            "impl": impl,
                            **metrics,
                        }
                    )
                    log(
                        f"sweep {dist:<13} n={n:<5} {dtype:<8} {impl:<8} "
                        f"max_rel {metrics['max_rel']:.2e} rmse {metrics['rmse']:.2e}"
                    )
                    if not np.isfinite(metrics["max_abs"]):
                        log(f"  non-finite output from {impl}")
    return rows


# --- 3. benchmarks ----------------------------------------------------------------------------
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
    cuda = device.type == "cuda"
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
                    "triton": lambda q, k, v, c=causal: et.attention(
                        q, k, v, is_causal=c, impl="triton", check_finite=False
                    ),
                }
                if n <= size.generic_max_n:
                    impls["generic"] = lambda q, k, v, c=causal: et.attention(
                        q, k, v, is_causal=c, impl="generic", check_finite=False
                    )
                for impl, fn in impls.items():
                    row = _bench_one(fn, shape, dtype, device, measure, size, cuda)
                    row.update(
                        impl=impl,
                        n=n,
                        d=d,
                        batch=batch,
                        heads=size.bench_heads,
                        dtype=size.bench_dtype,
                        causal=causal,
                    )
                    for part in ("fwd", "bwd"):
                        work = flops(n, d, size.bench_heads, batch, causal, part == "bwd")
                        row[f"{part}_tflops"] = work / row[f"{part}_s"] / 1e12
                    rows.append(row)
                base = next(r for r in rows[::-1] if r["impl"] == "sdpa")
                for r in rows[-len(impls) :]:
                    r["fwd_ratio"] = r["fwd_s"] / base["fwd_s"]
                    r["bwd_ratio"] = r["bwd_s"] / base["bwd_s"]
                    log(
                        f"bench n={n:<5} d={d:<3} causal={causal!s:<5} {r['impl']:<8} "
                        f"fwd {r['fwd_s'] * 1e3:8.2f} ms {r['fwd_tflops']:6.1f} TF/s "
                        f"x{r['fwd_ratio']:.2f} | bwd {r['bwd_s'] * 1e3:8.2f} ms "
                        f"{r['bwd_tflops']:6.1f} TF/s x{r['bwd_ratio']:.2f} | "
                        f"peak {r['peak_mib']:.0f} MiB"
                    )
    return rows


def _bench_one(fn, shape, dtype, device, measure, size, cuda) -> dict[str, Any]:
    import torch

    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v, g = (
        torch.randn(shape, generator=generator, device=device, dtype=dtype) for _ in range(4)
    )
    leaves = [x.requires_grad_(True) for x in (q, k, v)]

    def forward() -> Any:
        with torch.no_grad():
            return fn(q, k, v)

    state: dict[str, Any] = {}

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
    peak = float("nan")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        make_graph()
        backward()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        state.clear()
    return {"fwd_s": statistics.median(fwd), "bwd_s": statistics.median(bwd), "peak_mib": peak}


# --- 4. outputs -------------------------------------------------------------------------------
def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
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
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return lines


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


def report(env, correct, swept, timed, seconds) -> str:
    lines = ["# exactattn device check", "", *env, f"- wall time: {seconds:.0f} s", ""]
    lines += ["## Correctness (error = max|got − ref| / max(1, max|ref|))", ""]
    lines += _table(
        correct,
        [
            "case",
            "dtype",
            "impl",
            "reference",
            "err_y",
            "err_dq",
            "err_dk",
            "err_dv",
            "tolerance",
            "ok",
        ],
    )
    lines += ["", "## Precision sweep (forward, vs float64)", ""]
    lines += _table(swept, ["dist", "n", "dtype", "impl", "max_abs", "max_rel", "rmse", "mean_ulp"])
    lines += [
        "",
        "## Benchmarks (TFLOP/s: 4·n²·d per head forward, 2.5× backward, "
        "halved when causal; ratio = time / SDPA's)",
        "",
    ]
    lines += _table(
        timed,
        [
            "n",
            "d",
            "causal",
            "impl",
            "fwd_s",
            "fwd_tflops",
            "fwd_ratio",
            "bwd_s",
            "bwd_tflops",
            "bwd_ratio",
            "peak_mib",
        ],
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, tiny")
    parser.add_argument("--skip-bench", action="store_true", help="correctness and sweep only")
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
    size = sizes(args.dry_run)

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {line}", flush=True)

    correct = correctness(size, device, log)
    _write_csv(out / "correctness.csv", correct)
    swept = sweep(size, device, log)
    _write_csv(out / "sweep.csv", swept)
    timed = [] if args.skip_bench else bench(size, device, log)
    _write_csv(out / "bench.csv", timed)
    text = report(
        environment(device, args.dry_run), correct, swept, timed, time.perf_counter() - start
    )
    (out / "check.md").write_text(text)
    failed = [r for r in correct if not r["ok"]]
    log(f"wrote {out}/check.md; {len(correct) - len(failed)}/{len(correct)} correctness rows ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
