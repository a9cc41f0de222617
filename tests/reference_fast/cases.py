"""Drawn cases for the float64 reference, and the containment check against arb.

Every mask, bias and keep set is written here from its definition (``j ≤ i``, ``|i − j| ≤
w``, ``j < L_b``, …), never through :mod:`exactattn.core.masks`. The judge is the arb reference
(:func:`exactattn.oracle.certified.certified_attention`), whose balls are ~2^-70 wide relative (and
a few subnormal spacings absolute): a fast enclosure is *shown correct* on an output element
when it contains the whole arb ball, ``|mid_fast − mid_arb| + rad_arb ≤ rad_fast``, and
*refuted* when it contains no point of it, ``|mid_fast − mid_arb| − rad_arb > rad_fast``,
both decided exactly in mpmath.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mpmath
import numpy as np

MASKS = ("none", "causal", "causal-bottom-right", "window", "padding", "dense", "empty-rows")
DISTS = ("normal", "large-logits", "tiny-values", "outliers", "single-rounding")


@dataclass
class Case:
    """Inputs and keywords of one drawn case; ``lazy`` names the arguments passed to the
    fast reference as row callables (arb always gets dense arrays)."""

    arrays: tuple[np.ndarray, ...]
    keywords: dict[str, Any]
    lazy: tuple[str, ...]
    label: str
    fast_keywords: dict[str, Any] = field(default_factory=dict)

    def fast(self) -> dict[str, Any]:
        out = dict(self.keywords, **self.fast_keywords)
        for name in self.lazy:
            out[name] = _rows_of(self.keywords[name])
        return out


def _rows_of(table: np.ndarray):
    """A lazy ``(start, stop)`` callable that serves rows of a dense table (as a long case's
    callable would compute them)."""

    def rows(start: int, stop: int) -> np.ndarray:
        return table if table.shape[-2] == 1 else table[..., start:stop, :]

    return rows


def _mask(rng, kind: str, batch: tuple, n_q: int, n_k: int) -> np.ndarray | None:
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    if kind == "none":
        return None
    if kind == "causal":  # top-left aligned, torch SDPA's is_causal
        return j <= i
    if kind == "causal-bottom-right":  # flash-attn's: the last query sees every key
        return j <= i + (n_k - n_q)
    if kind == "window":
        w = int(rng.integers(0, 3))
        return np.abs(i - j) <= w
    if kind == "padding":  # keys j < L_b for each batch element b
        lead = batch[:1] or (1,)
        lengths = rng.integers(1, n_k + 1, size=lead)
        out = j[None] < lengths[:, None, None]
        return out.reshape((*lead, *([1] * (len(batch) - 1)), 1, n_k)) if batch else out[0]
    allowed = rng.random((*batch, n_q, n_k)) < 0.6
    if kind == "empty-rows":
        allowed[..., rng.integers(0, n_q), :] = False
    return allowed


def draw(seed: int) -> Case:
    """One case: sizes, batch/GQA layout, input distribution and dtype, mask, bias (with
    −∞), softcap, dropout, scale, row block and which arguments go lazy, from the seed."""
    rng = np.random.default_rng(seed)
    dist = DISTS[int(rng.integers(len(DISTS)))]
    n_q, n_k = (int(x) for x in rng.integers(1, 11, size=2))
    d = int(rng.choice([1, 2, 3, 4, 5, 8]))
    dv = int(rng.choice([1, 2, 3, 4]))
    gqa = bool(rng.random() < 0.2)
    if gqa:
        h_kv = int(rng.choice([1, 2]))
        h = h_kv * int(rng.choice([1, 2, 3]))
        lead = (int(rng.integers(1, 3)), h)
        q_lead, kv_lead = lead, (lead[0], h_kv)
    else:
        layout = int(rng.integers(4))
        lead = [(), (2,), (2, 3), (2, 3)][layout]
        q_lead, kv_lead = lead, [(), (2,), (2, 3), (3,)][layout]  # the last: k, v broadcast
    batch = lead
    if dist == "single-rounding":  # d = 1, exact scale, one key: the score's one rounding
        d, n_k = 1, 1
    q = rng.standard_normal((*q_lead, n_q, d))
    k = rng.standard_normal((*kv_lead, n_k, d))
    v = rng.standard_normal((*kv_lead, n_k, dv))
    g = rng.standard_normal((*batch, n_q, dv))
    if dist == "large-logits":
        q, k = q * 12, k * 12
    elif dist == "tiny-values":
        v, g = v * 1e-150, g * 1e-160
        q = q * (1e-160 if rng.random() < 0.5 else 1.0)
    elif dist == "outliers":  # FlashAttention-3's N(0,1) + N(0,100)·Bernoulli(0.1)
        for x in (q, k, v):
            x += rng.standard_normal(x.shape) * 10 * (rng.random(x.shape) < 0.1)
    elif dist == "single-rounding":
        q, k = q * 40, k * 40
    if rng.random() < 0.1:  # float32 inputs: exact in float64, as arb takes them
        q, k, v, g = (x.astype(np.float32) for x in (q, k, v, g))
    keywords: dict[str, Any] = {}
    scale_kind = int(rng.integers(3))
    if dist == "single-rounding":
        keywords["scale"] = 1.0
    elif scale_kind == 1:
        keywords["scale"] = float(rng.uniform(0.1, 2.0))
    mask = MASKS[int(rng.integers(len(MASKS)))]
    allowed = _mask(rng, mask, batch, n_q, n_k)
    if allowed is not None:
        keywords["allowed"] = allowed
    if rng.random() < 0.3:
        shape = [(n_q, n_k), (1, n_k), (n_q, 1), (*batch, n_q, n_k)][int(rng.integers(4))]
        bias = rng.standard_normal(shape) * float(rng.choice([1.0, 30.0]))
        if shape[-1] > 1 and rng.random() < 0.5:
            bias[..., int(rng.integers(shape[-2])), int(rng.integers(shape[-1]))] = -np.inf
        keywords["bias"] = bias
    if rng.random() < 0.25:
        keywords["softcap"] = float(rng.choice([0.5, 5.0, 30.0]))
    if rng.random() < 0.25:
        keywords["dropout_p"] = float(rng.choice([0.1, 0.5]))
        keywords["keep"] = rng.random((*batch, n_q, n_k)) >= keywords["dropout_p"]
    if gqa:
        keywords["enable_gqa"] = True
    lazy = tuple(
        name
        for name in ("allowed", "bias", "keep")
        if name in keywords and keywords[name].ndim >= 2 and rng.random() < 0.5
    )
    fast_keywords = {"row_block": int(rng.integers(1, n_q + 1))}
    label = f"{dist} {q.dtype}, mask {mask}, n_q={n_q} n_k={n_k} d={d} dv={dv} batch={batch}"
    label += "".join(f", {key}" for key in sorted(keywords) if key not in ("allowed",))
    if lazy:
        label += f", lazy {','.join(lazy)}"
    return Case((q, k, v, g), keywords, lazy, label, fast_keywords)


def _mid(hi: float, lo: float) -> mpmath.mpf:
    return mpmath.fadd(mpmath.mpf(hi), mpmath.mpf(lo), exact=True)


@dataclass
class Verdict:
    """One output's comparison: the worst ``(|mid_fast − mid_arb| + rad_arb) / rad_fast``
    over the elements it decides, how many elements are *refuted* (the fast ball misses
    every point of the arb ball, so it misses the exact value) and how many are undecided
    (the arb ball is not inside the fast ball and not outside it: only where arb's own
    radius is as wide, at float64's subnormal resolution), with their largest magnitude."""

    worst: float = 0.0
    refuted: int = 0
    undecided: int = 0
    undecided_scale: float = 0.0


def judge(fast: Any, arb: Any) -> Verdict:
    """Compare a fast ball with an arb ball elementwise, exactly in mpmath."""
    out = Verdict()
    with mpmath.workprec(2200):
        for index in np.ndindex(*fast.hi.shape):
            fh, ah = float(fast.hi[index]), float(arb.hi[index])
            rad, arb_rad = float(fast.rad[index]), float(arb.rad[index])
            if np.isinf(fh) or np.isinf(ah):
                if not (fh == ah and arb_rad == 0):
                    out.refuted += 1
                continue
            if np.isinf(rad):
                continue
            gap = abs(_mid(fh, float(fast.lo[index])) - _mid(ah, float(arb.lo[index])))
            need = gap + mpmath.mpf(arb_rad)
            if need <= rad:
                ratio = 0.0 if need == 0 else float(need / rad)
                out.worst = max(out.worst, ratio)
            elif gap - mpmath.mpf(arb_rad) > rad:
                out.refuted += 1
            else:
                out.undecided += 1
                out.undecided_scale = max(out.undecided_scale, abs(ah) + arb_rad)
    return out


def check(case: Case, fast_enclosure: Any, arb_enclosure: Any) -> dict[str, Verdict]:
    """Each output's verdict (a lazy bias has no dense ``dbias`` on the fast side)."""
    out = {}
    for name, ball in arb_enclosure.balls.items():
        if name == "dbias" and "bias" in case.lazy:
            assert name not in fast_enclosure.balls
            continue
        out[name] = judge(fast_enclosure[name], ball)
    return out
