"""Input checks for the public API: every message names the argument and quotes what it got."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ..backends.protocol import Array, ArrayContext
from .masks import Geometry, Mask, tile_index
from .scores import ScoreMod

EMPTY_ROW_POLICIES = ("error", "zero")


def check_ndim(name: str, x: Array) -> None:
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape (..., n, features) with ndim >= 2; got {x.shape}")


def check_qkv(q: Array, k: Array, v: Array, enable_gqa: bool = False) -> None:
    """Shapes (..., n_q, d), (..., n_k, d), (..., n_k, v) with broadcastable leading dims.

    With ``enable_gqa`` axis −3 is the head axis: ``H`` query heads, ``H_kv`` key/value
    heads, ``H_kv`` dividing ``H``. (The sizes themselves are built once per call, by
    :func:`exactattn.core.calls.prepare`.)
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_ndim(name, x)
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the head dim d (last axis); got {shapes}")
    if q.shape[-1] == 0:
        raise ValueError(f"the head dim d must be >= 1; got {shapes}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys n_k (axis -2); got {shapes}")
    lead = 3 if enable_gqa else 2
    if enable_gqa:
        if min(q.ndim, k.ndim, v.ndim) < 3:
            raise ValueError(f"enable_gqa needs a head axis (..., H, n, d); got {shapes}")
        h, h_kv = q.shape[-3], k.shape[-3]
        if v.shape[-3] != h_kv or h_kv == 0 or h % h_kv:
            raise ValueError(
                "enable_gqa needs k and v with H_kv heads (axis -3) where H_kv divides the "
                f"H query heads; got {shapes}"
            )
    try:
        np.broadcast_shapes(*(tuple(x.shape[:-lead]) for x in (q, k, v)))
    except ValueError:
        raise ValueError(f"the leading (batch/head) dims do not broadcast: {shapes}") from None


def check_block_size(block_size: Any, default: int) -> int:
    if block_size is None:
        return default
    if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral):
        raise TypeError(f"block_size must be a positive integer; got {block_size!r}")
    if block_size < 1:
        raise ValueError(f"block_size must be a positive integer; got {block_size}")
    return int(block_size)


def check_scale(ctx: ArrayContext, scale: Any, d: int) -> Any:
    return ctx.default_scale(d) if scale is None else ctx.scalar_arg("scale", scale)


def check_finite(ctx: ArrayContext, name: str, x: Array) -> None:
    if not ctx.all_finite(x):
        where = np.argwhere(np.asarray(_to_numpy(ctx.nonfinite(x))))[:3].tolist()
        raise ValueError(
            f"{name} contains NaN or inf (first at indices {where}); "
            "pass check_finite=False to compute anyway"
        )


def check_softcap(ctx: ArrayContext, softcap: Any) -> Any:
    cap = ctx.scalar_arg("softcap", softcap)
    if ctx.any(ctx.nonpositive(ctx.full((1,), cap))):
        raise ValueError(f"softcap must be > 0; got {softcap!r}")
    return cap


def check_policy(empty_rows: str) -> None:
    if empty_rows not in EMPTY_ROW_POLICIES:
        raise ValueError(f"empty_rows must be one of {EMPTY_ROW_POLICIES}; got {empty_rows!r}")


def check_empty_rows(
    ctx: ArrayContext,
    m: Array,
    empty_rows: str,
    mask: Mask | None,
    geometry: Geometry,
    score_mod: ScoreMod | None = None,
) -> None:
    """Rows still at ⊥ (``m = −∞``) have an empty allowed set ``A_i`` — or overflowed.

    In rounded arithmetic a score ``c·q·k`` can overflow to −∞, the value reserved for
    ``j ∉ A_i``; a row whose every score did so would pass for an empty row. So each such
    row is checked against the mask and the score modifications' −∞ entries (one row of
    each, only for these rows).
    """
    empty = ctx.is_neg_inf(m)
    if not ctx.any(empty):
        return
    _check_not_overflowed(ctx, empty, mask, geometry, score_mod)
    if empty_rows == "error":
        rows = np.argwhere(np.asarray(_to_numpy(empty)))[:5].tolist()
        raise ValueError(
            f"query rows with no allowed key (index as (*batch, i)): {rows}"
            f"{' ...' if len(rows) == 5 else ''}; the softmax over an empty set is undefined. "
            "Fix the mask, or pass empty_rows='zero' for y = 0, lse = -inf and zero gradients "
            "(the FlexAttention convention)"
        )


ROWS_CHECKED = 1 << 20  # (row, key) pairs of one strip of rows checked at once


def _rows_have_keys(ctx, rows: range, mask, geometry: Geometry, score_mod) -> np.ndarray:
    """Whether each row of ``rows`` allows some key, per batch element and head: shape
    ``(*batch, len(rows))``."""
    index = tile_index(ctx, geometry, rows, range(geometry.n_k))
    allowed = ctx.index(0, geometry.n_k) >= 0
    if mask is not None:
        allowed = allowed & mask.allowed(index, geometry)
    if score_mod is not None:
        excluded = score_mod.at(ctx, index, geometry).excluded()
        if excluded is not None:
            allowed = allowed & ~excluded
    whole = ctx.broadcast_to(allowed, (*geometry.tile_batch, len(rows), geometry.n_k))
    return np.asarray(_to_numpy(geometry.merge_heads(whole))).any(axis=-1)


def _check_not_overflowed(ctx, empty: Array, mask, geometry: Geometry, score_mod) -> None:
    """The empty rows checked against the mask a strip of rows at a time (a strip holding
    no empty row is skipped)."""
    empty = np.asarray(_to_numpy(empty))
    overflowed = []
    rows = np.unique(np.argwhere(empty)[:, -1])
    step = max(1, ROWS_CHECKED // max(1, geometry.n_k * empty[..., 0].size))
    for start in range(int(rows.min(initial=0)), int(rows.max(initial=-1)) + 1, step):
        stop = min(start + step, empty.shape[-1])
        here = empty[..., start:stop]
        if not here.any():
            continue
        has_keys = _rows_have_keys(ctx, range(start, stop), mask, geometry, score_mod)
        found = np.argwhere(here & np.broadcast_to(has_keys, here.shape))
        overflowed += [(*p[:-1], p[-1] + start) for p in found.tolist()]
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
    if ctx.any(~bottom & (ctx.nonfinite(l) | ctx.nonpositive(l))):
        raise ValueError(
            "stats.l must be finite and > 0 on rows with an allowed key; "
            "pass the Stats the forward returned"
        )


def check_output(ctx: ArrayContext, name: str, x: Array) -> None:
    """A finite input whose result is not finite overflowed the working precision."""
    if not ctx.all_finite(x):
        raise FloatingPointError(
            f"{name} is not finite although the inputs are: the arithmetic of {ctx.name} "
            "overflowed (scores beyond its range); use a wider compute dtype"
        )


def check_same_shape(name: str, x: Array, expected: tuple[int, ...]) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}; got {tuple(x.shape)}")


def _to_numpy(x: Any) -> Any:
    return x.cpu().numpy() if hasattr(x, "cpu") else x
