"""PNG plots of a sweep's CSV (matplotlib, Agg backend): one figure per question.

* ``error_vs_n.png``: forward RMSE of Y against the certified reference vs n, per
  configuration (tiled solid, naive dashed; normal inputs, no mask, b = 64, d = 64);
* ``error_vs_block.png``: the same vs the block size b;
* ``error_vs_bits.png``: max |error| of Y vs significand bits (mpmath-emulated formats),
  tiled and naive, and the tiled-vs-naive deviation;
* ``tiled_vs_naive.png``: every run's tiled error against its naive error;
* ``bound_ratio.png``: measured forward error / first-order bound, per configuration.
"""

from __future__ import annotations

from pathlib import Path

from ..optional import needs

with needs("the sweep's plots (exactattn.precision.plots)"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

BASE = {"dist": "normal", "mask": "none", "scale": 1.0}


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"]


def _select(df: pd.DataFrame, **knobs) -> pd.DataFrame:
    for name, value in knobs.items():
        df = df[df[name] == value]
    return df


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def error_vs_n(df: pd.DataFrame, out: Path) -> Path | None:
    data = _select(_ok(df), block=64, d=64, **BASE)
    data = data[data.groupby("config")["n"].transform("nunique") > 1]
    if data.empty:
        return None
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for i, (config, group) in enumerate(data.groupby("config")):
        color = f"C{i % 10}"
        for impl, style in (("tiled", "-o"), ("naive", "--x")):
            g = group[group["impl"] == impl].groupby("n")["y_rmse"].mean()
            ax.plot(
                g.index,
                g.values,
                style,
                color=color,
                label=config if impl == "tiled" else None,
                markersize=4,
            )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="sequence length n",
        ylabel="RMSE of Y vs certified reference",
        title="Forward error vs n (tiled —, naive --; b=64, d=64, N(0,1))",
    )
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _save(fig, out / "error_vs_n.png")


def error_vs_block(df: pd.DataFrame, out: Path) -> Path | None:
    data = _select(_ok(df), impl="tiled", **BASE)
    data = data[data.groupby(["config", "n", "d"])["block"].transform("nunique") > 2]
    if data.empty:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for (config, n, d), group in data.groupby(["config", "n", "d"]):
        g = group.groupby("block")["y_rmse"].mean()
        ax.plot(g.index, g.values, "-o", label=f"{config} n={n} d={d}", markersize=4)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="block size b",
        ylabel="RMSE of Y",
        title="Tiled forward error vs block size",
    )
    ax.legend(fontsize=7)
    return _save(fig, out / "error_vs_block.png")


def error_vs_bits(df: pd.DataFrame, out: Path) -> Path | None:
    data = _ok(df)
    data = data[data["config"].str.fullmatch(r"mp\d+")]
    if data["bits"].nunique() < 2:
        return None
    n = data["n"].value_counts().idxmax()
    data = data[data["n"] == n]
    fig, ax = plt.subplots(figsize=(6, 4))
    for impl, style in (("tiled", "-o"), ("naive", "--x")):
        g = data[data["impl"] == impl].groupby("bits")["y_max_abs"].mean()
        ax.plot(g.index, g.values, style, label=f"{impl}: max |Y − Y*|")
    g = data[data["impl"] == "tiled"].groupby("bits")["dev_y_max_abs"].mean()
    ax.plot(g.index, g.values, ":s", label="max |tiled − naive| (same arithmetic)")
    ax.set(
        yscale="log",
        xlabel="significand bits p (mpmath-emulated, every op rounded)",
        ylabel="error of Y",
        title=f"Error vs mantissa width (n={n})",
    )
    ax.legend(fontsize=8)
    return _save(fig, out / "error_vs_bits.png")


def tiled_vs_naive(df: pd.DataFrame, out: Path) -> Path | None:
    data = _ok(df)
    wide = data.pivot_table(
        index=[c for c in ("config", "n", "d", "block", "dist", "scale", "mask", "seed")],
        columns="impl",
        values="y_rmse",
    ).dropna()
    if wide.empty:
        return None
    fig, ax = plt.subplots(figsize=(5, 5))
    configs = wide.index.get_level_values("config")
    for i, config in enumerate(sorted(set(configs))):
        part = wide[configs == config]
        ax.scatter(part["naive"], part["tiled"], s=12, color=f"C{i % 10}", label=config)
    lo, hi = wide.min().min(), wide.max().max()
    ax.plot([lo, hi], [lo, hi], "k:", linewidth=1)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="naive RMSE of Y",
        ylabel="tiled RMSE of Y",
        title="Tiled vs naive, same arithmetic",
    )
    ax.legend(fontsize=6)
    return _save(fig, out / "tiled_vs_naive.png")


def bound_ratio(df: pd.DataFrame, out: Path) -> Path | None:
    data = _ok(df).dropna(subset=["bound_ratio"])
    if data.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    configs = sorted(data["config"].unique())
    ax.boxplot([data[data["config"] == c]["bound_ratio"] for c in configs])
    ax.set_xticks(range(1, len(configs) + 1), configs, rotation=45, ha="right", fontsize=7)
    ax.axhline(1.0, color="r", linestyle=":")
    ax.set(
        yscale="log",
        ylabel="measured / bound (≤ 1: bound holds)",
        title="Forward error against the first-order bound",
    )
    return _save(fig, out / "bound_ratio.png")


def all_plots(df: pd.DataFrame, out: str | Path) -> list[Path]:
    out = Path(out)
    made = [
        fn(df, out)
        for fn in (error_vs_n, error_vs_block, error_vs_bits, tiled_vs_naive, bound_ratio)
    ]
    return [path for path in made if path is not None]
