"""The problem both certified references enclose: its inputs checked once, the batch element
each input reads, and the accuracy a reference aims for.

:func:`check_problem` validates what :func:`~exactattn.oracle.certified.certified_attention`
and :func:`~exactattn.oracle.float64.fast_attention` take (the caller's arrays, not broadcast
copies) into one :class:`Problem`; :func:`batch_source` maps a broadcast batch element to the
element of an input it reads (grouped-query heads included); :func:`meets_target` says
whether a ball's radii are within ``2^-TARGET_BITS`` of its summands.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

TARGET_BITS = 70
FLOOR = 2.0**-1060  # an absolute radius below anything float64 can measure


def check_real(name: str, x: Any) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
        got = f"dtype {x.dtype}" if isinstance(x, np.ndarray) else type(x).__name__
        raise TypeError(f"{name} must be a real NumPy float array; got {got}")
    return x


def _check_shape(name: str, x: np.ndarray, grid: tuple[int, ...], kind: str) -> np.ndarray:
    """``x`` as an array of ``kind`` (``b``: booleans, ``f``: floats) that broadcasts to grid."""
    x = np.asarray(x)
    if kind == "b" and x.dtype != bool:
        raise TypeError(f"{name} must be a boolean array; got dtype {x.dtype}")
    if kind == "f":
        check_real(name, x)
    if x.ndim < 2:
        raise ValueError(f"{name} needs at least 2 dims (n_q, n_k); got shape {x.shape}")
    try:
        np.broadcast_to(x, grid)
    except ValueError:
        raise ValueError(f"{name} of shape {x.shape} does not broadcast to {grid}") from None
    return x


def _check_number(name: str, x: Any, *, positive: bool = False) -> float | int:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {x!r}")
    if not math.isfinite(float(x)) or (positive and not x > 0):
        what = "a positive finite" if positive else "a finite"
        raise ValueError(f"{name} must be {what} number; got {x!r}")
    return int(x) if isinstance(x, numbers.Integral) else x


def check_int(name: str, x: Any, low: int) -> int | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < low:
        raise ValueError(f"{name} must be an integer >= {low} or None; got {x!r}")
    return int(x)


@dataclass(frozen=True)
class Problem:
    """The validated inputs (the caller's arrays, not broadcast copies) and settings."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    g: np.ndarray | None
    batch: tuple[int, ...]
    scale: Any
    allowed: np.ndarray | None
    keep: np.ndarray | None
    dropout_p: float
    bias: np.ndarray | None
    softcap: float | None
    group: int  # query heads per key/value head (grouped-query attention), else 1
    score_mod: Callable[..., Any] | None = None

    @property
    def grid(self) -> tuple[int, ...]:
        return (*self.batch, self.q.shape[-2], self.k.shape[-2])


def check_problem(
    q, k, v, g, scale, allowed, keep, dropout_p, bias, softcap, gqa, score_mod=None
) -> Problem:
    named = [("q", q), ("k", k), ("v", v)] + ([("g", g)] if g is not None else [])
    for name, x in named:
        check_real(name, x)
        if x.ndim < 2:
            raise ValueError(f"{name} must have shape (..., n, features); got {x.shape}")
        if not np.isfinite(x).all():
            first = np.argwhere(~np.isfinite(x))[0].tolist()
            raise ValueError(f"{name} contains NaN or inf (first at index {first})")
    shapes = f"q {q.shape}, k {k.shape}, v {v.shape}"
    if q.shape[-1] != k.shape[-1] or q.shape[-1] == 0:
        raise ValueError(f"q and k must share a head dim d >= 1 (last axis); got {shapes}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys (axis -2); got {shapes}")
    if not isinstance(gqa, bool):
        raise TypeError(f"enable_gqa must be a bool; got {gqa!r}")
    if gqa and (
        min(q.ndim, k.ndim, v.ndim) < 3
        or v.shape[-3] != k.shape[-3]
        or k.shape[-3] == 0
        or q.shape[-3] % k.shape[-3]
    ):
        raise ValueError(
            "enable_gqa needs a head axis (..., H, n, d) with k and v holding H_kv heads, "
            f"H_kv dividing the H query heads; got {shapes}"
        )
    lead = 3 if gqa else 2
    try:
        batch = tuple(np.broadcast_shapes(*(x.shape[:-lead] for x in (q, k, v))))
    except ValueError:
        raise ValueError(f"the leading (batch/head) dims do not broadcast: {shapes}") from None
    batch = (*batch, q.shape[-3]) if gqa else batch
    if g is not None and g.shape != (*batch, q.shape[-2], v.shape[-1]):
        want = (*batch, q.shape[-2], v.shape[-1])
        raise ValueError(f"g must have the shape of y, {want}; got {g.shape}")
    grid = (*batch, q.shape[-2], k.shape[-2])
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a number in [0, 1); got {dropout_p!r}")
    if not 0 <= dropout_p < 1:
        raise ValueError(f"dropout_p must be a number in [0, 1); got {dropout_p!r}")
    if keep is None and dropout_p:
        raise ValueError("dropout_p > 0 needs keep=<the boolean keep-bits r_ij>")
    if bias is not None:
        bias = _check_shape("bias", bias, grid, "f")
        if np.isnan(bias).any() or (bias == np.inf).any():
            raise ValueError("bias contains NaN or +inf (−inf is allowed: it excludes the pair)")
    if score_mod is not None:
        if not callable(score_mod):
            raise TypeError(
                f"score_mod must be a callable score_mod(score, b, h, q_idx, kv_idx); "
                f"got {score_mod!r}"
            )
        if len(batch) > 2:
            raise ValueError(f"a score_mod indexes (b, h): at most 2 batch dims; got batch {batch}")
    return Problem(
        q=q,
        k=k,
        v=v,
        g=g,
        batch=batch,
        scale=None if scale is None else _check_number("scale", scale),
        allowed=None if allowed is None else _check_shape("allowed", allowed, grid, "b"),
        keep=None if keep is None else _check_shape("keep", keep, grid, "b"),
        dropout_p=float(dropout_p),
        bias=bias,
        softcap=None
        if softcap is None
        else float(_check_number("softcap", softcap, positive=True)),
        group=q.shape[-3] // k.shape[-3] if gqa else 1,
        score_mod=score_mod,
    )


def batch_source(
    index: tuple[int, ...], shape: tuple[int, ...], nb: int, group: int = 1
) -> tuple[int, ...]:
    """The batch index of an input of ``shape`` that broadcast batch element ``index`` reads
    (``group > 1``: a key/value input, whose head ``h // group`` serves query head ``h``)."""
    lead = (1,) * (nb + 2 - len(shape)) + tuple(shape[:-2])
    index = (*index[:-1], index[-1] // group) if group > 1 else index
    return tuple(i if n != 1 else 0 for i, n in zip(index, lead))[nb + 2 - len(shape) :]


def meets_target(ball: Any) -> bool:
    """Every radius of ``ball`` (a :class:`~exactattn.oracle.certified.Ball`) within
    ``2^-TARGET_BITS`` of its summands' magnitude (or below :data:`FLOOR`)."""
    return bool(np.all(ball.rad <= 2.0**-TARGET_BITS * ball.terms + FLOOR))
