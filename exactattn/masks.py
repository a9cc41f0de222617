"""Allowed-key sets ``A_i`` read on demand, one (query rows × key block) tile at a time.

A mask is a predicate ``allowed(i, j)``, evaluated by :meth:`Mask.tile` on integer
positions ``i`` of shape ``(r, 1)`` and ``j`` of shape ``(1, b)``; the result broadcasts
to ``(*batch, r, b)``. No ``(n_q, n_k)`` array is ever built from a predicate (a
caller-owned dense mask is input storage and is only sliced).

:meth:`Mask.classify` tells whether a tile is EMPTY (skipped: its scores are never
computed), FULL (the predicate is not evaluated) or PARTIAL, the way FlexAttention's
block mask does; :meth:`Mask.row_span` narrows a key block to the query rows that can
attend to it (for a causal mask, block ``J_t`` matters only to rows ``i ≥ (t−1)b``).

Alignment when ``n_q ≠ n_k``: ``"top-left"`` (torch SDPA's ``is_causal``) lets query ``i``
see keys ``j ≤ i``; ``"bottom-right"`` (flash-attn) lets it see ``j ≤ i + n_k − n_q``, so
the last query sees every key.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

ALIGNMENTS = ("top-left", "bottom-right")


class TileKind(enum.Enum):
    EMPTY = "empty"
    PARTIAL = "partial"
    FULL = "full"


@dataclass(frozen=True)
class Geometry:
    """Sizes a predicate may depend on: ``n_q``, ``n_k`` and the leading batch shape."""

    n_q: int
    n_k: int
    batch: tuple[int, ...]


class Mask:
    """Base class: a predicate ``allowed(i, j)`` with optional block structure."""

    def tile(self, i: Any, j: Any, geometry: Geometry) -> Any:
        """Boolean tile for query positions ``i`` (r, 1) and key positions ``j`` (1, b)."""
        raise NotImplementedError

    def classify(self, rows: range, cols: range, geometry: Geometry) -> TileKind:
        """EMPTY / FULL when known from the structure alone; PARTIAL otherwise."""
        return TileKind.PARTIAL

    def row_span(self, cols: range, geometry: Geometry) -> range:
        """Query rows that may have an allowed key in ``cols`` (a superset is fine)."""
        return range(geometry.n_q)

    def validate(self, geometry: Geometry) -> None:
        """Raise ValueError if the mask cannot apply to these sizes."""

    def adopt(self, ctx: Any) -> Mask:
        """This mask with its caller-owned arrays in ``ctx``'s array system (and device)."""
        return self

    def __and__(self, other: Mask) -> Mask:
        return and_masks(self, other)

    def __or__(self, other: Mask) -> Mask:
        return or_masks(self, other)


def _alignment_offset(alignment: str, geometry: Geometry) -> int:
    if alignment not in ALIGNMENTS:
        raise ValueError(f"alignment must be one of {ALIGNMENTS}; got {alignment!r}")
    return 0 if alignment == "top-left" else geometry.n_k - geometry.n_q


@dataclass(frozen=True)
class SlidingWindow(Mask):
    """Allowed iff ``i + o − left ≤ j ≤ i + o + right`` (``None``: unbounded side).

    ``o`` is the alignment offset (0 top-left, ``n_k − n_q`` bottom-right). Causal is
    ``SlidingWindow(left=None, right=0)``.
    """

    left: int | None = None
    right: int | None = 0
    alignment: str = "top-left"

    def __post_init__(self) -> None:
        for side in ("left", "right"):
            value = getattr(self, side)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0
            ):
                raise ValueError(f"{side} must be a non-negative integer or None; got {value!r}")
        if self.alignment not in ALIGNMENTS:
            raise ValueError(f"alignment must be one of {ALIGNMENTS}; got {self.alignment!r}")

    def _bounds(self, i: Any, geometry: Geometry) -> tuple[Any, Any]:
        centre = i + _alignment_offset(self.alignment, geometry)
        lo = None if self.left is None else centre - self.left
        hi = None if self.right is None else centre + self.right
        return lo, hi

    def tile(self, i: Any, j: Any, geometry: Geometry) -> Any:
        lo, hi = self._bounds(i, geometry)
        ok = (j >= 0) if lo is None else (j >= lo)
        return ok if hi is None else ok & (j <= hi)

    def classify(self, rows: range, cols: range, geometry: Geometry) -> TileKind:
        first_lo, first_hi = self._bounds(rows.start, geometry)
        last_lo, last_hi = self._bounds(rows.stop - 1, geometry)
        # The window moves right with i: the tile is empty when the last row's window ends
        # before the block or the first row's starts after it.
        if (last_hi is not None and last_hi < cols.start) or (
            first_lo is not None and first_lo > cols.stop - 1
        ):
            return TileKind.EMPTY
        covers_first = first_hi is None or first_hi >= cols.stop - 1
        covers_last = last_lo is None or last_lo <= cols.start
        return TileKind.FULL if covers_first and covers_last else TileKind.PARTIAL

    def row_span(self, cols: range, geometry: Geometry) -> range:
        offset = _alignment_offset(self.alignment, geometry)
        # Row i sees the block iff i + o − left ≤ cols.stop − 1 and i + o + right ≥ cols.start.
        start = 0 if self.right is None else cols.start - offset - self.right
        stop = geometry.n_q if self.left is None else cols.stop - 1 - offset + self.left + 1
        start, stop = max(start, 0), min(stop, geometry.n_q)
        return range(start, max(start, stop))


def causal(alignment: str = "top-left") -> SlidingWindow:
    """Query ``i`` sees keys ``j ≤ i`` (top-left) or ``j ≤ i + n_k − n_q`` (bottom-right)."""
    return SlidingWindow(left=None, right=0, alignment=alignment)


def sliding_window(
    left: int | None, right: int | None = 0, alignment: str = "top-left"
) -> SlidingWindow:
    """Query ``i`` sees keys ``j`` with ``i − left ≤ j ≤ i + right`` (aligned as given)."""
    return SlidingWindow(left=left, right=right, alignment=alignment)


@dataclass(frozen=True, eq=False)
class KeyPadding(Mask):
    """Allowed iff ``j < lengths[b]``: each batch element has its own number of real keys.

    ``lengths`` has the leading batch shape or a prefix of it (aligned left: ``(B,)``
    for inputs ``(B, H, n, d)`` means one length per batch element for every head).
    """

    lengths: Any

    def _lengths(self, geometry: Geometry) -> Any:
        lengths = self.lengths
        shape = tuple(lengths.shape)
        prefix = geometry.batch[: len(shape)]
        if len(shape) > len(geometry.batch) or any(
            a != b and a != 1 for a, b in zip(shape, prefix)
        ):
            raise ValueError(
                f"key_padding lengths have shape {shape}, which is not a prefix of the "
                f"batch shape {geometry.batch}; give one length per batch element"
            )
        trailing = (1,) * (len(geometry.batch) - len(shape))
        return lengths.reshape((*shape, *trailing, 1, 1))

    def validate(self, geometry: Geometry) -> None:
        self._lengths(geometry)

    def adopt(self, ctx: Any) -> KeyPadding:
        return KeyPadding(ctx.adopt(self.lengths))

    def tile(self, i: Any, j: Any, geometry: Geometry) -> Any:
        return j < self._lengths(geometry)

    def classify(self, rows: range, cols: range, geometry: Geometry) -> TileKind:
        lengths = self.lengths
        if int(lengths.max()) <= cols.start:
            return TileKind.EMPTY
        if int(lengths.min()) >= cols.stop:
            return TileKind.FULL
        return TileKind.PARTIAL


def key_padding(lengths: Any) -> KeyPadding:
    """Per-batch key lengths: keys ``j ≥ lengths[b]`` are padding and never attended."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(lengths, torch.Tensor):
        arr = lengths  # a tensor stays a tensor, so tiles are built on its device
    else:
        arr = np.asarray(lengths)
    kind = str(arr.dtype)
    if "int" not in kind:
        raise TypeError(f"key_padding lengths must be integers; got dtype {kind}")
    if (arr < 0).any():
        raise ValueError("key_padding lengths must be >= 0")
    return KeyPadding(arr)


@dataclass(frozen=True, eq=False)
class Dense(Mask):
    """A caller-owned boolean array broadcastable to ``(*batch, n_q, n_k)``; only sliced."""

    allowed: Any

    def adopt(self, ctx: Any) -> Dense:
        return Dense(ctx.adopt(self.allowed))

    def validate(self, geometry: Geometry) -> None:
        shape = tuple(self.allowed.shape)
        target = (*geometry.batch, geometry.n_q, geometry.n_k)
        try:
            np.broadcast_shapes(shape, target)
            ok = len(shape) <= len(target) and np.broadcast_shapes(shape, target) == target
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(
                f"mask has shape {shape}, which does not broadcast to (*batch, n_q, n_k) = {target}"
            )

    def tile(self, i: Any, j: Any, geometry: Geometry) -> Any:
        rows = slice(int(i[0, 0]), int(i[-1, 0]) + 1)
        cols = slice(int(j[0, 0]), int(j[0, -1]) + 1)
        allowed = self.allowed
        # A broadcast (size-1) axis is not sliced.
        row_sel = rows if allowed.shape[-2] != 1 else slice(None)
        col_sel = cols if allowed.shape[-1] != 1 else slice(None)
        return allowed[..., row_sel, col_sel]


def dense(allowed: Any) -> Dense:
    """Wrap a caller-owned boolean mask (``True`` = the key may be attended)."""
    if not hasattr(allowed, "dtype"):
        allowed = np.asarray(allowed)
    if "bool" not in str(allowed.dtype):
        raise TypeError(f"a dense mask must be boolean (True = allowed); got {allowed.dtype}")
    if allowed.ndim < 2:
        raise ValueError(f"a dense mask needs at least 2 dims (n_q, n_k); got {allowed.shape}")
    return Dense(allowed)


@dataclass(frozen=True, eq=False)
class Predicate(Mask):
    """An arbitrary vectorised predicate ``fn(i, j) -> bool tile``."""

    fn: Callable[[Any, Any], Any]

    def tile(self, i: Any, j: Any, geometry: Geometry) -> Any:
        out = self.fn(i, j)
        shape = tuple(getattr(out, "shape", ()))
        dtype = str(getattr(out, "dtype", type(out).__name__))
        if "bool" not in dtype:
            raise TypeError(f"mask predicate must return a boolean array; got dtype {dtype}")
        target = (*geometry.batch, i.shape[0], j.shape[1])
        try:
            ok = np.broadcast_shapes(shape, target) == target
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(
                f"mask predicate returned shape {shape} for i of shape {tuple(i.shape)} and "
                f"j of shape {tuple(j.shape)}; it must broadcast to {target}"
            )
        if _library(out) != _library(i):
            raise TypeError(
                f"mask predicate returned a {type(out).__name__} for index arrays of type "
                f"{type(i).__name__}; return an array of the same library"
            )
        return out


def _library(x: Any) -> str:
    return type(x).__module__.split(".")[0]


def predicate(fn: Callable[[Any, Any], Any]) -> Predicate:
    """Wrap a vectorised ``fn(i, j)``: ``i`` has shape (r, 1), ``j`` (1, b)."""
    if not callable(fn):
        raise TypeError(f"predicate needs a callable fn(i, j); got {type(fn).__name__}")
    return Predicate(fn)


@dataclass(frozen=True)
class And(Mask):
    parts: tuple[Mask, ...]

    def adopt(self, ctx: Any) -> Mask:
        return type(self)(tuple(part.adopt(ctx) for part in self.parts))

    def validate(self, geometry: Geometry) -> None:
        for part in self.parts:
            part.validate(geometry)

    def tile(self, i: Any, j: Any, geometry: Geometry) -> Any:
        out = self.parts[0].tile(i, j, geometry)
        for part in self.parts[1:]:
            out = out & part.tile(i, j, geometry)
        return out

    def classify(self, rows: range, cols: range, geometry: Geometry) -> TileKind:
        kinds = {part.classify(rows, cols, geometry) for part in self.parts}
        if TileKind.EMPTY in kinds:
            return TileKind.EMPTY
        return TileKind.FULL if kinds == {TileKind.FULL} else TileKind.PARTIAL

    def row_span(self, cols: range, geometry: Geometry) -> range:
        spans = [part.row_span(cols, geometry) for part in self.parts]
        start, stop = max(s.start for s in spans), min(s.stop for s in spans)
        return range(start, max(start, stop))


@dataclass(frozen=True)
class Or(Mask):
    parts: tuple[Mask, ...]

    def adopt(self, ctx: Any) -> Mask:
        return type(self)(tuple(part.adopt(ctx) for part in self.parts))

    def validate(self, geometry: Geometry) -> None:
        for part in self.parts:
            part.validate(geometry)

    def tile(self, i: Any, j: Any, geometry: Geometry) -> Any:
        out = self.parts[0].tile(i, j, geometry)
        for part in self.parts[1:]:
            out = out | part.tile(i, j, geometry)
        return out

    def classify(self, rows: range, cols: range, geometry: Geometry) -> TileKind:
        kinds = {part.classify(rows, cols, geometry) for part in self.parts}
        if TileKind.FULL in kinds:
            return TileKind.FULL
        return TileKind.EMPTY if kinds == {TileKind.EMPTY} else TileKind.PARTIAL

    def row_span(self, cols: range, geometry: Geometry) -> range:
        spans = [part.row_span(cols, geometry) for part in self.parts]
        start, stop = min(s.start for s in spans), max(s.stop for s in spans)
        return range(start, max(start, stop))


def _as_masks(masks: tuple[Any, ...], combinator: str) -> tuple[Mask, ...]:
    if not masks:
        raise ValueError(f"{combinator} needs at least one mask")
    return tuple(as_mask(m) for m in masks)


def and_masks(*masks: Any) -> Mask:
    """Allowed where every mask allows (FlexAttention's ``and_masks``)."""
    return And(_as_masks(masks, "and_masks"))


def or_masks(*masks: Any) -> Mask:
    """Allowed where any mask allows (FlexAttention's ``or_masks``)."""
    return Or(_as_masks(masks, "or_masks"))


def as_mask(mask: Any) -> Mask | None:
    """Accept ``None``, a :class:`Mask`, a boolean array (dense) or a callable predicate."""
    if mask is None or isinstance(mask, Mask):
        return mask
    if callable(mask):
        return predicate(mask)
    if hasattr(mask, "shape") or isinstance(mask, (list, tuple)):
        return dense(mask)
    raise TypeError(
        f"mask must be None, an exactattn.masks.Mask, a boolean array or a callable "
        f"predicate(i, j); got {type(mask).__name__}"
    )
