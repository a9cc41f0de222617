"""Score modification: one step of the tiled algorithm, ``s_ij ↦ mod(s_ij, b, h, i, j)``.

The scores of a tile are ``s = c·q_i·k_j``, then each modification in turn, then the mask
(``−∞`` off ``A_i``) — FlexAttention's ``score_mod`` order. Built in:

* :class:`Softcap` — logit soft-capping ``cap·tanh(s/cap)`` (Gemma 2, Grok), derivative
  ``1 − tanh²(s/cap)``;
* :class:`Bias` — an additive bias ``s + B_ij`` from a caller-owned array broadcastable to
  ``(*batch, n_q, n_k)``, sliced per tile (entries may be ``−∞``: that pair is excluded, as
  SDPA's float ``attn_mask`` does); its gradient ``∂L/∂B_ij`` is the ``γ_ij`` that reaches it;
* :class:`BiasFn` — an additive bias ``fn(b, h, i, j)`` evaluated per tile on broadcast index
  arrays (ALiBi slopes, relative-position tables), never materialised.

:func:`chain` composes them; the public keywords build ``softcap`` then ``bias``, the order
flash-attn and Gemma 2 use (soft-capping acts on the raw logits, then the mask is added).

The reverse: with ``s' = mod(s)`` the upstream ``γ_ij = ∂L/∂s'_ij`` becomes
``γ_ij · ∂mod/∂s`` before ``dQ += c·γK`` and ``dK += c·γᵀQ``; each modification gives its
factor (and its parameters' gradients) through :meth:`TileMod.pullback`, applied in the
reverse order of the forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .masks import Geometry, TileIndex, _check_broadcasts, check_same_library, check_tile_shape


@dataclass(frozen=True)
class KernelScores:
    """Score modifications as the fused kernels take them: ``cap·tanh(s/cap)`` (when
    ``softcap`` is set) then ``+ bias`` (a caller-owned array, when set)."""

    softcap: Any = None
    bias: Any = None

    def then(self, other: KernelScores) -> KernelScores | None:
        """This followed by ``other``, or None when the kernels cannot say it (a second
        bias, or a softcap after a bias)."""
        if other.softcap is not None and (self.softcap is not None or self.bias is not None):
            return None
        if other.bias is not None and self.bias is not None:
            return None
        softcap = self.softcap if other.softcap is None else other.softcap
        return KernelScores(softcap, self.bias if other.bias is None else other.bias)


class ScoreMod:
    """Base class of a score modification ``s ↦ mod(s, b, h, i, j)``."""

    def lower(self) -> KernelScores | None:
        """This modification as the fused kernels take it, or None (generic path only)."""
        return None

    def at(self, ctx: Any, index: TileIndex, geometry: Geometry) -> TileMod:
        """This modification on one tile (it records what its pullback needs)."""
        raise NotImplementedError

    def gradients(self) -> dict[str, tuple[int, ...]]:
        """Parameters with a gradient: name → shape (``{"bias": shape}`` for a bias array)."""
        return {}

    def validate(self, geometry: Geometry) -> None:
        """Raise ValueError if the modification cannot apply to these sizes."""

    def adopt(self, ctx: Any) -> ScoreMod:
        """This modification with its arrays in ``ctx``'s array system."""
        return self

    def check_finite(self, ctx: Any) -> None:
        """Raise ValueError on NaN or +∞ in a caller-owned array (−∞ is allowed)."""


class TileMod:
    """A score modification at one tile: :meth:`apply` then (in the reverse) :meth:`pullback`."""

    def apply(self, s: Any) -> Any:
        raise NotImplementedError

    def pullback(self, gamma: Any, grads: dict[str, Any]) -> Any:
        """``γ·∂mod/∂s`` for the γ of the modified scores; adds parameter gradients to ``grads``."""
        raise NotImplementedError

    def excluded(self) -> Any:
        """Boolean tile of the pairs this modification sends to −∞, or None."""
        return None


# --- soft-capping --------------------------------------------------------------------------
@dataclass(frozen=True)
class Softcap(ScoreMod):
    """``s ↦ cap·tanh(s / cap)``: scores squashed into ``(−cap, cap)``."""

    cap: Any

    def at(self, ctx: Any, index: TileIndex, geometry: Geometry) -> TileMod:
        return _SoftcapTile(ctx, ctx.scalar(self.cap))

    def lower(self) -> KernelScores:
        return KernelScores(softcap=self.cap)


class _SoftcapTile(TileMod):
    def __init__(self, ctx: Any, cap: Any):
        self.ctx, self.cap, self.t = ctx, cap, None

    def apply(self, s: Any) -> Any:
        self.t = self.ctx.tanh(s / self.cap)
        return self.t * self.cap

    def pullback(self, gamma: Any, grads: dict[str, Any]) -> Any:
        one = self.ctx.scalar(1)
        return gamma * (one - self.t * self.t)


# --- additive bias ---------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Bias(ScoreMod):
    """``s ↦ s + B_ij`` with ``B`` a caller-owned array broadcastable to (*batch, n_q, n_k)."""

    values: Any

    def adopt(self, ctx: Any) -> Bias:
        return Bias(ctx.as_compute(self.values))

    def validate(self, geometry: Geometry) -> None:
        _check_broadcasts("bias", tuple(self.values.shape), geometry)

    def gradients(self) -> dict[str, tuple[int, ...]]:
        return {"bias": tuple(self.values.shape)}

    def check_finite(self, ctx: Any) -> None:
        bad = ctx.nonfinite(self.values) & ~ctx.is_neg_inf(self.values)
        if ctx.any(bad):
            raise ValueError(
                "bias contains NaN or +inf (−inf is allowed: it excludes that pair); "
                "pass check_finite=False to compute anyway"
            )

    def at(self, ctx: Any, index: TileIndex, geometry: Geometry) -> TileMod:
        return _BiasTile(ctx, self.values, index, geometry)

    def lower(self) -> KernelScores:
        return KernelScores(bias=self.values)


class _BiasTile(TileMod):
    def __init__(self, ctx: Any, values: Any, index: TileIndex, geometry: Geometry):
        rows, cols = index.rows, index.cols
        self.rows = slice(rows.start, rows.stop) if values.shape[-2] != 1 else slice(None)
        self.cols = slice(cols.start, cols.stop) if values.shape[-1] != 1 else slice(None)
        self.ctx, self.geometry = ctx, geometry
        self.tile = geometry.split_heads(values[..., self.rows, self.cols])

    def apply(self, s: Any) -> Any:
        return s + self.tile

    def pullback(self, gamma: Any, grads: dict[str, Any]) -> Any:
        grad = grads.get("bias")
        if grad is not None:
            target = grad[..., self.rows, self.cols]
            merged = self.geometry.merge_heads(gamma)
            grad[..., self.rows, self.cols] = target + self.ctx.sum_to(merged, target.shape)
        return gamma

    def excluded(self) -> Any:
        return self.ctx.is_neg_inf(self.tile)


@dataclass(frozen=True, eq=False)
class BiasFn(ScoreMod):
    """``s ↦ s + fn(b, h, i, j)`` evaluated per tile on broadcast index arrays."""

    fn: Any

    def at(self, ctx: Any, index: TileIndex, geometry: Geometry) -> TileMod:
        out = self.fn(index.b, index.h, index.i, index.j)
        check_same_library(out, "bias function", index)
        if "bool" in str(out.dtype):
            raise TypeError("bias function returned booleans; a mask goes in mask=, a bias is real")
        check_tile_shape(tuple(out.shape), "bias function", index, geometry)
        return _BiasFnTile(ctx, ctx.as_compute(out))


class _BiasFnTile(TileMod):
    def __init__(self, ctx: Any, tile: Any):
        self.ctx, self.tile = ctx, tile

    def apply(self, s: Any) -> Any:
        return s + self.tile

    def pullback(self, gamma: Any, grads: dict[str, Any]) -> Any:
        return gamma

    def excluded(self) -> Any:
        return self.ctx.is_neg_inf(self.tile)


# --- composition -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Chain(ScoreMod):
    """``mods[-1] ∘ … ∘ mods[0]``: each modification sees the previous one's scores."""

    mods: tuple[ScoreMod, ...]

    def at(self, ctx: Any, index: TileIndex, geometry: Geometry) -> TileMod:
        return _ChainTile([mod.at(ctx, index, geometry) for mod in self.mods], ctx)

    def lower(self) -> KernelScores | None:
        lowered: KernelScores | None = KernelScores()
        for mod in self.mods:
            part = mod.lower()
            if part is None or lowered is None:
                return None
            lowered = lowered.then(part)
        return lowered

    def gradients(self) -> dict[str, tuple[int, ...]]:
        out: dict[str, tuple[int, ...]] = {}
        for mod in self.mods:
            out.update(mod.gradients())
        return out

    def validate(self, geometry: Geometry) -> None:
        for mod in self.mods:
            mod.validate(geometry)

    def adopt(self, ctx: Any) -> Chain:
        return Chain(tuple(mod.adopt(ctx) for mod in self.mods))

    def check_finite(self, ctx: Any) -> None:
        for mod in self.mods:
            mod.check_finite(ctx)


class _ChainTile(TileMod):
    def __init__(self, tiles: list[TileMod], ctx: Any):
        self.tiles, self.ctx = tiles, ctx

    def apply(self, s: Any) -> Any:
        for tile in self.tiles:
            s = tile.apply(s)
        return s

    def pullback(self, gamma: Any, grads: dict[str, Any]) -> Any:
        for tile in reversed(self.tiles):
            gamma = tile.pullback(gamma, grads)
        return gamma

    def excluded(self) -> Any:
        out = None
        for tile in self.tiles:
            part = tile.excluded()
            if part is not None:
                out = part if out is None else out | part
        return out


def chain(*mods: ScoreMod | None) -> ScoreMod | None:
    """The composition of the given modifications in order (None entries dropped)."""
    mods = tuple(m for m in mods if m is not None)
    if not mods:
        return None
    return mods[0] if len(mods) == 1 else Chain(mods)


def softcap(cap: Any) -> Softcap:
    """``cap·tanh(s/cap)``; ``cap`` a positive finite number (validated by the caller's ctx)."""
    return Softcap(cap)


def bias(values: Any) -> ScoreMod:
    """An additive bias: an array broadcastable to (*batch, n_q, n_k), or ``fn(b, h, i, j)``."""
    if isinstance(values, ScoreMod):
        return values
    if callable(values):
        return BiasFn(values)
    if not hasattr(values, "dtype"):
        values = np.asarray(values)
    if "float" not in str(values.dtype) and values.dtype != object:
        raise TypeError(f"bias must be a real floating-point array; got dtype {values.dtype}")
    if values.ndim < 2:
        raise ValueError(f"bias needs at least 2 dims (n_q, n_k); got shape {tuple(values.shape)}")
    return Bias(values)
