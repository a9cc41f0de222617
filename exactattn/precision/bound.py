"""A first-order forward error bound for tiled attention (derivation: docs/error_bound.md).

For row ``i``, output column ``a``, with the exact softmax weights ``w_ij`` over the
allowed keys, ``σ_ij = |c| Σ_r |q_ir||k_jr|``, scores ``s_ij``, row max ``m_i``,
``ℓ_i = Σ_j e^{s_ij − m_i}`` and ``T = ⌈n_k / b⌉`` key blocks,

    |Ŷ_ia − Y_ia| ≤ Σ_j w_ij [η_ij |v_ja − Y_ia| + θ |v_ja|]
                    + (μ_c Σ_j |v_ja − Y_ia| + μ_p Σ_j |v_ja|) / ℓ_i
                    + (φ + u_c + u_s) |Y_ia| + 2μ_s + O(u²)

    η_ij = (2u_s + (d + 2)u_c) σ_ij + 2u_c |s_ij − m_i| + (2T + 1) u_c
           + μ_s |c| Σ_r (|q_ir| + |k_jr|)
    θ    = u_p + u_s + (b + 2T) u_c,        φ = (b + 2T) u_c

where ``u_s, u_c, u_p`` are the unit roundoffs of the input (storage), compute and p-cast
formats and ``μ_s, μ_c, μ_p`` their underflow errors (half the subnormal spacing; for
per-tensor FP8 inputs, times the tensor's scale). The naive computation is the case
``T = 1, b = n_k``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .configs import Config

ROW_CHUNK = 256


def _fp8_scale(x: np.ndarray, fmt: str) -> float:
    import torch

    from .fp8 import _dtype

    amax = float(np.max(np.abs(x))) if x.size else 0.0
    return amax / float(torch.finfo(_dtype(fmt)).max) if amax > 0 else 1.0


def forward_bound(
    config: Config,
    inputs: dict[str, np.ndarray],
    *,
    scale: float,
    block_size: int | None,
    allowed: np.ndarray | None = None,
) -> np.ndarray:
    """The bound ``B_ia`` (shape (n_q, v)) for tiled (``block_size``) or naive (``None``)."""
    q, k, v = (np.asarray(inputs[name], dtype=np.float64) for name in ("q", "k", "v"))
    n_q, d = q.shape
    n_k = k.shape[0]
    b = n_k if block_size is None else min(block_size, n_k)
    blocks = math.ceil(n_k / b)
    u_s, u_c, u_p = config.input_format.u, config.compute_format.u, config.p_format.u
    mu_s, mu_c, mu_p = config.input_format.mu, config.compute_format.mu, config.p_format.mu
    if config.quantize is not None:
        mu_s *= max(_fp8_scale(x, config.quantize) for x in (q, k, v))
    c = abs(scale)
    theta = u_p + u_s + (b + 2 * blocks) * u_c
    phi = (b + 2 * blocks) * u_c
    abs_q, abs_k, abs_v = np.abs(q), np.abs(k), np.abs(v)
    row_q, row_k = abs_q.sum(axis=1), abs_k.sum(axis=1)
    out = np.empty((n_q, v.shape[1]))
    for start in range(0, n_q, ROW_CHUNK):
        rows = slice(start, min(start + ROW_CHUNK, n_q))
        s = scale * (q[rows] @ k.T)
        sigma = c * (abs_q[rows] @ abs_k.T)
        ok = np.ones_like(s, dtype=bool) if allowed is None else allowed[rows]
        s = np.where(ok, s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        e = np.where(ok, np.exp(s - m), 0.0)
        ell = e.sum(axis=1, keepdims=True)
        w = e / ell
        y = w @ v
        eta = (2 * u_s + (d + 2) * u_c) * sigma + 2 * u_c * np.where(ok, m - s, 0.0)
        eta += (2 * blocks + 1) * u_c + mu_s * c * (row_q[rows][:, None] + row_k[None, :])
        weight = w * eta
        spread = np.empty_like(y)  # Σ_j w_ij η_ij |v_ja − Y_ia|
        spread_abs = np.empty_like(y)  # Σ_{j∈A_i} |v_ja − Y_ia|
        for a in range(v.shape[1]):  # per column: no (r, n_k, v) temporary
            gap = np.abs(v[None, :, a] - y[:, a, None])
            spread[:, a] = (weight * gap).sum(axis=1)
            spread_abs[:, a] = (ok * gap).sum(axis=1)
        count_v = ok.astype(np.float64) @ abs_v
        out[rows] = (
            spread
            + theta * (w @ abs_v)
            + (mu_c * spread_abs + mu_p * count_v) / ell
            + (phi + u_c + u_s) * np.abs(y)
            + 2 * mu_s  # underflow of V's entries and of the stored output
        )
    return out


def bound_ratio(error: np.ndarray, bound: np.ndarray) -> float:
    """``max_ia |Ŷ_ia − Y_ia| / B_ia``: at most 1 when the bound holds."""
    return float(np.max(np.abs(error) / bound)) if error.size else float("nan")


def allowed_matrix(mask: Any, n_q: int, n_k: int) -> np.ndarray | None:
    """The dense allowed set of a mask, for the bound only (the sweep's sizes are small)."""
    if mask is None:
        return None
    from ..masks import Geometry, create_mask

    return create_mask(mask, Geometry(n_q, n_k))
