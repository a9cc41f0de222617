"""The specification side of the iteration tests, written from the definitions alone.

Allowed sets are inequalities on i, j, the alignment offset o (0 top-left, n_k − n_q
bottom-right) and the lengths; attention is ``softmax(c·q·kᵀ restricted to A_i)·(ρ∘V)``
materialised in float64 with NumPy; its VJP is the softmax Jacobian applied row by row.
Nothing here calls exactattn.
"""

from __future__ import annotations

import numpy as np


def offset(alignment: str, n_q: int, n_k: int) -> int:
    return 0 if alignment == "top-left" else n_k - n_q


def causal(n_q: int, n_k: int, alignment: str = "top-left") -> np.ndarray:
    """``j ≤ i + o``."""
    i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    return j <= i + offset(alignment, n_q, n_k)


def window(n_q: int, n_k: int, left, right, alignment: str = "top-left") -> np.ndarray:
    """``i + o − left ≤ j ≤ i + o + right`` (a None side is unbounded)."""
    i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    centre = i + offset(alignment, n_q, n_k)
    ok = np.ones((n_q, n_k), dtype=bool)
    if left is not None:
        ok &= j >= centre - left
    if right is not None:
        ok &= j <= centre + right
    return ok


def padding(n_q: int, n_k: int, lengths) -> np.ndarray:
    """``j < len[b]``: shape (B, 1, n_q, n_k) for lengths (B,) over a (B, H) batch."""
    j = np.arange(n_k)[None, None, None, :]
    return np.broadcast_to(
        j < np.asarray(lengths)[:, None, None, None], (len(lengths), 1, n_q, n_k)
    )


def attention(q, k, v, c, allowed=None, rho=None):
    """``Y`` with every leading dim broadcast; rows of ``A_i`` empty are not allowed here."""
    s = c * np.einsum("...id,...jd->...ij", q, k)
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    weights = p if rho is None else p * rho
    return np.einsum("...ij,...jv->...iv", weights, v)


def _sum_to(x, shape):
    """Sum ``x`` over the axes broadcasting added to reach it from ``shape``."""
    x = x.sum(axis=tuple(range(x.ndim - len(shape)))) if x.ndim > len(shape) else x
    axes = tuple(a for a, n in enumerate(shape) if n == 1 and x.shape[a] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def gradients(q, k, v, c, g, allowed=None, rho=None):
    """``∂(Σ G∘Y)/∂(Q, K, V)``: dS = P∘(dP∘ρ − Σ_j P dP∘ρ) row by row, summed to the inputs."""
    s = c * np.einsum("...id,...jd->...ij", q, k)
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    r = np.ones_like(p) if rho is None else np.broadcast_to(rho, p.shape)
    dp = np.einsum("...iv,...jv->...ij", g, v) * r
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = c * np.einsum("...ij,...jd->...id", ds, k)
    dk = c * np.einsum("...ij,...id->...jd", ds, q)
    dv = np.einsum("...ij,...iv->...jv", p * r, g)
    return _sum_to(dq, q.shape), _sum_to(dk, k.shape), _sum_to(dv, v.shape)
