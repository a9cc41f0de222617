"""How the rigorous bound's ratio measured/bound moved between two runs of a sweep preset,
run by run: ``python -m exactattn.precision.bound_moves BEFORE.csv AFTER.csv``.

Runs are matched on the grid point (config, impl, n, d, block, dist, scale, mask, seed);
per configuration the table gives the matched runs, the median and smallest ratio before
and after, the factor ``after/before`` (how much tighter the bound became: the measured
error is the same run's, so the factor is ``bound_before/bound_after``) at its smallest,
median and largest, the runs within ``10^4×`` of the measured error after
(``ratio ≥ 1e-4``), and the largest ratio after (at most 1 where the bound holds).
"""

from __future__ import annotations

import argparse
from typing import Any

KEYS = ["config", "impl", "n", "d", "block", "dist", "scale", "mask", "seed"]
WITHIN = 1e-4  # "within 10^4 of the measured error"


def moves(before: Any, after: Any) -> list[list[Any]]:
    """The table of the module docstring (``before``, ``after``: the sweeps' DataFrames)."""
    cols = [k for k in KEYS if k in before and k in after]
    ok_b = before[before["status"] == "ok"][[*cols, "bound_ratio"]]
    ok_a = after[after["status"] == "ok"][[*cols, "bound_ratio"]]
    both = ok_b.merge(ok_a, on=cols, suffixes=("_before", "_after"))
    both = both[both["bound_ratio_before"] > 0]
    rows = []
    for config, g in both.groupby("config", sort=False):
        factor = g["bound_ratio_after"] / g["bound_ratio_before"]
        rows.append(
            [
                config,
                len(g),
                float(g["bound_ratio_before"].median()),
                float(g["bound_ratio_before"].min()),
                float(g["bound_ratio_after"].median()),
                float(g["bound_ratio_after"].min()),
                float(factor.min()),
                float(factor.median()),
                float(factor.max()),
                f"{int((g['bound_ratio_after'] >= WITHIN).sum())}/{len(g)}",
                float(g["bound_ratio_after"].max()),
            ]
        )
    return rows


HEADER = [
    "config",
    "runs",
    "median before",
    "min before",
    "median after",
    "min after",
    "after/before min",
    "median",
    "max",
    "within 1e4",
    "max after",
]


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    parser = argparse.ArgumentParser(prog="python -m exactattn.precision.bound_moves")
    parser.add_argument("before")
    parser.add_argument("after")
    args = parser.parse_args(argv)
    rows = moves(pd.read_csv(args.before), pd.read_csv(args.after))
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for row in rows:
        cells = [f"{x:.3g}" if isinstance(x, float) else str(x) for x in row]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
