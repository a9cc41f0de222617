"""Allowed-key sets ``A_i`` read on demand, one (query rows × key block) tile at a time.

A mask is a predicate: FlexAttention's ``mask_mod(b, h, i, j)``, evaluated by
:meth:`Mask.allowed` on broadcast index arrays — batch ``b`` and head ``h`` of shape
``(*batch, 1, 1)``, query positions ``i`` of shape ``(r, 1)``, key positions ``j`` of shape
``(1, c)`` — giving a boolean tile that broadcasts to ``(*batch, r, c)``. A mask that does
not depend on ``b`` and ``h`` only defines :meth:`Mask.tile` ``(i, j)``. No ``(n_q, n_k)``
array is ever built from a predicate (a caller-owned dense mask is input storage and is only
sliced); :func:`create_mask` materialises one on purpose, for the naive reference.

Batch and heads: the leading dims of the inputs are ``(*B, H)``: ``h`` indexes the last of
them and ``b`` the flattened others (no leading dims: ``b = h = 0``). With grouped-query
attention the algorithm runs the heads as ``(H_kv, g)`` (:attr:`Geometry.group` ``= g``);
``h = h_kv·g + g_i`` is still the logical head, and masks holding arrays over the logical
batch split their head axis with :meth:`Geometry.split_heads`.

FlexAttention's mods (:class:`MaskMod`, also what its ``and_masks``/``or_masks`` return)
are called with torch int64 index tensors on every backend (:func:`call_mod`), so a mod
that indexes torch tensors (``doc[b, q_idx] == doc[b, kv_idx]``) runs on NumPy, mpmath,
flint and sympy too; its boolean tile is converted to the backend's arrays. A torch
``BlockMask`` is a mask too (:class:`FlexBlockMask`): its mask_mod, with its block structure
checked against that mask_mod before the structure classifies any tile.

Structure, the way FlexAttention's block mask has it: :meth:`Mask.classify` tells whether a
tile is EMPTY (skipped: its scores are never computed), FULL (the predicate is not
evaluated) or PARTIAL, for every batch element and head at once; :meth:`Mask.row_span`
narrows a key block to the query rows that can attend to it (for a causal mask, block ``J_t``
matters only to rows ``i ≥ (t−1)b``); :meth:`Mask.lower` gives the fused kernels' form of the
mask (:class:`Band`) or ``None`` (the generic path only). The integer formulas behind the
structure of the built-in masks are module functions over an integer-operations namespace
(:class:`IntOps`), so a proof can run the very same formulas over SMT integers.

Alignment when ``n_q ≠ n_k``: ``"top-left"`` (torch SDPA's ``is_causal``) lets query ``i``
see keys ``j ≤ i``; ``"bottom-right"`` (flash-attn) lets it see ``j ≤ i + n_k − n_q``, so
the last query sees every key.
"""

from __future__ import annotations

import enum
import functools
import importlib
import inspect
import math
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


# --- sizes and indices -------------------------------------------------------------------
@dataclass(frozen=True)
class Geometry:
    """Sizes a mask may depend on: ``n_q``, ``n_k``, the batch ``(*B, H)`` and the GQA group.

    ``batch`` is the logical leading shape (heads last). ``group = g > 1`` means the
    algorithm runs the heads as ``(H_kv, g)`` with ``H = H_kv·g`` (grouped-query attention):
    tiles then have the leading shape :attr:`tile_batch`.
    """

    n_q: int
    n_k: int
    batch: tuple[int, ...] = ()
    group: int = 1

    @property
    def heads(self) -> int:
        """``H``, the size of the head axis (1 without leading dims)."""
        return self.batch[-1] if self.batch else 1

    @property
    def tile_batch(self) -> tuple[int, ...]:
        """Leading shape of the tiles: ``batch``, with ``H`` split into ``(H_kv, g)`` for GQA."""
        if self.group == 1:
            return self.batch
        return (*self.batch[:-1], self.heads // self.group, self.group)

    def split_heads(self, x: Any) -> Any:
        """An array aligned with ``(*batch, r, c)`` (size-1 axes broadcast) in the tile layout.

        Pads ``x`` to the full number of dims and, for GQA, splits its head axis ``H`` into
        ``(H_kv, g)`` (a broadcast head axis of size 1 becomes ``(1, 1)``).
        """
        ndim = len(self.batch) + 2
        shape = tuple(x.shape)
        if len(shape) < ndim:
            shape = (1,) * (ndim - len(shape)) + shape
        if self.group != 1:
            h = shape[-3]
            split = (1, 1) if h == 1 else (h // self.group, self.group)
            shape = (*shape[:-3], *split, *shape[-2:])
        return x.reshape(shape)

    def merge_heads(self, x: Any) -> Any:
        """A tile-layout array ``(*tile_batch, r, c)`` back in the logical layout."""
        if self.group == 1:
            return x
        shape = tuple(x.shape)
        return x.reshape((*shape[:-4], shape[-4] * shape[-3], *shape[-2:]))

    def flat_index(self, ctx: Any) -> Any:
        """``b·H + h`` at every leading position, shaped ``(*tile_batch, 1, 1)``."""
        flat = ctx.index(0, math.prod(self.batch)).reshape((*self.batch, 1, 1))
        return self.split_heads(flat)

    def batch_head(self, ctx: Any) -> tuple[Any, Any]:
        """Index arrays ``(b, h)``, each shaped ``(*tile_batch, 1, 1)``."""
        flat = self.flat_index(ctx)
        return flat // self.heads, flat % self.heads


@dataclass(frozen=True)
class TileIndex:
    """Where a tile sits: index arrays ``b, h`` (*tile_batch, 1, 1), ``i`` (r, 1), ``j`` (1, c),
    and the same query rows and key columns as ranges."""

    b: Any
    h: Any
    i: Any
    j: Any
    rows: range
    cols: range


def tile_index(ctx: Any, geometry: Geometry, rows: range, cols: range, bh: Any = None):
    """The :class:`TileIndex` of rows × cols (``bh``: precomputed :meth:`Geometry.batch_head`)."""
    b, h = geometry.batch_head(ctx) if bh is None else bh
    i = ctx.index(rows.start, rows.stop)[:, None]
    j = ctx.index(cols.start, cols.stop)[None, :]
    return TileIndex(b, h, i, j, rows, cols)


# --- integer formulas of the built-in structure ------------------------------------------
class IntOps:
    """Integer operations the structure formulas use: Python ints here; a proof passes SMT
    terms (``max``/``min``/``where`` as if-then-else, ``and_``/``or_`` as connectives)."""

    @staticmethod
    def max(a: Any, b: Any) -> Any:
        return a if a >= b else b

    @staticmethod
    def min(a: Any, b: Any) -> Any:
        return a if a <= b else b

    @staticmethod
    def and_(a: Any, b: Any) -> Any:
        return a and b

    @staticmethod
    def or_(a: Any, b: Any) -> Any:
        return a or b

    @staticmethod
    def where(cond: Any, a: Any, b: Any) -> Any:
        return a if cond else b

    @staticmethod
    def floordiv(a: Any, b: Any) -> Any:
        return a // b


INT = IntOps()


def alignment_offset(alignment: str, n_q: Any, n_k: Any) -> Any:
    """``o`` in ``j ≤ i + o``: 0 for top-left, ``n_k − n_q`` for bottom-right."""
    if alignment not in ALIGNMENTS:
        raise ValueError(f"alignment must be one of {ALIGNMENTS}; got {alignment!r}")
    return 0 if alignment == "top-left" else n_k - n_q


def window_allows(left: Any, right: Any, offset: Any, i: Any, j: Any, ops: Any = INT) -> Any:
    """``(left is None or j ≥ i + o − left) and (right is None or j ≤ i + o + right)``."""
    ok = True
    if left is not None:
        ok = j >= i + offset - left
    if right is not None:
        hi = j <= i + offset + right
        ok = hi if left is None else ops.and_(ok, hi)
    return ok


def window_tile_kind(left, right, offset, r0, r1, a, e, ops: Any = INT) -> tuple[Any, Any]:
    """``(empty, full)`` of the tile rows ``[r0, r1)`` × keys ``[a, e)`` (both nonempty).

    The window moves right with ``i``: the tile is empty when the last row's window ends
    before ``a`` or the first row's starts after ``e − 1``; full when the first row's window
    reaches ``e − 1`` and the last row's starts at or before ``a`` (``left, right ≥ 0``).
    """
    empty = False
    if right is not None:
        empty = (r1 - 1) + offset + right < a
    if left is not None:
        after = r0 + offset - left > e - 1
        empty = after if right is None else ops.or_(empty, after)
    full = True
    if right is not None:
        full = r0 + offset + right >= e - 1
    if left is not None:
        starts = (r1 - 1) + offset - left <= a
        full = starts if right is None else ops.and_(full, starts)
    return empty, full


def window_row_span(left, right, offset, a, e, n_q, ops: Any = INT) -> tuple[Any, Any]:
    """``(start, stop)`` with ``start ≤ stop``: the rows ``i`` in ``[0, n_q)`` whose window
    meets keys ``[a, e)``, i.e. ``a − o − right ≤ i ≤ e − 1 − o + left``."""
    start = 0 if right is None else ops.min(ops.max(a - offset - right, 0), n_q)
    stop = n_q if left is None else ops.max(ops.min(e - offset + left, n_q), start)
    return start, stop


def padding_tile_kind(shortest: Any, longest: Any, a: Any, e: Any) -> tuple[Any, Any]:
    """``(empty, full)`` of keys ``[a, e)`` under ``j < length``, lengths in [shortest, longest]."""
    return longest <= a, shortest >= e


def padding_row_span(longest: Any, a: Any, n_q: Any, ops: Any = INT) -> tuple[Any, Any]:
    """``(start, stop)``: every row when some length reaches past ``a``, none otherwise."""
    return 0, ops.where(longest <= a, 0, n_q)


# --- the lowered form the fused kernels take ----------------------------------------------
@dataclass(frozen=True)
class Band:
    """A mask as the fused kernels express it: ``window_allows(left, right, o)`` and
    ``j < kv_lengths[b]``; ``kv_lengths`` has shape ``(B,)`` or ``(1,)`` (None: no padding)."""

    alignment: str = "top-left"
    left: int | None = None
    right: int | None = None
    kv_lengths: Any = None

    @property
    def has_window(self) -> bool:
        return self.left is not None or self.right is not None

    def intersect(self, other: Band) -> Band | None:
        """The band allowing what both allow, or None when one band cannot say it."""
        if self.has_window and other.has_window and self.alignment != other.alignment:
            return None
        if self.kv_lengths is not None and other.kv_lengths is not None:
            return None
        alignment = self.alignment if self.has_window else other.alignment
        lengths = self.kv_lengths if self.kv_lengths is not None else other.kv_lengths
        return Band(
            alignment, _tighter(self.left, other.left), _tighter(self.right, other.right), lengths
        )


def _tighter(a: int | None, b: int | None) -> int | None:
    """The smaller window side (None: unbounded)."""
    return b if a is None else a if b is None else min(a, b)


# --- masks ---------------------------------------------------------------------------------
class Mask:
    """Base class: a predicate with optional block structure.

    A subclass defines :meth:`tile` (``(i, j)``) or, when it depends on the batch element or
    head, :meth:`allowed` (``(b, h, i, j)``); :meth:`classify`, :meth:`row_span` and
    :meth:`lower` are optional refinements (the defaults are always correct).
    """

    def tile(self, i: Any, j: Any, geometry: Geometry) -> Any:
        """Boolean tile for query positions ``i`` (r, 1) and key positions ``j`` (1, c)."""
        raise NotImplementedError(
            f"{type(self).__name__} defines neither tile(i, j, geometry) "
            "nor allowed(index, geometry)"
        )

    def allowed(self, index: TileIndex, geometry: Geometry) -> Any:
        """Boolean tile broadcastable to ``(*tile_batch, r, c)`` at ``index``."""
        return self.tile(index.i, index.j, geometry)

    def classify(self, rows: range, cols: range, geometry: Geometry) -> TileKind:
        """EMPTY / FULL when known from the structure alone (for every b, h); else PARTIAL."""
        return TileKind.PARTIAL

    def row_span(self, cols: range, geometry: Geometry) -> range:
        """Query rows that may have an allowed key in ``cols`` (a superset is fine)."""
        return range(geometry.n_q)

    def lower(self, geometry: Geometry) -> Band | None:
        """This mask as the fused kernels' :class:`Band`, or None (generic path only)."""
        return None

    def validate(self, geometry: Geometry) -> None:
        """Raise ValueError if the mask cannot apply to these sizes."""

    def adopt(self, ctx: Any) -> Mask:
        """This mask with its caller-owned arrays in ``ctx``'s array system (and device)."""
        return self

    def __and__(self, other: Any) -> Mask:
        return and_masks(self, other)

    def __or__(self, other: Any) -> Mask:
        return or_masks(self, other)


def _range_of(start: int, stop: int) -> range:
    return range(start, max(start, stop))


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
            if value is not None:
                object.__setattr__(self, side, int(value))
        if self.alignment not in ALIGNMENTS:
            raise ValueError(f"alignment must be one of {ALIGNMENTS}; got {self.alignment!r}")

    def _offset(self, geometry: Geometry) -> int:
        return alignment_offset(self.alignment, geometry.n_q, geometry.n_k)

    def tile(self, i: Any, j: Any, geometry: Geometry) -> Any:
        ok = window_allows(self.left, self.right, self._offset(geometry), i, j, _ARRAY_OPS)
        return (j >= 0) & (i >= 0) if ok is True else ok

    def classify(self, rows: range, cols: range, geometry: Geometry) -> TileKind:
        empty, full = window_tile_kind(
            self.left, self.right, self._offset(geometry),
            rows.start, rows.stop, cols.start, cols.stop,
        )  # fmt: skip
        return TileKind.EMPTY if empty else TileKind.FULL if full else TileKind.PARTIAL

    def row_span(self, cols: range, geometry: Geometry) -> range:
        start, stop = window_row_span(
            self.left, self.right, self._offset(geometry), cols.start, cols.stop, geometry.n_q
        )
        return range(start, stop)

    def lower(self, geometry: Geometry) -> Band:
        return Band(self.alignment, self.left, self.right)


class _ArrayOps:
    """Elementwise connectives on boolean arrays (NumPy or torch)."""

    @staticmethod
    def and_(a: Any, b: Any) -> Any:
        return a & b

    @staticmethod
    def or_(a: Any, b: Any) -> Any:
        return a | b


_ARRAY_OPS = _ArrayOps()


def causal(alignment: str = "top-left") -> SlidingWindow:
    """Query ``i`` sees keys ``j ≤ i`` (top-left) or ``j ≤ i + n_k − n_q`` (bottom-right)."""
    return SlidingWindow(left=None, right=0, alignment=alignment)


def sliding_window(
    left: int | None, right: int | None = 0, alignment: str = "top-left"
) -> SlidingWindow:
    """Query ``i`` sees keys ``j`` with ``i − left ≤ j ≤ i + right`` (aligned as given)."""
    return SlidingWindow(left=left, right=right, alignment=alignment)


def _prefix_of_batch(name: str, shape: tuple[int, ...], geometry: Geometry) -> tuple[int, ...]:
    """``shape`` padded on the right with 1s to the batch's rank (it aligns left)."""
    prefix = geometry.batch[: len(shape)]
    if len(shape) > len(geometry.batch) or any(a != b and a != 1 for a, b in zip(shape, prefix)):
        raise ValueError(
            f"{name} have shape {shape}, which is not a prefix of the batch shape "
            f"{geometry.batch}; give one per batch element (and head)"
        )
    return shape + (1,) * (len(geometry.batch) - len(shape))


@dataclass(frozen=True, eq=False)
class KeyPadding(Mask):
    """Allowed iff ``j < lengths[b]``: each batch element has its own number of real keys.

    ``lengths`` has the leading batch shape or a prefix of it (aligned left: ``(B,)`` for
    inputs ``(B, H, n, d)`` means one length per batch element for every head).
    """

    lengths: Any

    def _lengths(self, geometry: Geometry) -> Any:
        shape = _prefix_of_batch("key_padding lengths", tuple(self.lengths.shape), geometry)
        return geometry.split_heads(self.lengths.reshape((*shape, 1, 1)))

    def validate(self, geometry: Geometry) -> None:
        self._lengths(geometry)

    def adopt(self, ctx: Any) -> KeyPadding:
        return KeyPadding(ctx.adopt(self.lengths))

    def tile(self, i: Any, j: Any, geometry: Geometry) -> Any:
        return j < self._lengths(geometry)

    @functools.cached_property
    def _extremes(self) -> tuple[int, int]:
        """``(shortest, longest)`` of the lengths, read once per mask (every tile asks; a call
        adopts a fresh mask, so a caller's array changed between calls is read again)."""
        return int(self.lengths.min()), int(self.lengths.max())

    def classify(self, rows: range, cols: range, geometry: Geometry) -> TileKind:
        empty, full = padding_tile_kind(*self._extremes, cols.start, cols.stop)
        return TileKind.EMPTY if empty else TileKind.FULL if full else TileKind.PARTIAL

    def row_span(self, cols: range, geometry: Geometry) -> range:
        return range(*padding_row_span(self._extremes[1], cols.start, geometry.n_q))

    def lower(self, geometry: Geometry) -> Band | None:
        shape = _prefix_of_batch("key_padding lengths", tuple(self.lengths.shape), geometry)
        if len(shape) != 2 or shape[1] != 1:  # the kernels take (B, H) inputs, one length per b
            return None
        return Band(kv_lengths=self.lengths.reshape((shape[0],)))


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

    mask: Any

    def adopt(self, ctx: Any) -> Dense:
        return Dense(ctx.adopt(self.mask))

    def validate(self, geometry: Geometry) -> None:
        check_broadcasts("mask", tuple(self.mask.shape), geometry)

    def allowed(self, index: TileIndex, geometry: Geometry) -> Any:
        mask = self.mask
        # A broadcast (size-1) axis is not sliced.
        rows = slice(index.rows.start, index.rows.stop) if mask.shape[-2] != 1 else slice(None)
        cols = slice(index.cols.start, index.cols.stop) if mask.shape[-1] != 1 else slice(None)
        return geometry.split_heads(mask[..., rows, cols])


def check_broadcasts(name: str, shape: tuple[int, ...], geometry: Geometry) -> None:
    target = (*geometry.batch, geometry.n_q, geometry.n_k)
    try:
        ok = len(shape) <= len(target) and np.broadcast_shapes(shape, target) == target
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"{name} has shape {shape}, which does not broadcast to (*batch, n_q, n_k) = {target}"
        )


def dense(allowed: Any) -> Dense:
    """Wrap a caller-owned boolean mask (``True`` = the key may be attended)."""
    if not hasattr(allowed, "dtype"):
        allowed = np.asarray(allowed)
    if "bool" not in str(allowed.dtype):
        raise TypeError(f"a dense mask must be boolean (True = allowed); got {allowed.dtype}")
    if allowed.ndim < 2:
        raise ValueError(f"a dense mask needs at least 2 dims (n_q, n_k); got {allowed.shape}")
    return Dense(allowed)


def check_tile_shape(shape: tuple[int, ...], what: str, index: TileIndex, geometry: Geometry):
    """Raise ValueError unless ``shape`` broadcasts to the tile ``(*tile_batch, r, c)``."""
    target = (*geometry.tile_batch, len(index.rows), len(index.cols))
    try:
        ok = np.broadcast_shapes(tuple(shape), target) == target
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"{what} returned shape {tuple(shape)} for the tile rows {index.rows.start}.."
            f"{index.rows.stop - 1} × keys {index.cols.start}..{index.cols.stop - 1}; "
            f"it must broadcast to {target}"
        )


def check_same_library(out: Any, what: str, index: TileIndex) -> None:
    """Raise TypeError unless ``out`` is an array of the index arrays' library."""
    if not hasattr(out, "shape") or _library(out) != _library(index.i):
        raise TypeError(
            f"{what} returned a {type(out).__name__} for index arrays of type "
            f"{type(index.i).__name__}; return an array of the same library"
        )


def _checked_tile(out: Any, what: str, index: TileIndex, geometry: Geometry) -> Any:
    """A predicate's result: boolean, broadcastable to the tile, of the index arrays' library."""
    dtype = str(getattr(out, "dtype", type(out).__name__))
    if "bool" not in dtype:
        raise TypeError(f"{what} must return a boolean array; got dtype {dtype}")
    check_tile_shape(tuple(getattr(out, "shape", ())), what, index, geometry)
    check_same_library(out, what, index)
    return out


@dataclass(frozen=True, eq=False)
class Predicate(Mask):
    """An arbitrary vectorised predicate ``fn(i, j) -> bool tile``."""

    fn: Callable[[Any, Any], Any]

    def allowed(self, index: TileIndex, geometry: Geometry) -> Any:
        return _checked_tile(self.fn(index.i, index.j), "mask predicate", index, geometry)


@dataclass(frozen=True, eq=False)
class MaskMod(Mask):
    """FlexAttention's ``mask_mod(b, h, q_idx, kv_idx) -> bool``, evaluated per tile.

    The mod sees FlexAttention's index tensors (:func:`call_mod`: torch int64 on every
    backend), and its boolean tile comes back in the arrays of ``ctx`` (set by
    :meth:`adopt`; without it, those of the tile's index arrays).
    """

    fn: Callable[[Any, Any, Any, Any], Any]
    ctx: Any = None

    def adopt(self, ctx: Any) -> MaskMod:
        return MaskMod(self.fn, ctx)

    def allowed(self, index: TileIndex, geometry: Geometry) -> Any:
        out = call_mod(self.fn, "mask_mod", index)
        if not hasattr(out, "dtype"):
            out = np.asarray(out)
        if "bool" not in str(out.dtype):
            raise TypeError(
                f"mask_mod must return a boolean array; got dtype {out.dtype} from "
                f"{mod_name(self.fn)} on the tile {describe_tile(index)}"
            )
        check_tile_shape(tuple(out.shape), "mask_mod", index, geometry)
        if self.ctx is not None:
            return self.ctx.adopt(out)
        return _in_library_of(out, index.i)


# --- calling FlexAttention's mods ------------------------------------------------------------
def mod_name(fn: Any) -> str:
    """How an error names a user's mod: its qualified name, or its repr."""
    return getattr(fn, "__qualname__", None) or repr(fn)


def describe_tile(index: TileIndex) -> str:
    rows, cols = index.rows, index.cols
    return f"rows {rows.start}..{rows.stop - 1} × keys {cols.start}..{cols.stop - 1}"


@functools.cache
def _torch() -> Any:
    """torch, imported on the first mod evaluated (None when it is not installed)."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


def flex_indices(index: TileIndex) -> tuple[Any, Any, Any, Any]:
    """``(b, h, q_idx, kv_idx)`` as FlexAttention's mods take them: torch int64 tensors
    (on the tile's device for torch tiles, else on the CPU); the tile's own int64 arrays
    when torch is not installed. Shapes as in :class:`TileIndex`."""
    arrays = (index.b, index.h, index.i, index.j)
    torch = _torch()
    if torch is None or isinstance(index.i, torch.Tensor):
        return arrays
    return tuple(torch.as_tensor(x) for x in arrays)


def _numpy_indices(index: TileIndex) -> tuple[Any, Any, Any, Any]:
    arrays = (index.b, index.h, index.i, index.j)
    return tuple(np.asarray(x.cpu()) if hasattr(x, "cpu") else x for x in arrays)


def call_mod(fn: Callable[..., Any], what: str, index: TileIndex, *score: Any) -> Any:
    """``fn(*score, b, h, q_idx, kv_idx)`` on one tile, with :func:`flex_indices`.

    A mod written for NumPy arrays that cannot take torch tensors (it raises TypeError,
    e.g. ``numpy_array & tensor``) is evaluated with NumPy int64 arrays instead, so mods
    written either way run. An index out of range inside the mod is reported with the
    mod's name and the tile.
    """
    try:
        try:
            return fn(*score, *flex_indices(index))
        except TypeError as error:
            from .ops import TorchFunctionOnScore

            if isinstance(error, TorchFunctionOnScore) or _torch() is None:
                raise
            try:
                return fn(*score, *_numpy_indices(index))
            except TypeError:
                raise error from None
    except IndexError as error:
        raise IndexError(
            f"{what} {mod_name(fn)} indexed out of range on the tile {describe_tile(index)} "
            f"(batch×heads {tuple(np.shape(index.b))[:-2]}): {error}"
        ) from error


def _in_library_of(out: Any, like: Any) -> Any:
    """``out`` (NumPy or torch) as an array of ``like``'s library (and device)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.as_tensor(out, device=like.device)
    return np.asarray(out.cpu()) if hasattr(out, "cpu") else np.asarray(out)


def _library(x: Any) -> str:
    return type(x).__module__.split(".")[0]


def predicate(fn: Callable[[Any, Any], Any]) -> Predicate:
    """Wrap a vectorised ``fn(i, j)``: ``i`` has shape (r, 1), ``j`` (1, c)."""
    if not callable(fn):
        raise TypeError(f"predicate needs a callable fn(i, j); got {type(fn).__name__}")
    return Predicate(fn)


def from_mask_mod(fn: Callable[[Any, Any, Any, Any], Any]) -> MaskMod:
    """Wrap FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)``, evaluated per tile."""
    if not callable(fn):
        raise TypeError(f"from_mask_mod needs a callable mask_mod(b, h, q_idx, kv_idx); got {fn!r}")
    return MaskMod(fn)


@dataclass(frozen=True)
class _Combination(Mask):
    """``parts`` combined elementwise by :attr:`op` (``&`` for And, ``|`` for Or)."""

    parts: tuple[Mask, ...]

    def adopt(self, ctx: Any) -> Mask:
        return type(self)(tuple(part.adopt(ctx) for part in self.parts))

    def validate(self, geometry: Geometry) -> None:
        for part in self.parts:
            part.validate(geometry)

    def allowed(self, index: TileIndex, geometry: Geometry) -> Any:
        out = self.parts[0].allowed(index, geometry)
        for part in self.parts[1:]:
            out = self.combine(out, part.allowed(index, geometry))
        return out

    def _kinds(self, rows: range, cols: range, geometry: Geometry) -> set[TileKind]:
        return {part.classify(rows, cols, geometry) for part in self.parts}

    def _spans(self, cols: range, geometry: Geometry) -> list[range]:
        return [part.row_span(cols, geometry) for part in self.parts]

    @staticmethod
    def combine(a: Any, b: Any) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class And(_Combination):
    """Allowed where every part allows."""

    @staticmethod
    def combine(a: Any, b: Any) -> Any:
        return a & b

    def classify(self, rows: range, cols: range, geometry: Geometry) -> TileKind:
        kinds = self._kinds(rows, cols, geometry)
        if TileKind.EMPTY in kinds:
            return TileKind.EMPTY
        return TileKind.FULL if kinds == {TileKind.FULL} else TileKind.PARTIAL

    def row_span(self, cols: range, geometry: Geometry) -> range:
        spans = self._spans(cols, geometry)
        return _range_of(max(s.start for s in spans), min(s.stop for s in spans))

    def lower(self, geometry: Geometry) -> Band | None:
        band: Band | None = Band()
        for part in self.parts:
            lowered = part.lower(geometry)
            if lowered is None or band is None:
                return None
            band = band.intersect(lowered)
        return band


@dataclass(frozen=True)
class Or(_Combination):
    """Allowed where any part allows."""

    @staticmethod
    def combine(a: Any, b: Any) -> Any:
        return a | b

    def classify(self, rows: range, cols: range, geometry: Geometry) -> TileKind:
        kinds = self._kinds(rows, cols, geometry)
        if TileKind.FULL in kinds:
            return TileKind.FULL
        return TileKind.EMPTY if kinds == {TileKind.EMPTY} else TileKind.PARTIAL

    def row_span(self, cols: range, geometry: Geometry) -> range:
        # The hull of the parts' spans; a part with no row contributes nothing.
        spans = [s for s in self._spans(cols, geometry) if len(s)]
        if not spans:
            return range(0)
        return _range_of(min(s.start for s in spans), max(s.stop for s in spans))


def _as_masks(masks: tuple[Any, ...], combinator: str) -> tuple[Mask, ...]:
    if not masks:
        raise ValueError(f"{combinator} needs at least one mask")
    parts = tuple(as_mask(m) for m in masks)
    if any(p is None for p in parts):
        raise TypeError(f"{combinator} takes masks; got None among {masks!r}")
    return parts


def and_masks(*masks: Any) -> Mask:
    """Allowed where every mask allows (FlexAttention's ``and_masks``)."""
    return And(_as_masks(masks, "and_masks"))


def or_masks(*masks: Any) -> Mask:
    """Allowed where any mask allows (FlexAttention's ``or_masks``)."""
    return Or(_as_masks(masks, "or_masks"))


# --- FlexAttention's BlockMask -----------------------------------------------------------------
BLOCK_EMPTY, BLOCK_PARTIAL, BLOCK_FULL = 0, 1, 2
_NO_OP_BLOCK_SIZE = 1 << 30  # FlexAttention's "no mask" BlockMask (one huge block)


def blocks_of(start: Any, stop: Any, size: Any, ops: Any = INT) -> tuple[Any, Any]:
    """The blocks of ``size`` positions that ``[start, stop)`` (nonempty) meets:
    ``[⌊start/size⌋, ⌊(stop − 1)/size⌋ + 1)``."""
    return ops.floordiv(start, size), ops.floordiv(stop - 1, size) + 1


def block_rows(first: Any, last: Any, size: Any, n_q: Any, ops: Any = INT) -> tuple[Any, Any]:
    """The rows of query blocks ``first..last``: ``[first·size, min((last + 1)·size, n_q))``."""
    return first * size, ops.min((last + 1) * size, n_q)


@dataclass(frozen=True, eq=False)
class FlexBlockMask(Mask):
    """A torch ``BlockMask`` (``create_block_mask``): its mask_mod, and its block structure.

    ``classes`` holds, for each ``(b, h, query block, key block)`` of ``BLOCK_SIZE =
    (Q_BLOCK, KV_BLOCK)``, whether the BlockMask lists the block as FULL
    (``full_kv_indices``: the mask_mod is skipped there), PARTIAL (``kv_indices``: the
    mask_mod decides) or EMPTY (listed nowhere: skipped). ``b`` and ``h`` axes of size 1
    broadcast. :meth:`validate` checks the sizes and that the structure agrees with the
    mask_mod on every block it calls FULL or EMPTY (FlexAttention would silently compute
    with the structure); after that the tiles use the structure for :meth:`classify` and
    :meth:`row_span` and the mask_mod for PARTIAL tiles.
    """

    mod: MaskMod
    classes: np.ndarray  # int8 (B_bm, H_bm, query blocks, key blocks)
    block: tuple[int, int]
    seq_lengths: tuple[int, int]
    device: Any  # the BlockMask's: its mask_mod's tensors live there

    def adopt(self, ctx: Any) -> FlexBlockMask:
        return FlexBlockMask(
            self.mod.adopt(ctx), self.classes, self.block, self.seq_lengths, self.device
        )

    def allowed(self, index: TileIndex, geometry: Geometry) -> Any:
        return self.mod.allowed(index, geometry)

    def _blocks(self, rows: range, cols: range) -> tuple[slice, slice]:
        q, k = self.block
        return slice(*blocks_of(rows.start, rows.stop, q)), slice(
            *blocks_of(cols.start, cols.stop, k)
        )

    def classify(self, rows: range, cols: range, geometry: Geometry) -> TileKind:
        q_blocks, k_blocks = self._blocks(rows, cols)
        sub = self.classes[..., q_blocks, k_blocks]
        if (sub == BLOCK_EMPTY).all():
            return TileKind.EMPTY
        return TileKind.FULL if (sub == BLOCK_FULL).all() else TileKind.PARTIAL

    def row_span(self, cols: range, geometry: Geometry) -> range:
        _, k_blocks = self._blocks(range(0, 1), cols)
        used = np.flatnonzero((self.classes[..., k_blocks] != BLOCK_EMPTY).any(axis=(0, 1, 3)))
        if not len(used):
            return range(0)
        return range(*block_rows(int(used[0]), int(used[-1]), self.block[0], geometry.n_q))

    def validate(self, geometry: Geometry) -> None:
        if self.seq_lengths != (geometry.n_q, geometry.n_k):
            raise ValueError(
                f"block_mask was created for (Q_LEN, KV_LEN) = {self.seq_lengths}, but the "
                f"inputs have n_q = {geometry.n_q}, n_k = {geometry.n_k}; create the BlockMask "
                "for these lengths"
            )
        batch, heads = math.prod(geometry.batch[:-1]), geometry.heads
        b_bm, h_bm = self.classes.shape[:2]
        if b_bm not in (1, batch) or h_bm not in (1, heads):
            raise ValueError(
                f"block_mask was created for B = {b_bm}, H = {h_bm}, but the inputs have "
                f"B = {batch} (the leading dims {geometry.batch[:-1]}) and H = {heads} query "
                "heads; create it with B and H of the inputs (or 1 to broadcast)"
            )
        self._check_structure(geometry)

    def _check_structure(self, geometry: Geometry) -> None:
        """The mask_mod on every query-block row, against the FULL and EMPTY claims.

        The index tensors are on the BlockMask's device; the tiles come back as NumPy.
        """
        from ..backends import NumpyContext
        from ..backends.torch_backend import TorchContext

        ctx = TorchContext(device=self.device)
        mod = self.mod.adopt(NumpyContext())
        q, k = self.block
        n_blocks = self.classes.shape[-1]
        bh = geometry.batch_head(ctx)
        lead = (math.prod(geometry.batch[:-1]), geometry.heads)
        for row in range(self.classes.shape[-2]):
            rows = range(row * q, min((row + 1) * q, geometry.n_q))
            index = tile_index(ctx, geometry, rows, range(geometry.n_k), bh)
            tile = np.broadcast_to(
                mod.allowed(index, geometry), (*geometry.tile_batch, len(rows), geometry.n_k)
            )
            tile = geometry.merge_heads(tile).reshape((*lead, len(rows), geometry.n_k))
            pad = n_blocks * k - geometry.n_k
            blocks = (*lead, len(rows), n_blocks, k)
            some = np.pad(tile, [(0, 0)] * 3 + [(0, pad)]).reshape(blocks).any(axis=(2, 4))
            every = np.pad(tile, [(0, 0)] * 3 + [(0, pad)], constant_values=True)
            every = every.reshape(blocks).all(axis=(2, 4))
            claims = np.broadcast_to(self.classes[:, :, row, :], some.shape)
            for claim, wrong, says in (
                (BLOCK_FULL, ~every, "FULL, but the mask_mod masks some of its pairs"),
                (BLOCK_EMPTY, some, "EMPTY (not listed), but the mask_mod allows some pairs"),
            ):
                bad = np.argwhere((claims == claim) & wrong)
                if len(bad):
                    b, h, kv = (int(x) for x in bad[0])
                    raise ValueError(
                        f"block_mask's structure disagrees with its mask_mod "
                        f"{mod_name(self.mod.fn)}: the block (b={b}, h={h}, query block {row}, "
                        f"key block {kv}) of size {self.block} is {says} ({len(bad)} such "
                        "blocks in this row); FlexAttention would follow the structure. "
                        "Rebuild it with create_block_mask(mask_mod, ...)"
                    )


def _dense_blocks(num: Any, indices: Any, n_blocks: int, what: str) -> np.ndarray:
    """``(…, rows, n_blocks)`` bool: block ``indices[…, r, :num[…, r]]`` of each row listed."""
    num, indices = (np.asarray(x.detach().cpu()).astype(np.int64) for x in (num, indices))
    listed = np.arange(indices.shape[-1]) < num[..., None]
    if (num > indices.shape[-1]).any() or (listed & ((indices < 0) | (indices >= n_blocks))).any():
        raise ValueError(
            f"block_mask {what} name key blocks outside 0..{n_blocks - 1} (or more blocks "
            f"than listed); KV_LEN and KV_BLOCK_SIZE give {n_blocks} key blocks"
        )
    dense = np.zeros((*indices.shape[:-1], n_blocks + 1), dtype=bool)
    np.put_along_axis(dense, np.where(listed, indices, n_blocks), True, axis=-1)
    return dense[..., :n_blocks]


def from_block_mask(block_mask: Any) -> FlexBlockMask | None:
    """A torch ``BlockMask`` as a mask (None for FlexAttention's no-op BlockMask).

    Checks the BlockMask itself here (block sizes, block counts, indices); the sizes of a
    call are checked by :meth:`FlexBlockMask.validate`.
    """
    q, k = block_mask.BLOCK_SIZE
    if q == k == _NO_OP_BLOCK_SIZE:
        return None
    q_len, kv_len = (int(n) for n in block_mask.seq_lengths)
    if min(q, k) < 1:
        raise ValueError(f"block_mask has BLOCK_SIZE {block_mask.BLOCK_SIZE}; both must be >= 1")
    n_rows, n_cols = -(-q_len // q), -(-kv_len // k)
    shape = tuple(block_mask.kv_num_blocks.shape)
    if len(shape) > 3 or shape[-1] != n_rows:
        raise ValueError(
            f"block_mask has kv_num_blocks of shape {shape}, but Q_LEN = {q_len} with "
            f"Q_BLOCK_SIZE = {q} needs (B, H, {n_rows}): its block size does not match its "
            "lengths"
        )
    classes = np.where(
        _dense_blocks(block_mask.kv_num_blocks, block_mask.kv_indices, n_cols, "kv_indices"),
        BLOCK_PARTIAL,
        BLOCK_EMPTY,
    ).astype(np.int8)
    if block_mask.full_kv_num_blocks is not None:
        full = _dense_blocks(
            block_mask.full_kv_num_blocks, block_mask.full_kv_indices, n_cols, "full_kv_indices"
        )
        if (full & (classes == BLOCK_PARTIAL)).any():
            raise ValueError("block_mask lists some blocks both in kv_indices and full_kv_indices")
        classes = np.where(full, np.int8(BLOCK_FULL), classes)
    classes = classes.reshape((1,) * (4 - classes.ndim) + classes.shape)
    device = block_mask.kv_num_blocks.device
    return FlexBlockMask(
        from_mask_mod(block_mask.mask_mod), classes, (q, k), (q_len, kv_len), device
    )


def _is_block_mask(mask: Any) -> bool:
    flex = sys.modules.get("torch.nn.attention.flex_attention")
    return flex is not None and isinstance(mask, flex.BlockMask)


def _positional_arity(fn: Callable) -> int | None:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds for p in params)


def as_mask(mask: Any) -> Mask | None:
    """Accept ``None``, a :class:`Mask`, a boolean array (dense), a torch ``BlockMask`` or a
    callable: a predicate ``(i, j)``, or FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)``
    (four arguments: also what FlexAttention's ``and_masks``/``or_masks`` return)."""
    if mask is None or isinstance(mask, Mask):
        return mask
    if _is_block_mask(mask):
        return from_block_mask(mask)
    if callable(mask):
        return from_mask_mod(mask) if _positional_arity(mask) == 4 else predicate(mask)
    if hasattr(mask, "shape") or isinstance(mask, (list, tuple)):
        return dense(mask)
    raise TypeError(
        f"mask must be None, an exactattn.masks.Mask, a boolean array, a BlockMask or a callable "
        f"predicate(i, j) / mask_mod(b, h, q_idx, kv_idx); got {type(mask).__name__}"
    )


def create_mask(mask: Any, geometry: Geometry, ctx: Any = None) -> Any:
    """The mask on the whole grid, broadcast to ``(*tile_batch, n_q, n_k)`` (FlexAttention's
    ``create_mask``): the naive reference's materialisation, in ``ctx``'s arrays (NumPy by
    default). ``None`` gives all-True."""
    if ctx is None:
        from ..backends import NumpyContext

        ctx = NumpyContext()
    shape = (*geometry.tile_batch, geometry.n_q, geometry.n_k)
    mask = as_mask(mask)
    if mask is None:
        return ctx.broadcast_to(ctx.index(0, 1) >= 0, shape)
    index = tile_index(ctx, geometry, range(geometry.n_q), range(geometry.n_k))
    return ctx.broadcast_to(mask.adopt(ctx).allowed(index, geometry), shape)


# --- key ranges and packed sequences (split-KV partials, variable-length batches) ----------
@dataclass(frozen=True)
class KeyRange(Mask):
    """Allowed iff ``start ≤ j < stop``: one part of a split of the keys (a partial result).

    Tiles outside the range are EMPTY (never computed), tiles inside it FULL.
    """

    start: int
    stop: int

    def validate(self, geometry: Geometry) -> None:
        if not 0 <= self.start <= self.stop <= geometry.n_k:
            raise ValueError(
                f"key_range ({self.start}, {self.stop}) must satisfy 0 <= start <= stop <= "
                f"n_k = {geometry.n_k}"
            )

    def tile(self, i: Any, j: Any, geometry: Geometry) -> Any:
        return (j >= self.start) & (j < self.stop) & (i >= 0)

    def classify(self, rows: range, cols: range, geometry: Geometry) -> TileKind:
        if cols.stop <= self.start or cols.start >= self.stop:
            return TileKind.EMPTY
        if self.start <= cols.start and cols.stop <= self.stop:
            return TileKind.FULL
        return TileKind.PARTIAL

    def row_span(self, cols: range, geometry: Geometry) -> range:
        empty = cols.stop <= self.start or cols.start >= self.stop
        return range(0, 0 if empty else geometry.n_q)


def key_range(start: Any, stop: Any) -> KeyRange:
    """Keys ``start..stop−1`` only (positions keep their place, so masks still align)."""
    for name, value in (("start", start), ("stop", stop)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"key_range {name} must be an integer; got {value!r}")
    return KeyRange(int(start), int(stop))


def sequence_ids(cu_seqlens: np.ndarray) -> np.ndarray:
    """The sequence ``s`` of every packed position ``p``: ``cu[s] ≤ p < cu[s+1]``."""
    positions = np.arange(int(cu_seqlens[-1]))
    return np.searchsorted(cu_seqlens, positions, side="right") - 1


def packed_tile_kind(sequences, r0, r1, a, e, offset, left, right, ops: Any = INT):
    """``(empty, full)`` of a tile of a packed batch: ``sequences = (q0, q1, k0, k1)`` own
    its first and last row and key; ``[r0, r1) × [a, e)`` are its rows and keys local to
    sequence ``q0`` and ``offset`` is ``o_{q0}``. Empty when the row and key sequences do not
    meet; full only inside one sequence whose window covers the tile."""
    q0, q1, k0, k1 = sequences
    one = ops.and_(ops.and_(q0 == q1, q1 == k0), k0 == k1)
    w_empty, w_full = window_tile_kind(left, right, offset, r0, r1, a, e, ops)
    return ops.or_(ops.or_(q1 < k0, k1 < q0), ops.and_(one, w_empty)), ops.and_(one, w_full)


class PackedSequences(Mask):
    """Sequences packed along the position axis, each attending only to itself.

    Query ``i`` of sequence ``s`` (``cu_q[s] ≤ i < cu_q[s+1]``) may see key ``j`` iff ``j``
    belongs to ``s`` (``cu_k[s] ≤ j < cu_k[s+1]``) and the window allows the local positions
    ``i' = i − cu_q[s]``, ``j' = j − cu_k[s]``, aligned bottom-right per sequence as
    flash-attn's varlen functions do: ``i' + o_s − left ≤ j' ≤ i' + o_s + right`` with
    ``o_s = len_k(s) − len_q(s)`` (``None``: that side unbounded; causal is
    ``right = 0``). The index maps are per-position arrays: ``query_seq[i] = s``,
    ``query_pos[i] = i' + o_s`` and ``key_seq[j] = s``, ``key_pos[j] = j'``.
    """

    def __init__(self, cu_q: Any, cu_k: Any, left: int | None = None, right: int | None = None):
        self.cu_q = np.asarray(cu_q, dtype=np.int64)
        self.cu_k = np.asarray(cu_k, dtype=np.int64)
        self.left, self.right = left, right
        self.offsets = np.diff(self.cu_k) - np.diff(self.cu_q)
        self._query_seq = sequence_ids(self.cu_q)
        self._key_seq = sequence_ids(self.cu_k)
        self._query_pos = (
            np.arange(int(self.cu_q[-1])) - self.cu_q[self._query_seq]
        ) + self.offsets[self._query_seq]
        self._key_pos = np.arange(int(self.cu_k[-1])) - self.cu_k[self._key_seq]
        self.maps = (self._query_seq, self._query_pos, self._key_seq, self._key_pos)

    def adopt(self, ctx: Any) -> PackedSequences:
        out = PackedSequences.__new__(PackedSequences)
        out.__dict__.update(self.__dict__)
        out.maps = tuple(ctx.adopt(x) for x in self.maps)
        return out

    def validate(self, geometry: Geometry) -> None:
        if (geometry.n_q, geometry.n_k) != (int(self.cu_q[-1]), int(self.cu_k[-1])):
            raise ValueError(
                f"packed sequences cover {int(self.cu_q[-1])} queries and {int(self.cu_k[-1])} "
                f"keys; the inputs have n_q = {geometry.n_q}, n_k = {geometry.n_k}"
            )

    def tile(self, i: Any, j: Any, geometry: Geometry) -> Any:
        query_seq, query_pos, key_seq, key_pos = self.maps
        same = query_seq[i] == key_seq[j]
        ok = window_allows(self.left, self.right, 0, query_pos[i], key_pos[j], _ARRAY_OPS)
        return same if ok is True else same & ok

    def _sequences(self, rows: range, cols: range) -> tuple[int, int, int, int]:
        return (
            int(self._query_seq[rows.start]),
            int(self._query_seq[rows.stop - 1]),
            int(self._key_seq[cols.start]),
            int(self._key_seq[cols.stop - 1]),
        )

    def classify(self, rows: range, cols: range, geometry: Geometry) -> TileKind:
        q0, q1, k0, k1 = self._sequences(rows, cols)
        base_q, base_k = int(self.cu_q[q0]), int(self.cu_k[q0])
        empty, full = packed_tile_kind(
            (q0, q1, k0, k1), rows.start - base_q, rows.stop - base_q,
            cols.start - base_k, cols.stop - base_k, int(self.offsets[q0]), self.left, self.right,
        )  # fmt: skip
        return TileKind.EMPTY if empty else TileKind.FULL if full else TileKind.PARTIAL

    def row_span(self, cols: range, geometry: Geometry) -> range:
        """The queries of the sequences that own keys ``cols``."""
        first, last = int(self._key_seq[cols.start]), int(self._key_seq[cols.stop - 1])
        return range(int(self.cu_q[first]), int(self.cu_q[last + 1]))
