"""The specification side of the core tests, written from the definitions alone.

Allowed sets are inequalities on i, j, the alignment offset o (0 top-left, n_k − n_q
bottom-right) and the lengths; scores are ``s_ij = cap·tanh(c·q_i·k_j/cap) + B_ij`` (the
soft-cap and the bias only when given); attention is ``softmax(s restricted to A_i)·(ρ∘V)``
materialised in float64 with NumPy, rows with an empty ``A_i`` giving 0; its VJP is the
softmax Jacobian applied row by row, ``dS = P∘(dP∘ρ − Σ_j P dP∘ρ)``, times the soft-cap's
slope ``1 − tanh²`` on the way to Q and K; ``∂L/∂B = dS``. Nothing here calls exactattn.
"""

from __future__ import annotations

import numpy as np


def offset(alignment: str, n_q: int, n_k: int) -> int:
    return 0 if alignment == "top-left" else n_k - n_q


def grid(n_q: int, n_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Query positions ``i`` (n_q, 1) and key positions ``j`` (1, n_k)."""
    return np.arange(n_q)[:, None], np.arange(n_k)[None, :]


def causal(n_q: int, n_k: int, alignment: str = "top-left") -> np.ndarray:
    """``j ≤ i + o``."""
    i, j = grid(n_q, n_k)
    return j <= i + offset(alignment, n_q, n_k)


def window(n_q: int, n_k: int, left, right, alignment: str = "top-left") -> np.ndarray:
    """``i + o − left ≤ j ≤ i + o + right`` (a None side is unbounded)."""
    i, j = grid(n_q, n_k)
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


def sum_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``x`` over the axes broadcasting added to reach it from ``shape``."""
    x = x.sum(axis=tuple(range(x.ndim - len(shape)))) if x.ndim > len(shape) else x
    axes = tuple(a for a, n in enumerate(shape) if n == 1 and x.shape[a] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def _softmax(q, k, c, allowed, bias, softcap):
    """``(P, slope, lse)``: weights over ``A_i`` (0 on empty rows), ``∂s/∂(c·q·k)``, lse."""
    raw = c * np.einsum("...id,...jd->...ij", q, k)
    s, slope = raw, np.ones_like(raw)
    if softcap is not None:
        t = np.tanh(raw / softcap)
        s, slope = softcap * t, 1 - t * t
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    empty = np.isneginf(m)
    e = np.exp(s - np.where(empty, 0.0, m))
    l = e.sum(axis=-1, keepdims=True)
    p = e / np.where(empty, 1.0, l)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, l)))[..., 0]
    return p, slope, lse


def attention(q, k, v, c, allowed=None, rho=None, *, bias=None, softcap=None):
    """``Y`` with every leading dim broadcast."""
    p, _, _ = _softmax(q, k, c, allowed, bias, softcap)
    weights = p if rho is None else p * rho
    return np.einsum("...ij,...jv->...iv", weights, v)


def log_sum_exp(q, k, c, allowed=None, *, bias=None, softcap=None):
    """``lse_i = log Σ_{j∈A_i} e^{s_ij}`` (−∞ on empty rows)."""
    return _softmax(q, k, c, allowed, bias, softcap)[2]


def score_gradient(q, k, v, c, g, allowed=None, rho=None, *, bias=None, softcap=None):
    """``dS = ∂(Σ G∘Y)/∂s``, unsummed (the gradient of a full-size bias)."""
    p, _, _ = _softmax(q, k, c, allowed, bias, softcap)
    r = np.ones_like(p) if rho is None else np.broadcast_to(rho, p.shape)
    dp = np.einsum("...iv,...jv->...ij", g, v) * r
    return p * (dp - (p * dp).sum(axis=-1, keepdims=True))


def gradients(q, k, v, c, g, allowed=None, rho=None, *, bias=None, softcap=None):
    """``∂(Σ G∘Y)/∂(Q, K, V)``, summed to the inputs' shapes."""
    p, slope, _ = _softmax(q, k, c, allowed, bias, softcap)
    r = np.ones_like(p) if rho is None else np.broadcast_to(rho, p.shape)
    ds = score_gradient(q, k, v, c, g, allowed, rho, bias=bias, softcap=softcap) * slope
    dq = c * np.einsum("...ij,...jd->...id", ds, k)
    dk = c * np.einsum("...ij,...id->...jd", ds, q)
    dv = np.einsum("...ij,...iv->...jv", p * r, g)
    return sum_to(dq, q.shape), sum_to(dk, k.shape), sum_to(dv, v.shape)
