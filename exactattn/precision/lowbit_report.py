"""The low-bit section of the sweep's report: the papers' claims beside ours.

Every number is computed from the CSV (``--preset lowbit``). The claims quoted:

* FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608) §4.3: on inputs N(0, 1) +
  N(0, 100)·Bernoulli(0.001), FP8 with block quantisation and incoherent processing has
  RMSE 9.1e-3 against 2.4e-2 for baseline FP8 (per-tensor): 2.6× lower;
* arXiv:2606.06521 (P cast to E4M3 behind an attention sink): in forward key order a
  fraction of the non-sink ``p`` underflows, given in closed form by the sink strength;
  reverse order removes it, with a 3–10× MSE improvement at moderate sink strengths, and
  the static scale ``S = 2^8`` reaches the same floor;
* SageAttention2 (arXiv:2411.10958) §4.4: the FP22 accumulator of Hopper's FP8 MMA loses
  accuracy in ``P·V``; an FP32 buffer every few MMAs (two-level accumulation) avoids it.

**The closed form** (our derivation from the definitions, which the paper's abstract
matches "to leading order"): with the sink (key 0, score ``A`` against every row) in the
first key block, the online softmax's running max is ``A`` from the first block on, so a
non-sink weight is ``p_ij = e^{s_ij − A}``, cast as ``fl(p·S)/S``; e4m3 sends to 0 what is
at or below half its smallest subnormal, ``2^{−10}``: ``p_ij·S ≤ 2^{−10}``, i.e.
``s_ij ≤ A − (10 + log₂ S) ln 2``. With ``s_ij ~ N(0, σ_i²)``, ``σ_i² = c²(1 +
Σ_{r>0} q_ir²)`` given row ``i`` (:mod:`exactattn.cases.inputs`, ``sink-A``), the expected
fraction of the ``n`` positive weights of a row is ``((n − 1)/n)·mean_i Φ((A − (10 +
log₂ S) ln 2)/σ_i)``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from ..cases.inputs import SINK, make_inputs

if TYPE_CHECKING:  # the tables read the sweep's DataFrame; the closed form needs no pandas
    import pandas as pd

FA3_FP8 = ("fa3-fp8-tensor", "fa3-fp8-block", "fa3-fp8-block-hadamard")
PCAST_MODERATE = (6, 8, 10)  # "moderate sink strengths" for the 3–10× claim


def _phi(x: np.ndarray) -> np.ndarray:
    return 0.5 * np.vectorize(math.erfc)(-np.asarray(x) / math.sqrt(2))


def predicted_underflow(dist: str, n: int, d: int, seed: int, scale: float, s_cast: float) -> float:
    """The closed form of the module docstring for one problem (forward order)."""
    sink = SINK.fullmatch(dist)
    if sink is None:
        return math.nan
    a = int(sink.group(1))
    q = make_inputs(dist, n, d, seed)["q"]
    c = scale / math.sqrt(d)
    sigma = c * np.sqrt(1 + (q[:, 1:] ** 2).sum(axis=1))
    threshold = a - (10 + math.log2(s_cast)) * math.log(2)
    return float((n - 1) / n * _phi(threshold / sigma).mean())


def _tiled(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["impl"] == "tiled") & (df["status"] == "ok")]


def _largest_n(df: pd.DataFrame, config: str, dist: str | None = None) -> int | None:
    """The largest ``n`` at which ``config`` ran (on ``dist``, or a ``sink-`` input for
    ``"sink"``): the point a claim is judged at."""
    rows = df[df["config"] == config]
    if dist == "sink":
        rows = rows[rows["dist"].str.startswith("sink-")]
    elif dist is not None:
        rows = rows[rows["dist"] == dist]
    return int(rows["n"].max()) if len(rows) else None


def _mean(df: pd.DataFrame, config: str, column: str, **knobs: Any) -> float:
    rows = df[df["config"] == config]
    for name, value in knobs.items():
        rows = rows[rows[name] == value]
    return float(rows[column].astype(float).mean()) if len(rows) else math.nan


def scheme_table(df: pd.DataFrame) -> list[list[Any]]:
    """Per scheme and input: the papers' metrics, RMSE against the certified reference,
    the ratio to the fp16 FA-2 baseline's RMSE and the worst bound ratio (tiled, at the
    smallest n every scheme ran)."""
    data = _tiled(df)
    data = data[
        (data["n"] == data[data["config"] == "sage1"]["n"].min())
        & (data["block"] == data[data["config"] == "sage1"]["block"].min())
    ]
    rows = []
    for (config, dist), group in data.groupby(["config", "dist"], sort=False):
        base = _mean(data, "np-fa2-fp16", "y_rmse", dist=dist)
        rmse = float(group["y_rmse"].mean())
        rows.append(
            [
                config,
                dist,
                rmse,
                float(group["y_cossim"].astype(float).mean()),
                float(group["y_rel_l1"].astype(float).mean()),
                rmse / base if base else math.nan,
                float(group["bound_ratio"].max()),
                float(group["p_underflow"].astype(float).mean()),
            ]
        )
    return rows


def underflow_table(df: pd.DataFrame) -> list[list[Any]]:
    """P cast behind a sink, per ``n`` and strength ``A``: measured underflow against the
    closed form, and RMSE of each order and scale (tiled; – where a variant did not run)."""
    data = _tiled(df)
    data = data[data["dist"].str.startswith("sink-")]
    data = data[data["config"].str.startswith("pcast-")]
    rows = []
    for (n, dist), at in sorted(
        data.groupby(["n", "dist"]), key=lambda x: (x[0][0], int(x[0][1].split("-")[1]))
    ):
        first = at.iloc[0]
        predicted = np.mean(
            [
                predicted_underflow(dist, int(r.n), int(r.d), int(r.seed), float(r.scale), 1.0)
                for r in at[at["config"] == "pcast-fwd"].itertuples()
            ]
        )
        fwd, rev = (_mean(at, c, "y_rmse") for c in ("pcast-fwd", "pcast-rev"))
        fwd_s, rev_s = (_mean(at, c, "y_rmse") for c in ("pcast-fwd-s256", "pcast-rev-s256"))
        rows.append(
            [
                int(n),
                int(dist.split("-")[1]),
                int(first.block),
                _mean(at, "pcast-fwd", "p_underflow"),
                predicted,
                _mean(at, "pcast-rev", "p_underflow"),
                _mean(at, "pcast-fwd-s256", "p_underflow"),
                fwd,
                rev,
                fwd_s,
                rev_s,
                (fwd / rev) ** 2,
                (fwd / fwd_s) ** 2,
            ]
        )
    return rows


def _verdict(ok: bool | None, partly: bool = False) -> str:
    if ok is None:
        return "–"
    return "yes" if ok else ("partly" if partly else "no")


def claims(df: pd.DataFrame) -> list[list[Any]]:
    """Their claim, ours, reproduces?, why."""
    data = _tiled(df)
    out: list[list[Any]] = []
    n = _largest_n(data, "fa3-fp8-block-hadamard", "fa3-outliers")
    fa3 = data[(data["n"] == n) & (data["dist"] == "fa3-outliers")]
    if not fa3.empty:
        tensor, block, rotated = (_mean(fa3, c, "y_rmse") for c in FA3_FP8)
        gain = tensor / rotated
        out.append(
            [
                "FA3 §4.3: block quantisation + incoherent processing: 2.6× lower FP8 RMSE "
                "than per-tensor (9.1e-3 vs 2.4e-2)",
                f"{gain:.2f}× at n = {n} (per-tensor {tensor:.2g}, block {block:.2g}, block + "
                f"Hadamard {rotated:.2g}; block scales alone {tensor / block:.2f}×)",
                _verdict(gain >= 2.0, partly=gain >= 1.2),
                f"our per-tensor baseline ({tensor:.2g}) is the published 2.4e-2; block scales "
                "alone gain little (outliers are rare, p = 0.001: most 128-row blocks hold "
                "one); the rotation of Q, K gives the rest, while V and p stay e4m3 in every "
                "variant; FA3's exact settings for its figure are not stated beyond §4.3",
            ]
        )
    rows = underflow_table(df)
    if rows:
        n_sink = int(Counter(r[0] for r in rows).most_common(1)[0][0])
        rows = [r for r in rows if r[0] == n_sink]
        gaps = [abs(r[3] - r[4]) for r in rows]
        table = ", ".join(f"A={r[1]}: {r[3]:.3f} vs {r[4]:.3f}" for r in rows)
        out.append(
            [
                "arXiv:2606.06521: forward order, a closed-form fraction of non-sink p "
                "underflows in the e4m3 cast",
                f"n = {n_sink}, measured vs closed form: {table}",
                _verdict(max(gaps) <= 0.02),
                "online softmax against the running max, the sink in the first block; the "
                "closed form (lowbit_report's docstring) is derived from the definitions: "
                "s_ij ≤ A − 10 ln 2 underflows, s_ij ~ N(0, σ_i²)",
            ]
        )
        moderate = [r for r in rows if r[1] in PCAST_MODERATE]
        gains = [r[11] for r in moderate]
        inside = [3 <= g <= 10 for g in gains]
        out.append(
            [
                "arXiv:2606.06521: reverse key order improves MSE 3–10× at moderate sink strengths",
                "MSE fwd/rev: " + ", ".join(f"A={r[1]}: {r[11]:.1f}×" for r in moderate),
                _verdict(bool(gains) and all(inside), partly=any(inside) or min(gains) > 3),
                "reverse order meets the sink last: only the sink's own block (b/n of the "
                "keys) sees its max; our Q, K, V stay fp32, so nothing else bounds the "
                "gain from below, and it exceeds 10× where most of p underflows forward",
            ]
        )
        both = [r for r in moderate if math.isfinite(r[9]) and math.isfinite(r[10])]
        out.append(
            [
                "arXiv:2606.06521: S = 2^8 removes the collapse; both fixes saturate to the "
                "same floor",
                "underflow fwd·S: "
                + ", ".join(f"A={r[1]}: {r[6]:.2g}" for r in both)
                + "; RMSE rev·S / fwd·S: "
                + ", ".join(f"{r[10] / r[9]:.2f}" for r in both),
                _verdict(bool(both) and all(abs(r[10] / r[9] - 1) < 0.25 for r in both)),
                "2^8 moves e4m3's underflow threshold from 2^-10 to 2^-18 (A − 12.5 in score "
                "units); beyond A ≈ 12 it collapses again",
            ]
        )
    naive = df[(df["impl"] == "naive") & (df["status"] == "ok")]
    two, fp22 = (_mean(naive, c, "y_rmse") for c in ("sage2-int8", "sage2-int8-fp22"))
    if math.isfinite(two) and math.isfinite(fp22):
        n_sage = int(naive[naive["config"] == "sage2-int8"]["n"].max())
        out.append(
            [
                "SageAttention2 §4.4: the FP22 accumulator of FP8 P·V loses accuracy; "
                "two-level (FP32 buffer) accumulation avoids it",
                f"RMSE FP22 / two-level: {fp22 / two:.3f} (naive: all n = {n_sage} keys in "
                "one accumulator)",
                _verdict(fp22 / two >= 1.1, partly=fp22 / two > 1.0),
                "the direction holds, the size is small at this n: FP22's 2^-13 per addition "
                "sits far below the e4m3 cast of P and V (2^-4), which dominates",
            ]
        )
    return out


NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def with_spread(pooled: str, per_seed: list[str]) -> str:
    """``pooled`` with each figure followed by its range over the seeds' texts
    (``0.174 [0.171–0.178]``), where the seeds' texts have the same figures in the same
    places and the figure varies; knobs (``n = 1024``, ``A=6``) do not vary and stay bare."""
    found = [NUMBER.findall(text) for text in per_seed]
    spans = list(NUMBER.finditer(pooled))
    if len(per_seed) < 2 or any(len(f) != len(spans) for f in found):
        return pooled
    out, last = [], 0
    for i, match in enumerate(spans):
        values = [float(f[i]) for f in found]
        out.append(pooled[last : match.end()])
        if min(values) != max(values):
            out.append(f" [{min(values):.3g}–{max(values):.3g}]")
        last = match.end()
    return "".join(out) + pooled[last:]


def claims_over_seeds(df: pd.DataFrame) -> list[list[Any]]:
    """:func:`claims` on the runs of every seed pooled (means over seeds), each figure of
    "ours" followed by its range over the seeds (:func:`with_spread`; the verdict is the
    pooled one's)."""
    pooled = claims(df)
    seeds = sorted(df["seed"].unique()) if "seed" in df else []
    if len(seeds) < 2:
        return pooled
    per_seed = [claims(df[df["seed"] == s]) for s in seeds]
    if any(len(rows) != len(pooled) for rows in per_seed):
        return pooled
    return [
        [row[0], with_spread(row[1], [rows[i][1] for rows in per_seed]), *row[2:]]
        for i, row in enumerate(pooled)
    ]


def lowbit_section(df: pd.DataFrame, table: Any) -> list[str]:
    """The report's low-bit section (``table(header, rows)``: the report's markdown tables),
    empty without low-bit runs."""
    _table = table
    if not df["config"].isin(["fa3-fp8-tensor", "sage1", "pcast-fwd"]).any():
        return []
    lines = ["", "## Low-bit attention: the claims", ""]
    seeds = df["seed"].nunique() if "seed" in df else 1
    if seeds > 1:
        lines += [f"Means over {seeds} seeds; [range over the seeds] after each figure.", ""]
    lines += _table(["their claim", "ours", "reproduces?", "why"], claims_over_seeds(df))
    bounds = df[(df["status"] == "ok") & df["backend"].astype(str).str.startswith("lowbit")]
    worst = float(bounds["bound_ratio"].max())
    useless = bounds[bounds["bound_ratio"] < 1e-6]
    held = "held in every low-bit run" if worst <= 1 else "did NOT hold in every low-bit run"
    stated = bounds[bounds["arith_bound_ratio"].notna()] if "arith_bound_ratio" in bounds else []
    lines += [
        "",
        f"The rigorous bound (exactattn.error.bounds with the scheme's quantisation, p cast and "
        f"accumulator) {held}: worst measured/bound {worst:.3g} over {len(bounds)} tiled "
        f"and naive runs (≤ 1 where it holds; the median, "
        f"{bounds['bound_ratio'].median():.3g}, is its looseness).",
    ]
    if len(stated):
        lines += [
            "",
            f"{len(stated)} of them are of schemes that state their quantiser "
            "(quantiser=nearest, exactattn.error.nearest_quantiser): their bound is "
            "B(x̃) + |Y(x̃) − Y|, the arithmetic after the quantisation bounded at the "
            "quantised inputs x̃ plus the quantisation's own effect, certified. The "
            f"arithmetic alone, |Ŷ − Y(x̃)| / B(x̃): worst {stated['arith_bound_ratio'].max():.3g}"
            f", median {stated['arith_bound_ratio'].median():.3g}.",
        ]
    if len(useless):
        lines += [
            "",
            f"In {len(useless)} runs the bound is finite but useless (ratio < 1e-6: "
            + ", ".join(sorted({f"{r.config} {r.dist}" for r in useless.itertuples()}))
            + "): a worst case in which an entry errs by a 4-bit format's u = 1/4 (or by "
            "s/2 of an INT8 group of large logits) moves the scores by several units, and "
            "e^ΔS then admits any output.",
        ]
    lines += [
        "",
        "## Low-bit schemes (tiled, at the smallest n and b every scheme ran; means over seeds)",
        "",
    ]
    lines += _table(
        [
            "scheme",
            "inputs",
            "RMSE Y",
            "cosine",
            "rel L1",
            "RMSE / fp16 FA-2",
            "worst bound ratio",
            "p underflow",
        ],
        scheme_table(df),
    )
    rows = underflow_table(df)
    if rows:
        lines += ["", "## P cast behind an attention sink (tiled, forward only)", ""]
        lines += _table(
            [
                "n",
                "A",
                "b",
                "underflow fwd",
                "closed form",
                "underflow rev",
                "underflow fwd S=2^8",
                "RMSE fwd",
                "RMSE rev",
                "RMSE fwd S",
                "RMSE rev S",
                "MSE fwd/rev",
                "MSE fwd/fwd S",
            ],
            rows,
        )
    return lines
