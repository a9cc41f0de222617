"""Which runs of a sweep answer Golden et al.'s (2024) questions, for the report and plots.

Their experiment, on the emulated formats ``emuN-rn|rz`` (every operation's float64 result
rounded to ``N`` significand bits, to nearest or truncated): the error of the tiled
algorithm and of naive attention against the exact result, and the deviation
``max |Y_tiled − Y_naive|`` between them, along the mantissa width, the sequence length and
the key-block size. A preset sweeps one knob per grid; :func:`most` finds the grid that
sweeps a knob, so the same selections serve ``golden`` and its scaled-down ``golden-tiny``.
"""

from __future__ import annotations

from ..infra.optional import needs

with needs("the sweep's Golden et al. tables (exactattn.precision.golden)"):
    import pandas as pd

ROUNDINGS = ("nearest", "toward_zero")


def emulated(df: pd.DataFrame, policy: bool = False) -> pd.DataFrame:
    """The ok runs of the single-format emulations (``emuN-rn|rz``; ``policy``: ``-fa2``)."""
    pattern = r"emu\d+-r[nz]-fa2" if policy else r"emu\d+-r[nz]"
    ok = df[df["status"] == "ok"]
    return ok[ok["config"].astype(str).str.fullmatch(pattern)]


def most(data: pd.DataFrame, by: list[str], varying: str) -> pd.DataFrame:
    """The runs of the ``by`` combination along which ``varying`` takes most values (the
    largest combination on a tie): the grid that sweeps ``varying``."""
    if data.empty:
        return data
    counts = data.groupby(by)[varying].nunique()
    best = counts[counts == counts.max()].index.max()
    best = best if isinstance(best, tuple) else (best,)
    for name, value in zip(by, best):
        data = data[data[name] == value]
    return data


def bits_grid(df: pd.DataFrame) -> pd.DataFrame:
    """The runs that sweep the mantissa width (one n, d, b)."""
    return most(emulated(df), ["n", "d", "block"], "bits")


def bf16_along(df: pd.DataFrame, axis: str) -> pd.DataFrame:
    """8-bit runs on the grid that sweeps ``axis`` (``n`` at one b, or ``block`` at one n)."""
    data = emulated(df)
    data = data[data["bits"] == 8]
    return most(data, ["block"] if axis == "n" else ["n"], axis)


def pair(data: pd.DataFrame) -> dict[str, float]:
    """Means over the runs: tiled and naive error, their ratio, the deviation and its ratio
    to the naive error (empty when either implementation is missing)."""
    tiled, naive = data[data["impl"] == "tiled"], data[data["impl"] == "naive"]
    if tiled.empty or naive.empty:
        return {}
    t, n = tiled["y_max_abs"].mean(), naive["y_max_abs"].mean()
    dev = tiled["dev_y_max_abs"].mean()
    return {"tiled": t, "naive": n, "ratio": t / n, "dev": dev, "dev_ratio": dev / n}
