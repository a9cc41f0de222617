"""PNG plots of a sweep's CSV (matplotlib, Agg backend): one figure per question.

* ``error_vs_n.png``: forward RMSE of Y against the certified reference vs n, per
  configuration (tiled solid, naive dashed; normal inputs, no mask, b = 64, d = 64);
* ``error_vs_block.png``: the same vs the block size b;
* ``error_vs_bits.png``: max |error| of Y vs significand bits (mpmath-emulated formats),
  tiled and naive, and the tiled-vs-naive deviation;
* ``tiled_vs_naive.png``: every run's tiled error against its naive error;
* ``bound_ratio.png``: measured / bound per configuration, forward and backward;
* ``bound_hist.png``: histograms of the forward and backward ratios (≤ 1: the bound holds);
* ``golden_bits.png``, ``golden_n.png``, ``golden_block.png``: Golden et al.'s experiment
  on the emulated formats (``emuN-rn|rz``): error against the certified reference and the
  tiled-vs-naive deviation against mantissa bits, sequence length and block size, both
  rounding modes side by side.
"""

from __future__ import annotations

from pathlib import Path

from ..infra.optional import needs
from . import golden

with needs("the sweep's plots (exactattn.precision.plots)"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

BASE = {"dist": "normal", "mask": "none", "score": "none", "scale": 1.0}


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
    data = data[data["config"].astype(str).str.fullmatch(r"mp\d+")]
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
        index=[c for c in ("config", "n", "d", "block", "dist", "scale", "mask", "score", "seed")],
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
    configs = sorted(data["config"].unique())
    fig, ax = plt.subplots(figsize=(max(7, 0.45 * len(configs) + 2), 4))
    for offset, column, color in ((-0.2, "bound_ratio", "C0"), (0.2, "grad_bound_ratio", "C1")):
        groups = [data[data["config"] == c][column].dropna() for c in configs]
        where = [i + 1 + offset for i, g in enumerate(groups) if len(g)]
        parts = [g for g in groups if len(g)]
        if parts:
            box = ax.boxplot(parts, positions=where, widths=0.35, patch_artist=True)
            for patch in box["boxes"]:
                patch.set_facecolor(color)
    ax.set_xticks(range(1, len(configs) + 1), configs, rotation=45, ha="right", fontsize=7)
    ax.axhline(1.0, color="r", linestyle=":")
    ax.plot([], [], "s", color="C0", label="forward (Y)")
    ax.plot([], [], "s", color="C1", label="backward (worst of dQ, dK, dV)")
    ax.legend(fontsize=7, loc="lower left")
    ax.set(
        yscale="log",
        ylabel="measured error / bound (≤ 1: holds)",
        title="Every run against the rigorous bound (exactattn.error.bounds)",
    )
    return _save(fig, out / "bound_ratio.png")


def bound_hist(df: pd.DataFrame, out: Path) -> Path | None:
    data = _ok(df)
    columns = [c for c in ("bound_ratio", "grad_bound_ratio") if data[c].notna().any()]
    if not columns:
        return None
    fig, axes = plt.subplots(1, len(columns), figsize=(5.6 * len(columns), 3.6), squeeze=False)
    for ax, column in zip(axes[0], columns):
        values = data[column].dropna()
        values = values[values > 0]
        bins = np.logspace(np.log10(max(values.min(), 1e-12)), 0.2, 40)
        ax.hist(values, bins=bins, color="C0" if column == "bound_ratio" else "C1")
        ax.axvline(1.0, color="r", linestyle=":")
        what = "forward, Y" if column == "bound_ratio" else "backward, worst of dQ, dK, dV"
        ax.set(
            xscale="log",
            xlabel="measured / bound",
            ylabel="runs",
        )
        ax.set_title(f"{what}: median {values.median():.2g}, worst {values.max():.2g}", fontsize=9)
    return _save(fig, out / "bound_hist.png")


# --- Golden et al. 2024 on the emulated formats --------------------------------------------
STYLE = {"nearest": "-", "toward_zero": "--"}


def _golden_panels(data: pd.DataFrame, x: str, xlabel: str, title: str, path: Path) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for rounding, style in STYLE.items():
        part = data[data["rounding"] == rounding]
        if part.empty:
            continue
        for impl, marker, color in (("tiled", "o", "C0"), ("naive", "x", "C1")):
            g = part[part["impl"] == impl].groupby(x)["y_max_abs"].mean()
            left.plot(g.index, g.values, style, marker=marker, color=color, markersize=4,
                      label=f"{impl}, {rounding}")  # fmt: skip
        g = part[part["impl"] == "tiled"].groupby(x)["dev_y_max_abs"].mean()
        right.plot(g.index, g.values, style, marker="s", color="C2", markersize=4,
                   label=f"max |tiled − naive|, {rounding}")  # fmt: skip
    left.set(yscale="log", xlabel=xlabel, ylabel="max |Y − Y*| (certified Y*)",
             title="error against the exact result")  # fmt: skip
    right.set(yscale="log", xlabel=xlabel, ylabel="max |Y_tiled − Y_naive|",
              title="tiled vs naive, same arithmetic")  # fmt: skip
    for ax in (left, right):
        if x != "mantissa":
            ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def golden_bits(df: pd.DataFrame, out: Path) -> Path | None:
    data = golden.bits_grid(df)
    if data.empty or data["bits"].nunique() < 3:
        return None
    first = data.iloc[0]
    return _golden_panels(
        data.assign(mantissa=data["bits"] - 1),
        "mantissa",
        "mantissa bits (stored; significand = bits + 1)",
        "Golden et al.'s method: every operation's float64 result rounded "
        f"(n={first['n']}, d={first['d']}, b={first['block']})",
        out / "golden_bits.png",
    )


def golden_n(df: pd.DataFrame, out: Path) -> Path | None:
    data = golden.bf16_along(df, "n")
    if data.empty or data["n"].nunique() < 2:
        return None
    title = f"BF16 precision (8 bits), b={data.iloc[0]['block']}, mean over d"
    return _golden_panels(data, "n", "sequence length n", title, out / "golden_n.png")


def golden_block(df: pd.DataFrame, out: Path) -> Path | None:
    data = golden.bf16_along(df, "block")
    if data.empty or data["block"].nunique() < 3:
        return None
    title = f"BF16 precision (8 bits), n={data.iloc[0]['n']}, mean over d"
    return _golden_panels(data, "block", "key-block size b", title, out / "golden_block.png")


def all_plots(df: pd.DataFrame, out: str | Path) -> list[Path]:
    out = Path(out)
    plots = (error_vs_n, error_vs_block, error_vs_bits, tiled_vs_naive, bound_ratio, bound_hist)
    made = [fn(df, out) for fn in (*plots, golden_bits, golden_n, golden_block)]
    return [path for path in made if path is not None]
