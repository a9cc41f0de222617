"""Input checks for the public API: every message names the argument and quotes what it got."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .backends.base import Array, ArrayContext
from .masks import Geometry, Mask

EMPTY_ROW_POLICIES = ("error", "zero")


def check_ndim(name: str, x: Array) -> None:
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape (..., n, features) with ndim >= 2; got {x.shape}")


def check_qkv(q: Array, k: Array, v: Array) -> Geometry:
    """Shapes (..., n_q, d), (..., n_k, d), (..., n_k, v) with broadcastable leading dims."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_ndim(name, x)
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the head dim d (last axis); got {shapes}")
    if q.shape[-1] == 0:
        raise ValueError(f"the head dim d must be >= 1; got {shapes}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys n_k (axis -2); got {shapes}")
    try:
        batch = np.broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2]))
    except ValueError:
        raise ValueError(f"the leading (batch/head) dims do not broadcast: {shapes}") from None
    return Geometry(n_q=q.shape[-2], n_k=k.shape[-2], batch=tuple(batch))


def check_block_size(block_size: Any, default: int) -> int:
    if block_size is None:
        return default
    if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral):
        raise TypeError(f"block_size must be a positive integer; got {block_size!r}")
    if block_size < 1:
        raise ValueError(f"block_size must be a positive integer; got {block_size}")
    return int(block_size)


def check_scale(ctx: ArrayContext, scale: Any, d: int) -> Any:
    if scale is None:
        return ctx.default_scale(d)
    if isinstance(scale, bool):
        raise TypeError(f"scale must be a real number; got {scale!r}")
    if ctx.exact:
        return ctx.scalar(scale)
    if not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number; got {type(scale).__name__}")
    if not np.isfinite(float(scale)):
        raise ValueError(f"scale must be finite; got {scale}")
    converted = ctx.scalar(scale)
    if not np.isfinite(float(converted)):
        raise FloatingPointError(f"scale {scale} overflows {ctx.name}; use a wider compute dtype")
    return converted


def _has_nonfinite(ctx: ArrayContext, x: Array) -> bool:
    # One reduction first: a NaN or ±inf entry makes the sum NaN or ±inf, so a finite sum
    # clears the whole array; only a non-finite sum (or a sum that overflowed) is searched.
    if not ctx.exact and not ctx.any(ctx.nonfinite(ctx.rowsum(x.reshape(-1)))):
        return False
    return ctx.any(ctx.nonfinite(x))


def check_finite(ctx: ArrayContext, name: str, x: Array) -> None:
    if _has_nonfinite(ctx, x):
        bad = ctx.nonfinite(x)
        where = np.argwhere(np.asarray(_to_numpy(bad)))[:3].tolist()
        raise ValueError(
            f"{name} contains NaN or inf (first at indices {where}); "
            "pass check_finite=False to compute anyway"
        )


def check_policy(empty_rows: str) -> None:
    if empty_rows not in EMPTY_ROW_POLICIES:
        raise ValueError(f"empty_rows must be one of {EMPTY_ROW_POLICIES}; got {empty_rows!r}")


def check_empty_rows(
    ctx: ArrayContext, m: Array, empty_rows: str, mask: Mask | None, geometry: Geometry
) -> None:
    """Rows still at ⊥ (``m = −∞``) have an empty allowed set ``A_i`` — or overflowed.

    In rounded arithmetic a score ``c·q·k`` can overflow to −∞, the value reserved for
    ``j ∉ A_i``; a row whose every score did so would pass for an empty row. So each such
    row is checked against the mask (one row of the predicate, only for these rows).
    """
    empty = ctx.is_neg_inf(m)
    if not ctx.any(empty):
        return
    if not ctx.exact:
        _check_not_overflowed(ctx, empty, mask, geometry)
    if empty_rows == "error":
        rows = np.argwhere(np.asarray(_to_numpy(empty)))[:5].tolist()
        raise ValueError(
            f"query rows with no allowed key (index as (*batch, i)): {rows}"
            f"{' ...' if len(rows) == 5 else ''}; the softmax over an empty set is undefined. "
            "Fix the mask, or pass empty_rows='zero' for y = 0, lse = -inf and zero gradients "
            "(the FlexAttention convention)"
        )


def _check_not_overflowed(
    ctx: ArrayContext, empty: Array, mask: Mask | None, geometry: Geometry
) -> None:
    empty = np.asarray(_to_numpy(empty))
    positions = np.argwhere(empty)
    overflowed = []
    for i in np.unique(positions[:, -1]):
        if mask is None:
            has_keys = np.full(empty.shape[:-1], geometry.n_k > 0)
        else:
            row = ctx.index(int(i), int(i) + 1)[:, None]
            keys = ctx.index(0, geometry.n_k)[None, :]
            tile = _to_numpy(mask.tile(row, keys, geometry))
            has_keys = np.broadcast_to(np.asarray(tile).any(axis=-1), (*empty.shape[:-1], 1))
            has_keys = has_keys[..., 0]
        overflowed += [tuple(p) for p in np.argwhere(empty[..., i] & has_keys)]
    if overflowed:
        raise FloatingPointError(
            f"every score of query rows {overflowed[:5]} (index as (*batch, i)) is -inf "
            f"although they have allowed keys: c·q·k overflowed in {ctx.name}; use a wider "
            "compute dtype or a smaller scale"
        )


def check_stats(ctx: ArrayContext, m: Array, l: Array) -> None:
    """Retained statistics: ``m`` finite or −∞ (⊥); ``ℓ`` finite and > 0 where ``m`` is finite."""
    bottom = ctx.is_neg_inf(m)
    if ctx.any(ctx.nonfinite(m) & ~bottom):
        raise ValueError("stats.m contains NaN or +inf; pass the Stats the forward returned")
    if ctx.any(~bottom & (ctx.nonfinite(l) | (l <= 0))):
        raise ValueError(
            "stats.l must be finite and > 0 on rows with an allowed key; "
            "pass the Stats the forward returned"
        )


def check_output(ctx: ArrayContext, name: str, x: Array) -> None:
    """A finite input whose result is not finite overflowed the working precision."""
    if ctx.exact:
        return
    if _has_nonfinite(ctx, x):
        raise FloatingPointError(
            f"{name} is not finite although the inputs are: the arithmetic of {ctx.name} "
            "overflowed (scores beyond its range); use a wider compute dtype"
        )


def check_same_shape(name: str, x: Array, expected: tuple[int, ...]) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}; got {tuple(x.shape)}")


def _to_numpy(x: Any) -> Any:
    return x.cpu().numpy() if hasattr(x, "cpu") else x
