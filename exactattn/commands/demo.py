"""``exactattn demo``: one tiled algorithm, three number systems, each against naive attention.

Runs the library's tiled forward and reverse on the same small causal problem over
NumPy float64 (rounded), mpmath at 50 digits (rounded far below float64's error) and
sympy (exact: the proofs' zero test shows the difference is exactly zero), and prints
how far each is from the naive reference computed in the same arithmetic.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import sympy

from .. import api
from ..backends import MpmathContext, SympyContext
from ..core import masks
from ..proofs.engine.zero_test import all_equal


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    return max((abs(x - y) for x, y in zip(a.flat, b.flat)), default=0.0)


def _numeric_rows(n: int, d: int, b: int) -> list[str]:
    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((n, d)) for _ in range(4))
    mask = masks.causal()
    rows = []
    for label, backend in (("numpy float64", None), ("mpmath 50 digits", MpmathContext(dps=50))):
        start = time.perf_counter()
        kw = dict(mask=mask, backend=backend)
        y, stats = api.attention(q, k, v, block_size=b, return_stats=True, **kw)
        grads = api.attention_backward(q, k, v, y, stats, g, block_size=b, **kw)
        y_ref, s_ref = api.naive_attention(q, k, v, return_stats=True, **kw)
        ref = api.naive_attention_backward(q, k, v, y_ref, s_ref, g, **kw)
        errors = [_max_abs(y, y_ref)] + [_max_abs(a, r) for a, r in zip(grads, ref)]
        rows.append(
            f"{label:<18} n={n} d={d} b={b}  max|Δ| Y {float(errors[0]):.1e}  "
            f"dQ {float(errors[1]):.1e}  dK {float(errors[2]):.1e}  dV {float(errors[3]):.1e}"
            f"  ({time.perf_counter() - start:.2f} s)"
        )
    return rows


def _sympy_row(n: int) -> str:
    start = time.perf_counter()
    q = np.array(sympy.symbols(f"q0:{n}", real=True)).reshape(n, 1)
    k = np.array(sympy.symbols(f"k0:{n}", real=True)).reshape(n, 1)
    v = np.array(sympy.symbols(f"v0:{n}", real=True)).reshape(n, 1)
    c = sympy.Symbol("c", positive=True)
    y_ref = api.naive_attention(q, k, v, scale=c, backend=SympyContext())
    exact = all(
        all_equal(api.attention(q, k, v, block_size=b, scale=c, backend=SympyContext()), y_ref)[0]
        for b in range(1, n + 2)
    )
    verdict = "tiled − naive = 0 exactly" if exact else "tiled − naive is NOT zero"
    return (
        f"{'sympy (exact)':<18} n={n} d=1 b=1..{n + 1}, symbolic c: {verdict}"
        f"  ({time.perf_counter() - start:.2f} s)"
    ), exact


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="exactattn demo", description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=24)
    parser.add_argument("--d", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=5)
    args = parser.parse_args(argv)
    print("Tiled attention vs naive attention in the same arithmetic (causal mask):")
    for row in _numeric_rows(args.n, args.d, args.block_size):
        print("  " + row)
    row, exact = _sympy_row(3)
    print("  " + row)
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
