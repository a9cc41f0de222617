"""The specification side of the core tests, written from the definitions alone.

Nothing here calls :mod:`exactattn`: masks are inequalities on (b, h, i, j), the bias and
the soft-cap are formulas, and attention is the textbook float64 computation

    s_ij = cap·tanh(c·q_i·k_j / cap) + B_ij,   P = softmax over A_i,   Y = P V,

with the exact gradient dS = P ∘ (dP − rowsum(P ∘ dP)) · ∂s/∂(c·q·k), dQ = c·dS'K,
dK = c·dS'ᵀQ, dV = PᵀG, ∂L/∂B = dS.
"""

from __future__ import annotations

import numpy as np


def grid(n_q: int, n_k: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(n_q)[:, None], np.arange(n_k)[None, :]


def window(n_q: int, n_k: int, left, right, alignment: str = "top-left") -> np.ndarray:
    """``i + o − left ≤ j ≤ i + o + right`` with ``o = 0`` or ``n_k − n_q``."""
    i, j = grid(n_q, n_k)
    o = 0 if alignment == "top-left" else n_k - n_q
    ok = np.ones((n_q, n_k), dtype=bool)
    if left is not None:
        ok &= j >= i + o - left
    if right is not None:
        ok &= j <= i + o + right
    return ok


def causal(n_q: int, n_k: int, alignment: str = "top-left") -> np.ndarray:
    return window(n_q, n_k, None, 0, alignment)


def attention(q, k, v, g=None, *, scale=None, allowed=None, bias=None, softcap=None):
    """``(y, lse)`` and, with ``g``, ``(dq, dk, dv, dbias)``; float64, broadcast batch dims.

    Rows with no allowed key give y = 0, lse = −inf and zero gradients.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    c = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    raw = c * (q @ np.swapaxes(k, -1, -2))
    slope = np.ones_like(raw)
    s = raw
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
    y = p @ v
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, l)))[..., 0]
    if g is None:
        return y, lse
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    draw = ds * slope
    dq = c * draw @ k
    dk = c * np.swapaxes(draw, -1, -2) @ q
    dv = np.swapaxes(p, -1, -2) @ g
    return y, lse, (dq, dk, dv, ds)


def sum_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum the broadcast axes of ``x`` away, down to ``shape``."""
    while x.ndim > len(shape):
        x = x.sum(axis=0)
    axes = tuple(a for a, n in enumerate(shape) if n == 1 and x.shape[a] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x
