"""The specification side of the interface tests, from the definitions alone.

Per-sequence attention in float64 NumPy (or with Python's ``math`` on any number type the
caller hands in through ``exp``/``log``): a sequence's queries see its keys under the window
aligned bottom-right to that sequence, ``i' + len_k − len_q − left ≤ j' ≤ i' + len_k − len_q
+ right``; ALiBi adds ``−slope·|i' + len_k − len_q − j'|``; a sink ``σ_h`` is one more term
``e^{σ_h}`` of the denominator only. A paged cache is read position by position from its
block table. Nothing here calls exactattn.
"""

from __future__ import annotations

import numpy as np


def softmax_rows(s: np.ndarray, v: np.ndarray, sink: float | None = None):
    """``(Y, lse)`` of scores ``s (n_q, n_k)`` (−∞ = excluded) and values ``v (n_k, ·)``."""
    top = s.max(axis=-1, initial=-np.inf)
    if sink is not None:
        top = np.maximum(top, sink)
    shift = np.where(np.isneginf(top), 0.0, top)
    e = np.exp(s - shift[:, None])
    den = e.sum(axis=-1) + (0.0 if sink is None else np.exp(sink - shift))
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(den[:, None] > 0, (e @ v) / np.where(den > 0, den, 1.0)[:, None], 0.0)
        lse = np.where(den > 0, shift + np.log(np.where(den > 0, den, 1.0)), -np.inf)
    return y, lse


def sequence_scores(q, k, scale, causal=False, left=None, right=None, slope=None, softcap=None):
    """Scores of one sequence and head, ``q (n_q, d)``, ``k (n_k, d)``, masked as flash-attn."""
    n_q, n_k = q.shape[0], k.shape[0]
    s = scale * (q @ k.T)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    centre = np.arange(n_q)[:, None] + n_k - n_q
    j = np.arange(n_k)[None, :]
    if slope is not None:
        s = s - slope * np.abs(centre - j)
    ok = np.ones((n_q, n_k), dtype=bool)
    if causal:
        right = 0 if right is None else min(right, 0)
    if left is not None:
        ok &= j >= centre - left
    if right is not None:
        ok &= j <= centre + right
    return np.where(ok, s, -np.inf)


def varlen(
    q,
    k,
    v,
    cu_q,
    cu_k,
    *,
    scale=None,
    causal=False,
    left=None,
    right=None,
    slopes=None,
    softcap=None,
    sinks=None,
):
    """Packed ``(total, H, ·)`` attention per sequence and head: ``(Y, lse (H, total_q))``."""
    heads, heads_kv = q.shape[1], k.shape[1]
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    y = np.zeros((q.shape[0], heads, v.shape[-1]))
    lse = np.full((heads, q.shape[0]), -np.inf)
    for s in range(len(cu_q) - 1):
        rows, cols = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        for h in range(heads):
            h_kv = h // (heads // heads_kv)
            slope = None
            if slopes is not None:
                slope = slopes[h] if np.ndim(slopes) == 1 else slopes[s][h]
            scores = sequence_scores(
                q[rows, h], k[cols, h_kv], scale, causal, left, right, slope, softcap
            )
            sink = None if sinks is None else sinks[h]
            y[rows, h], lse[h, rows] = softmax_rows(scores, v[cols, h_kv], sink)
    return y, lse


def paged_sequence(cache, block_table_row, length):
    """Keys ``0..length−1`` of one sequence, read from its pages position by position."""
    page_size = cache.shape[1]
    rows = [cache[block_table_row[t // page_size], t % page_size] for t in range(length)]
    return np.stack(rows) if rows else np.zeros((0, *cache.shape[2:]))
