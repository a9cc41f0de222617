"""NumPy benchmark: tiled vs naive attention, side by side in one run.

For each (n, dtype) it times the tiled forward, the naive forward, and both with the
reverse pass (median of ``--repeats`` runs, interleaved so machine noise hits both), and
measures each one's peak Python-heap allocation with :mod:`tracemalloc` (NumPy reports its
array buffers to tracemalloc). Ratios are tiled / naive: below 1 means the tiled code wins.
``--hvp`` adds the second-order reverse (:func:`exactattn.attention_hvp` along random
tangents of q, k, v and grad_y, from the forward's y and stats), timed and measured alone:
its peak grows linearly in n as the first reverse's does.

    exactattn bench --n 1024 2048 4096 8192 16384 --dtype float32 float64
    exactattn bench --n 1024 4096 --dtype float64 --hvp --max-naive-n 0
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

from ..api import (
    attention,
    attention_backward,
    attention_hvp,
    naive_attention,
    naive_attention_backward,
)


def _hvp_pass(q, k, v, g, block_size) -> Callable[[], Any]:
    """attention_hvp alone, along fixed random tangents (the forward run once, outside)."""
    rng = np.random.default_rng(1)
    tangents = tuple(rng.standard_normal(x.shape).astype(x.dtype) for x in (q, k, v, g))
    y, stats = attention(q, k, v, block_size=block_size, return_stats=True)
    return lambda: attention_hvp(q, k, v, y, stats, g, tangents, block_size=block_size)


def _passes(q, k, v, g, block_size) -> dict[str, Callable[[], Any]]:
    def tiled_fwd():
        return attention(q, k, v, block_size=block_size)

    def naive_fwd():
        return naive_attention(q, k, v)

    def tiled_fwd_bwd():
        y, stats = attention(q, k, v, block_size=block_size, return_stats=True)
        return attention_backward(q, k, v, y, stats, g, block_size=block_size)

    def naive_fwd_bwd():
        y, stats = naive_attention(q, k, v, return_stats=True)
        return naive_attention_backward(q, k, v, y, stats, g)

    return {
        "tiled fwd": tiled_fwd,
        "naive fwd": naive_fwd,
        "tiled fwd+bwd": tiled_fwd_bwd,
        "naive fwd+bwd": naive_fwd_bwd,
    }


def _peak_bytes(fn: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def run(
    ns: list[int],
    dtypes: list[str],
    d: int,
    block_size: int | None,
    repeats: int,
    max_naive_n: int,
    hvp: bool = False,
) -> list[dict[str, Any]]:
    """One row per (n, dtype, pass) with median seconds and peak bytes."""
    rows = []
    rng = np.random.default_rng(0)
    for dtype in dtypes:
        for n in ns:
            q, k, v, g = (rng.standard_normal((n, d)).astype(dtype) for _ in range(4))
            passes = _passes(q, k, v, g, block_size)
            if n > max_naive_n:
                passes = {name: fn for name, fn in passes.items() if name.startswith("tiled")}
            if hvp:
                passes["tiled hvp"] = _hvp_pass(q, k, v, g, block_size)
            times: dict[str, list[float]] = {name: [] for name in passes}
            for _ in range(repeats):
                for name, fn in passes.items():
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
            for name, fn in passes.items():
                rows.append(
                    {
                        "dtype": dtype,
                        "n": n,
                        "pass": name,
                        "seconds": statistics.median(times[name]),
                        "peak_bytes": _peak_bytes(fn),
                    }
                )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per (dtype, n, fwd / fwd+bwd) with tiled, naive and the ratios."""
    by_key = {(r["dtype"], r["n"], r["pass"]): r for r in rows}
    lines = [
        "| dtype | n | pass | tiled s | naive s | time ratio | tiled peak MiB | "
        "naive peak MiB | memory ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    mib = 1 << 20
    for dtype, n, name in sorted({(r["dtype"], r["n"], r["pass"].split()[1]) for r in rows}):
        tiled = by_key[(dtype, n, f"tiled {name}")]
        naive = by_key.get((dtype, n, f"naive {name}"))
        t_ratio = f"{tiled['seconds'] / naive['seconds']:.2f}x" if naive else "–"
        m_ratio = f"1/{naive['peak_bytes'] / tiled['peak_bytes']:.0f}" if naive else "–"
        naive_s = f"{naive['seconds']:.3f}" if naive else "not run"
        naive_m = f"{naive['peak_bytes'] / mib:.1f}" if naive else "–"
        lines.append(
            f"| {dtype} | {n} | {name} | {tiled['seconds']:.3f} | {naive_s} | {t_ratio} | "
            f"{tiled['peak_bytes'] / mib:.1f} | {naive_m} | {m_ratio} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="exactattn bench", description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--dtype", nargs="+", default=["float32", "float64"])
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--max-naive-n", type=int, default=16384, help="skip naive above this n (memory)"
    )
    parser.add_argument("--hvp", action="store_true", help="add attention_hvp (second order)")
    args = parser.parse_args(argv)
    rows = run(
        args.n, args.dtype, args.d, args.block_size, args.repeats, args.max_naive_n, args.hvp
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
