"""``exactattn bench-torch``: exactattn.torch.attention against torch SDPA on the CPU, one run.

Cases: every ``--shape`` (default (1, 8, 4096, 64) and (4, 16, 1024, 64)), each without and
with a causal mask, float32 by default; passes: the forward (under ``no_grad``) and the
forward + backward (``y.backward(G)``). Implementations, their repeats interleaved so
machine noise hits all of them alike:

* SDPA — ``torch.nn.functional.scaled_dot_product_attention``, which on the CPU dispatches
  to its flash kernel (``_scaled_dot_product_flash_attention_for_cpu``);
* exactattn — :func:`exactattn.torch.attention`;
* FlexAttention — ``torch.nn.attention.flex_attention.flex_attention`` compiled by
  ``torch.compile`` (inductor's C++ backend), the causal case through a block mask; the
  forward only (torch has no CPU backward for it). Its first call (the compilation) is
  timed apart; where it cannot compile or run, its cells say n/a and the reason is printed.

Reported per pass: the median wall time and the median CPU time of the process
(``time.process_time``), the ratios to SDPA, and the peak memory: ``torch.profiler``'s
allocation events (``profile_memory=True``) over one call after a warm-up, summed in time
order — the most bytes the call held at once (outputs and gradients included, the inputs
not), to the byte. The profiler sees the allocations of the calling thread only, so the
peaks are taken on one torch thread, where exactattn runs every piece on that thread.
The load averages before and after the run are printed with the table: the benchmark
machine is shared, and only ratios measured side by side mean anything.

``--small`` adds the small-call section: per-call microseconds of SDPA, the drop-in
:func:`exactattn.torch.scaled_dot_product_attention` and :func:`exactattn.torch.attention`
(checks on), interleaved — ``tiny`` (one query against 64 keys: the fixed per-call cost),
``decode`` (a decode step, (1, 8, 1, 64) against a 4096-key cache; target within 3x SDPA),
``self-256`` ((1, 8, 256, 64), forward and forward + backward; target within 2x), the CPU
time of the process per call as the measure (immune to other processes with one thread).

``--second-order`` adds the double-backward section (issue 35's budget: the double
backward within 3x the first): for each ``--second-shape`` (default (1, 8, 1024, 64)), one
forward with a graph, then either the first backward alone (``autograd.grad(Y, (q, k, v),
G)``) or the double backward — the first with ``create_graph=True`` and the second, the
gradient of ``Σ W∘(dQ, dK, dV)`` — each timed inside the call, interleaved, medians;
exactattn.torch.attention and the math SDPA (the only SDPA with a double backward, through
the materialised softmax) side by side. With the memory runs, the profiler's peak of one
double backward (forward included) at n = 1024 and 4096, (1, 1, n, 64), for both.

    exactattn bench-torch --threads 2 --repeats 5 --md bench.md --csv bench.csv
    exactattn bench-torch --no-large --small --threads 1
    exactattn bench-torch --no-large --second-order --threads 2
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

IMPLS = ("sdpa", "exactattn", "flex")
PASSES = ("fwd", "fwd+bwd")
SHAPES = ((1, 8, 4096, 64), (4, 16, 1024, 64))


# --- the calls ---------------------------------------------------------------------------------
def _inputs(shape: tuple[int, ...], dtype: str, seed: int = 0, n_k: int | None = None):
    import torch

    generator = torch.Generator().manual_seed(seed)
    kv_shape = (*shape[:-2], shape[-2] if n_k is None else n_k, shape[-1])
    return tuple(
        torch.randn(s, generator=generator, dtype=getattr(torch, dtype))
        for s in (shape, kv_shape, kv_shape, shape)
    )


def _attend(impl: str, causal: bool, shape: tuple[int, ...]) -> Callable[..., Any]:
    """``(q, k, v) -> Y`` for one implementation (FlexAttention compiled on first use)."""
    import torch
    import torch.nn.functional as F

    import exactattn.torch as et

    if impl == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if impl == "exactattn":
        return lambda q, k, v: et.attention(q, k, v, is_causal=causal)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention)
    block_mask = None
    if causal:
        n = shape[-2]
        block_mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, n, n, device="cpu")
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


def _call(attend: Callable[..., Any], pass_: str, q, k, v, g) -> Callable[[], Any]:
    """A closure running one pass on fresh leaf tensors; returns what the pass produced."""
    import torch

    if pass_ == "fwd":

        def forward() -> Any:
            with torch.no_grad():
                return attend(q, k, v)

        return forward
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]

    def forward_backward() -> Any:
        for x in leaves:
            x.grad = None
        attend(*leaves).backward(g)
        return [x.grad for x in leaves]

    return forward_backward


def _clock(fn: Callable[[], Any]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _interleaved(
    calls: dict[Any, Callable[[], Any]], repeats: int
) -> dict[Any, tuple[float, float]]:
    """Median (wall, CPU) seconds of each call over ``repeats`` rounds (one warm-up first)."""
    for fn in calls.values():
        fn()
    samples: dict[Any, list[tuple[float, float]]] = {key: [] for key in calls}
    for _ in range(repeats):
        for key, fn in calls.items():
            samples[key].append(_clock(fn))
    return {
        key: (statistics.median(s[0] for s in runs), statistics.median(s[1] for s in runs))
        for key, runs in samples.items()
    }


# --- peak memory -------------------------------------------------------------------------------
def profiled_peak(fn: Callable[[], Any]) -> int:
    """The most bytes ``fn()`` held at once, from ``torch.profiler``'s allocation events.

    One warm-up call first; then the call under ``profile(profile_memory=True)``, its CPU
    allocation events summed in time order (frees are negative). Only the calling thread's
    allocations are seen.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
        del result
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    cpu = torch._C._autograd.DeviceType.CPU
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        if event.device_type() == cpu:
            held += event.nbytes()
            peak = max(peak, held)
    return peak


def peak_memory(
    impl: str, pass_: str, shape: tuple[int, ...], dtype: str, causal: bool = False
) -> int:
    """:func:`profiled_peak` of one (implementation, pass) on one torch thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        q, k, v, g = _inputs(shape, dtype)
        return profiled_peak(_call(_attend(impl, causal, shape), pass_, q, k, v, g))
    finally:
        torch.set_num_threads(threads)


# --- the large cases ---------------------------------------------------------------------------
def run_case(
    shape: tuple[int, ...], causal: bool, dtype: str, repeats: int, flex: bool, memory: bool
) -> list[dict[str, Any]]:
    """One row per pass: every implementation's times, peaks and ratios to SDPA."""
    q, k, v, g = _inputs(shape, dtype)
    impls = [i for i in IMPLS if i != "flex" or flex]
    attends, calls, notes = {}, {}, {}
    compile_s = float("nan")
    for impl in impls:
        try:
            attends[impl] = _attend(impl, causal, shape)
            if impl == "flex":  # compile here, timed apart from the runs
                compile_s = _clock(_call(attends[impl], "fwd", q, k, v, g))[0]
        except Exception as error:  # FlexAttention may not compile or run here
            notes[impl] = f"{type(error).__name__}: {error}".splitlines()[0][:200]
            attends.pop(impl, None)
            continue
        for pass_ in PASSES:
            if impl != "flex" or pass_ == "fwd":
                calls[impl, pass_] = _call(attends[impl], pass_, q, k, v, g)
    times = _interleaved(calls, repeats)
    rows = []
    for pass_ in PASSES:
        row: dict[str, Any] = {"shape": "x".join(map(str, shape)), "causal": causal}
        row.update(pass_=pass_, dtype=dtype, repeats=repeats, flex_compile_s=compile_s)
        for impl in IMPLS:
            wall, cpu = times.get((impl, pass_), (float("nan"), float("nan")))
            row[f"{impl}_wall_s"], row[f"{impl}_cpu_s"] = wall, cpu
            measured = memory and (impl, pass_) in calls
            row[f"{impl}_peak_mib"] = (
                peak_memory(impl, pass_, shape, dtype, causal) / 2**20 if measured else float("nan")
            )
        for impl in IMPLS[1:]:
            for what in ("wall_s", "cpu_s", "peak_mib"):
                row[f"{impl}_{what.split('_')[0]}_ratio"] = (
                    row[f"{impl}_{what}"] / row[f"sdpa_{what}"]
                )
        row["note"] = "; ".join(f"{impl}: {text}" for impl, text in notes.items())
        rows.append(row)
    return rows


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _num(x: float, digits: int = 3, suffix: str = "") -> str:
    return "n/a" if x != x else f"{x:.{digits}f}{suffix}"  # NaN: not measured


def markdown(rows: list[dict[str, Any]], threads: int, load: tuple[str, str]) -> str:
    head = rows[0]
    lines = [
        f"{head['dtype']}, torch threads = {threads}, median of {head['repeats']} interleaved "
        f"runs; × = ratio to SDPA (wall time; CPU × = CPU time); peak = torch profiler's "
        f"allocation peak of one call on one thread; load average before {load[0]}, "
        f"after {load[1]}",
        "",
        "| shape | causal | pass | SDPA s | exactattn s | × | CPU × | Flex s | × "
        "| SDPA MiB | exactattn MiB | × |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {'yes' if r['causal'] else 'no'} | {r['pass_']} "
            f"| {_num(r['sdpa_wall_s'])} | {_num(r['exactattn_wall_s'])} "
            f"| {_num(r['exactattn_wall_ratio'], 2, 'x')} "
            f"| {_num(r['exactattn_cpu_ratio'], 2, 'x')} "
            f"| {_num(r['flex_wall_s'])} | {_num(r['flex_wall_ratio'], 2, 'x')} "
            f"| {_num(r['sdpa_peak_mib'], 1)} | {_num(r['exactattn_peak_mib'], 1)} "
            f"| {_num(r['exactattn_peak_ratio'], 2, 'x')} |"
        )
    compiles = [f"{r['shape']} causal={r['causal']}: {r['flex_compile_s']:.1f} s" for r in rows
                if r["pass_"] == "fwd" and r["flex_compile_s"] == r["flex_compile_s"]]  # fmt: skip
    if compiles:
        lines += ["", "FlexAttention compile (first call): " + ", ".join(compiles)]
    notes = sorted({r["note"] for r in rows if r["note"]})
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


# --- the small calls ---------------------------------------------------------------------------
SMALL_CASES = {
    "tiny": ((1, 8, 1, 64), 64, ("fwd",)),
    "decode": ((1, 8, 1, 64), 4096, ("fwd",)),
    "self-256": ((1, 8, 256, 64), 256, ("fwd", "fwd+bwd")),
}
SMALL_IMPLS = ("sdpa", "exact_sdpa", "attention")


def small_case(case: str, repeats: int) -> list[dict[str, Any]]:
    """One row per pass: median CPU and wall microseconds per call, ratios to SDPA."""
    import torch.nn.functional as F

    import exactattn.torch as et

    shape, n_k, passes = SMALL_CASES[case]
    q, k, v, g = _inputs(shape, "float32", n_k=n_k)
    functions = {
        "sdpa": F.scaled_dot_product_attention,
        "exact_sdpa": et.scaled_dot_product_attention,
        "attention": et.attention,
    }
    calls = {(i, p): _call(fn, p, q, k, v, g) for i, fn in functions.items() for p in passes}
    times = _interleaved(calls, repeats)
    rows = []
    for pass_ in passes:
        row: dict[str, Any] = {"case": case, "pass": pass_}
        for impl in SMALL_IMPLS:
            row[f"{impl}_wall_us"] = 1e6 * times[impl, pass_][0]
            row[f"{impl}_cpu_us"] = 1e6 * times[impl, pass_][1]
        for impl in SMALL_IMPLS[1:]:
            row[f"{impl}_ratio_cpu"] = row[f"{impl}_cpu_us"] / row["sdpa_cpu_us"]
        rows.append(row)
    return rows


def small_markdown(rows: list[dict[str, Any]], threads: int, repeats: int) -> str:
    lines = [
        f"Small calls: float32, torch threads = {threads}, median of {repeats} interleaved "
        "calls; µs per call as CPU time (wall in brackets); ratio = ours / SDPA (CPU time)",
        "",
        "| case | pass | SDPA µs | exact SDPA µs | ratio | attention µs | ratio |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        cells = [f"{r[f'{i}_cpu_us']:.0f} ({r[f'{i}_wall_us']:.0f})" for i in SMALL_IMPLS]
        lines.append(
            f"| {r['case']} | {r['pass']} | {cells[0]} | {cells[1]} "
            f"| {r['exact_sdpa_ratio_cpu']:.2f}x | {cells[2]} | {r['attention_ratio_cpu']:.2f}x |"
        )
    return "\n".join(lines)


# --- the double backward ---------------------------------------------------------------------
SECOND_SHAPES = ((1, 8, 1024, 64),)
SECOND_IMPLS = ("exactattn", "sdpa-math")
MEMORY_NS = (1024, 4096)


def _second_attend(impl: str) -> Callable[..., Any]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import exactattn.torch as et

    if impl == "exactattn":
        return et.attention

    def math_sdpa(q, k, v):
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v)

    return math_sdpa


def _backward_call(
    attend: Callable[..., Any], double: bool, q, k, v, g, g_of_y: bool = False
) -> Callable[[], Any]:
    """A forward with a graph, then the timed part: the first backward, or the double one.

    The first backward is at ``G`` (a constant), or, when ``g_of_y``, of ``Σ G∘Y²/2`` (its
    ``G∘Y`` depends on the inputs, so the double backward also forms ``Ẏ``). Returns
    ``(first_s, second_s)``: the first backward's seconds (with ``create_graph`` when
    ``double``) and the second backward's (0 when not ``double``)."""
    import torch

    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    weights = [torch.randn_like(x) for x in leaves]

    def call() -> tuple[float, float]:
        y = attend(*leaves)
        start = time.perf_counter()
        if g_of_y:
            first = torch.autograd.grad((g * y * y).sum() / 2, leaves, create_graph=double)
        else:
            first = torch.autograd.grad(y, leaves, g, create_graph=double)
        middle = time.perf_counter()
        if not double:
            return middle - start, 0.0
        total = sum((w * d).sum() for w, d in zip(weights, first))
        torch.autograd.grad(total, leaves)
        return middle - start, time.perf_counter() - middle

    return call


def second_order_case(shape: tuple[int, ...], dtype: str, repeats: int) -> list[dict[str, Any]]:
    """One row per implementation and upstream gradient (``G`` constant, ``G∘Y``): median
    seconds of the first backward, the double backward (create_graph first + second) and
    its second part, and their ratios."""
    q, k, v, g = _inputs(shape, dtype)
    calls = {
        (impl, g_of_y, double): _backward_call(_second_attend(impl), double, q, k, v, g, g_of_y)
        for impl in SECOND_IMPLS
        for g_of_y in (False, True)
        for double in (False, True)
    }
    for call in calls.values():
        call()
    samples: dict[Any, list[tuple[float, float]]] = {key: [] for key in calls}
    for _ in range(repeats):
        for key, call in calls.items():
            samples[key].append(call())
    rows = []
    for impl, g_of_y in ((impl, g_of_y) for impl in SECOND_IMPLS for g_of_y in (False, True)):
        first = statistics.median(s[0] for s in samples[impl, g_of_y, False])
        double = statistics.median(s[0] + s[1] for s in samples[impl, g_of_y, True])
        second = statistics.median(s[1] for s in samples[impl, g_of_y, True])
        rows.append({
            "shape": "x".join(map(str, shape)), "impl": impl, "dtype": dtype,
            "upstream": "G∘Y" if g_of_y else "G",
            "first_s": first, "double_s": double, "second_s": second,
            "double_ratio": double / first, "second_ratio": second / first,
        })  # fmt: skip
    return rows


def second_order_peak(impl: str, n: int, dtype: str) -> int:
    """:func:`profiled_peak` of one forward + double backward at (1, 1, n, 64), one thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        q, k, v, g = _inputs((1, 1, n, 64), dtype)
        return profiled_peak(_backward_call(_second_attend(impl), True, q, k, v, g))
    finally:
        torch.set_num_threads(threads)


def second_order_markdown(
    rows: list[dict[str, Any]], peaks: dict[tuple[str, int], int], threads: int, repeats: int,
    load: tuple[str, str],
) -> str:  # fmt: skip
    lines = [
        f"Double backward: {rows[0]['dtype']}, torch threads = {threads}, median of {repeats} "
        "interleaved calls; first = autograd.grad(Y, (q, k, v), G) (upstream G, a constant) "
        "or of Σ G∘Y²/2 (upstream G∘Y, which depends on the inputs: the double backward also "
        "forms Ẏ); double = the first with create_graph=True, then the gradient of "
        f"Σ W∘(dQ, dK, dV); load average before {load[0]}, after {load[1]}",
        "",
        "| shape | implementation | upstream | first s | double s | double / first | second s "
        "| second / first |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['impl']} | {r['upstream']} | {r['first_s']:.3f} "
            f"| {r['double_s']:.3f} "
            f"| {r['double_ratio']:.2f}x | {r['second_s']:.3f} | {r['second_ratio']:.2f}x |"
        )
    if peaks:
        lines += [
            "",
            "Peak of one forward + double backward, (1, 1, n, 64), torch profiler, one thread:",
            "",
            "| n | " + " | ".join(f"{impl} MiB" for impl in SECOND_IMPLS) + " |",
            "| ---: | " + " | ".join("---:" for _ in SECOND_IMPLS) + " |",
        ]
        for n in sorted({n for _, n in peaks}):
            cells = " | ".join(f"{peaks[impl, n] / 2**20:.1f}" for impl in SECOND_IMPLS)
            lines.append(f"| {n} | {cells} |")
    return "\n".join(lines)


# --- the command -------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exactattn bench-torch", description="exactattn.torch.attention vs torch SDPA (CPU)"
    )
    parser.add_argument("--shape", type=int, nargs=4, action="append", default=None,
                        metavar=("B", "H", "N", "D"),
                        help="a (B, H, N, D) case; repeat the flag for more "
                             "(default: 1 8 4096 64 and 4 16 1024 64)")  # fmt: skip
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--no-causal", action="store_true", help="skip the causal rows")
    parser.add_argument("--no-flex", action="store_true", help="skip FlexAttention")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    parser.add_argument("--no-large", action="store_true", help="skip the large cases")
    parser.add_argument("--small", action="store_true", help="add the small-call section")
    parser.add_argument("--small-repeats", type=int, default=200)
    parser.add_argument(
        "--second-order", action="store_true", help="add the double-backward section"
    )
    parser.add_argument("--second-shape", type=int, nargs=4, action="append", default=None,
                        metavar=("B", "H", "N", "D"),
                        help="a double-backward case (default: 1 8 1024 64)")  # fmt: skip
    parser.add_argument("--md", default=None, help="also write the tables to this file")
    parser.add_argument("--csv", default=None, help="also write the large cases' rows here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.repeats < 1 or args.small_repeats < 1:
        raise SystemExit("--repeats and --small-repeats must be >= 1")
    import torch

    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    tables, rows = [], []
    if not args.no_large:
        before = _load()
        for shape in [tuple(s) for s in args.shape] if args.shape else SHAPES:
            for causal in (False,) if args.no_causal else (False, True):
                rows += run_case(shape, causal, args.dtype, args.repeats,
                                 flex=not args.no_flex, memory=not args.no_memory)  # fmt: skip
        tables.append(markdown(rows, threads, (before, _load())))
    if args.small:
        small = [r for case in SMALL_CASES for r in small_case(case, args.small_repeats)]
        tables.append(small_markdown(small, threads, args.small_repeats))
    if args.second_order:
        before = _load()
        shapes = [tuple(s) for s in args.second_shape] if args.second_shape else SECOND_SHAPES
        second = [r for s in shapes for r in second_order_case(s, args.dtype, args.repeats)]
        peaks = {} if args.no_memory else {
            (impl, n): second_order_peak(impl, n, args.dtype)
            for impl in SECOND_IMPLS for n in MEMORY_NS
        }  # fmt: skip
        tables.append(
            second_order_markdown(second, peaks, threads, args.repeats, (before, _load()))
        )
    text = "\n\n".join(tables)
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")
    if args.csv and rows:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
