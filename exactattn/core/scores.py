"""Score modification: one step of the tiled algorithm, ``s_ij ↦ mod(s_ij, b, h, i, j)``.

The scores of a tile are ``s = c·q_i·k_j``, then each modification in turn, then the mask
(``−∞`` off ``A_i``) — FlexAttention's ``score_mod`` order. Built in:

* :class:`Softcap` — logit soft-capping ``cap·tanh(s/cap)`` (Gemma 2, Grok), derivative
  ``1 − tanh²(s/cap)``;
* :class:`Bias` — an additive bias ``s + B_ij`` from a caller-owned array broadcastable to
  ``(*batch, n_q, n_k)``, sliced per tile (entries may be ``−∞``: that pair is excluded, as
  SDPA's float ``attn_mask`` does); its gradient ``∂L/∂B_ij`` is the ``γ_ij`` that reaches it;
* :class:`BiasFn` — an additive bias ``fn(b, h, i, j)`` evaluated per tile on broadcast index
  arrays (ALiBi slopes, relative-position tables), never materialised;
* :class:`ScoreFn` — FlexAttention's ``score_mod(score, b, h, q_idx, kv_idx)``, any function
  of the score; its derivative ``∂mod/∂s`` by torch autograd or by :mod:`exactattn.core.ops`'
  dual numbers.

:func:`chain` composes them; the public keywords build ``softcap``, then ``bias``, then
``score_mod``: soft-capping acts on the raw logits (the order flash-attn and Gemma 2 use),
and a FlexAttention program given as one ``score_mod`` sees ``c·q·k`` when it is used alone,
exactly as in FlexAttention.

The reverse: with ``s' = mod(s)`` the upstream ``γ_ij = ∂L/∂s'_ij`` becomes
``γ_ij · ∂mod/∂s`` before ``dQ += c·γK`` and ``dK += c·γᵀQ``; each modification gives its
factor (and its parameters' gradients) through :meth:`TileMod.pullback`, applied in the
reverse order of the forward.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import ops
from .masks import (
    Geometry,
    TileIndex,
    call_mod,
    check_broadcasts,
    check_same_library,
    check_tile_shape,
    describe_tile,
    mod_name,
)
from .ops import Dual, TorchFunctionOnScore


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

    def apply_tangent(self, s: Any, s_dot: Any, tangents: dict[str, Any]) -> tuple[Any, Any]:
        """``(mod(s), ṡ′)`` with ``ṡ′ = mod′(s)·ṡ`` (plus the tangents of the parameters
        named in ``tangents``, ``Ḃ`` of a bias); records what :meth:`pullback_tangent` needs."""
        raise NotImplementedError(
            f"{type(self).__name__} has no second derivative; the second-order reverse "
            "(exactattn.attention_hvp, create_graph=True) takes softcap, bias and score_mod"
        )

    def pullback_tangent(
        self, gamma: Any, gamma_dot: Any, grad_tangents: dict[str, Any]
    ) -> tuple[Any, Any]:
        """``(γ·mod′, γ̇·mod′ + γ·mod″·ṡ)`` after :meth:`apply_tangent` (``ṡ`` the tangent it
        was given); adds the parameters' gradient tangents to ``grad_tangents``."""
        raise NotImplementedError(f"{type(self).__name__} has no second derivative")


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

    def apply_tangent(self, s: Any, s_dot: Any, tangents: dict[str, Any]) -> tuple[Any, Any]:
        out = self.apply(s)
        self.s_dot = s_dot
        return out, s_dot * (self.ctx.scalar(1) - self.t * self.t)

    def pullback_tangent(
        self, gamma: Any, gamma_dot: Any, grad_tangents: dict[str, Any]
    ) -> tuple[Any, Any]:
        """``mod′ = 1 − t²`` and ``mod″ = −2t(1 − t²)/cap``, ``t = tanh(s/cap)``."""
        d1 = self.ctx.scalar(1) - self.t * self.t
        d2 = self.ctx.scalar(-2) * self.t * d1 / self.cap
        return gamma * d1, gamma_dot * d1 + gamma * d2 * self.s_dot


# --- additive bias ---------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Bias(ScoreMod):
    """``s ↦ s + B_ij`` with ``B`` a caller-owned array broadcastable to (*batch, n_q, n_k)."""

    values: Any

    def adopt(self, ctx: Any) -> Bias:
        return Bias(ctx.as_compute(self.values))

    def validate(self, geometry: Geometry) -> None:
        check_broadcasts("bias", tuple(self.values.shape), geometry)

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

    def apply_tangent(self, s: Any, s_dot: Any, tangents: dict[str, Any]) -> tuple[Any, Any]:
        """``(s + B, ṡ + Ḃ)``: ``Ḃ`` sliced like ``B`` when ``tangents`` has one."""
        b_dot = tangents.get("bias")
        if b_dot is not None:
            s_dot = s_dot + self.geometry.split_heads(b_dot[..., self.rows, self.cols])
        return self.apply(s), s_dot

    def pullback_tangent(
        self, gamma: Any, gamma_dot: Any, grad_tangents: dict[str, Any]
    ) -> tuple[Any, Any]:
        """``mod′ = 1``, ``mod″ = 0``; ``dḂ = γ̇`` (summed as ``dB`` is)."""
        self.pullback(gamma_dot, grad_tangents)
        return gamma, gamma_dot


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

    def apply_tangent(self, s: Any, s_dot: Any, tangents: dict[str, Any]) -> tuple[Any, Any]:
        return self.apply(s), s_dot

    def pullback_tangent(
        self, gamma: Any, gamma_dot: Any, grad_tangents: dict[str, Any]
    ) -> tuple[Any, Any]:
        return gamma, gamma_dot


# --- FlexAttention's score_mod ---------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ScoreFn(ScoreMod):
    """FlexAttention's ``score_mod(score, b, h, q_idx, kv_idx)``, evaluated per tile.

    The index arguments are FlexAttention's index tensors (:func:`~exactattn.core.masks.call_mod`).
    On torch the score is the tile tensor: the mod may call torch functions, and the reverse
    takes ``γ·∂mod/∂s`` (and the gradients of ``params``, tensors the mod reads) from torch
    autograd on the tile. On the other backends the score is an :class:`exactattn.core.ops.Dual`:
    the mod is written with operators, constants and :mod:`exactattn.core.ops`, and the reverse
    evaluates it once more on ``Dual(s, 1)``, whose tangent is ``∂mod/∂s``.

    :meth:`TileMod.excluded` (the pairs sent to −∞, used only to tell an empty row from an
    overflowed one) follows FlexAttention's ``create_mask`` for a score_mod: the mod at
    score 0.
    """

    fn: Callable[..., Any]
    params: tuple[Any, ...] = ()

    def at(self, ctx: Any, index: TileIndex, geometry: Geometry) -> TileMod:
        return _ScoreFnTile(self, ctx, index, geometry)

    def gradients(self) -> dict[str, tuple[int, ...]]:
        return {param_name(n): tuple(p.shape) for n, p in enumerate(self.params)}


def param_name(n: int) -> str:
    """The gradient name of a score_mod's ``n``-th parameter tensor."""
    return f"score_mod.{n}"


def score_fn(fn: Any, params: tuple[Any, ...] = ()) -> ScoreMod:
    """A :class:`ScoreMod`, or FlexAttention's ``score_mod(score, b, h, q_idx, kv_idx)``."""
    if isinstance(fn, ScoreMod):
        return fn
    if not callable(fn):
        raise TypeError(
            f"score_mod must be a callable score_mod(score, b, h, q_idx, kv_idx); got {fn!r}"
        )
    return ScoreFn(fn, tuple(params))


def _torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def shape_of(x: Any) -> tuple[int, ...]:
    """The shape of a score_mod's result (an array, a tensor, a Dual or a number)."""
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def keeps_shape(got: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether a result of shape ``got`` gives one score per score of ``shape``."""
    try:
        return np.broadcast_shapes(got, shape) == shape
    except ValueError:
        return False


class _ScoreFnTile(TileMod):
    def __init__(self, mod: ScoreFn, ctx: Any, index: TileIndex, geometry: Geometry):
        self.mod, self.ctx, self.index, self.geometry = mod, ctx, index, geometry
        self.s = None

    def _call(self, score: Any) -> Any:
        try:
            return call_mod(self.mod.fn, "score_mod", self.index, score)
        except TorchFunctionOnScore as error:
            raise TypeError(
                f"score_mod {mod_name(self.mod.fn)} calls torch.{error.function} on the score, "
                f"which on {self.ctx.name} is not a torch tensor (tile "
                f"{describe_tile(self.index)}): write it with exactattn.ops.{error.function} "
                "(it dispatches on the score's type) or run on torch tensors"
            ) from None

    def _checked(self, out: Any, like: Any) -> Any:
        """The mod's result on the tile ``like``: checked, as a tensor on torch, else a Dual."""
        shape = tuple(like.shape)
        if not isinstance(out, Dual) and "bool" in str(getattr(out, "dtype", type(out))):
            raise TypeError(
                f"score_mod {mod_name(self.mod.fn)} returned booleans; a score_mod returns "
                "scores (a mask goes in mask= / block_mask=)"
            )
        got = shape_of(out)
        if not keeps_shape(got, shape):
            raise ValueError(
                f"score_mod {mod_name(self.mod.fn)} returned shape {got} for a score tile of "
                f"shape {shape} (tile {describe_tile(self.index)}); a score_mod maps each "
                "score to one score and must keep the shape"
            )
        if _torch_tensor(like):
            return sys.modules["torch"].as_tensor(out, device=like.device)
        return out if isinstance(out, Dual) else Dual(self.ctx, ops.constant(self.ctx, out))

    def _evaluate(self, s: Any, tangent: Any = None) -> Any:
        """The mod on the tile ``s``: a torch tensor, or a :class:`Dual` (tangent ``tangent``)."""
        score = s if _torch_tensor(s) else Dual(self.ctx, s, tangent)
        return self._checked(self._call(score), s)

    def apply(self, s: Any) -> Any:
        self.s = s
        out = self._evaluate(s)
        out = out.value if isinstance(out, Dual) else out
        # A fresh tile of the score's type: the algorithm may overwrite it in place (e^{s−m}),
        # and s is kept for the reverse.
        if _torch_tensor(s):
            return sys.modules["torch"].broadcast_to(out.to(s.dtype), s.shape).clone()
        return np.array(np.broadcast_to(out, s.shape), dtype=s.dtype)

    def pullback(self, gamma: Any, grads: dict[str, Any]) -> Any:
        if _torch_tensor(self.s):
            return self._torch_pullback(gamma, grads)
        out = self._evaluate(self.s, self.ctx.scalar(1))
        if out.tangent is None:  # the mod does not depend on the score
            return gamma * self.ctx.scalar(0)
        return gamma * out.tangent

    def _torch_pullback(self, gamma: Any, grads: dict[str, Any]) -> Any:
        """``γ·∂mod/∂s``, and ``Σ γ·∂mod/∂θ`` added into ``grads`` for the parameters θ
        asked for, by autograd on the tile."""
        torch = sys.modules["torch"]
        named = ((param_name(n), p) for n, p in enumerate(self.mod.params))
        wanted = [(name, p) for name, p in named if name in grads]
        with torch.enable_grad():
            s = self.s.detach().requires_grad_(True)
            out = torch.broadcast_to(self._evaluate(s), s.shape)
            if not out.requires_grad:  # depends on neither the score nor a parameter
                return torch.zeros_like(gamma)
            found = torch.autograd.grad(
                out, [s, *(p for _, p in wanted)], gamma.to(out.dtype), allow_unused=True
            )
        for (name, _), grad in zip(wanted, found[1:]):
            if grad is not None:
                grads[name] += grad.to(grads[name].dtype)
        return torch.zeros_like(gamma) if found[0] is None else found[0].to(gamma.dtype)

    def apply_tangent(self, s: Any, s_dot: Any, tangents: dict[str, Any]) -> tuple[Any, Any]:
        out = self.apply(s)
        self.s_dot = s_dot
        self.d1, self.d2 = self._derivatives(s)
        return out, s_dot * self.d1

    def pullback_tangent(
        self, gamma: Any, gamma_dot: Any, grad_tangents: dict[str, Any]
    ) -> tuple[Any, Any]:
        """``(γ·mod′, γ̇·mod′ + γ·mod″·ṡ)``; the parameters' gradients have no tangent here."""
        return gamma * self.d1, gamma_dot * self.d1 + gamma * self.d2 * self.s_dot

    def _derivatives(self, s: Any) -> tuple[Any, Any]:
        """``(mod′(s), mod″(s))`` on the tile: by torch autograd twice on torch, else one
        evaluation on a nested :class:`Dual` ``(s + ε₁) + ε₂`` with ``ε₁² = ε₂² = 0``,
        whose ``ε₂`` part is ``mod′(s + ε₁) = mod′(s) + ε₁·mod″(s)``."""
        if _torch_tensor(s):
            return self._torch_derivatives(s)
        ones = self.ctx.zeros(tuple(s.shape)) + self.ctx.scalar(1)
        score = Dual(self.ctx, Dual(self.ctx, s, ones), Dual(self.ctx, ones))
        out = self._checked(self._call(score), s)
        zero = self.ctx.zeros(tuple(s.shape))
        first = out.tangent
        if first is None:  # the mod does not depend on the score
            return zero, zero
        if not isinstance(first, Dual):
            return first, zero
        return first.value, zero if first.tangent is None else first.tangent

    def _torch_derivatives(self, s: Any) -> tuple[Any, Any]:
        torch = sys.modules["torch"]
        with torch.enable_grad():
            x = s.detach().requires_grad_(True)
            out = torch.broadcast_to(self._evaluate(x), x.shape)
            zero = torch.zeros_like(s)
            if not out.requires_grad:
                return zero, zero
            (d1,) = torch.autograd.grad(out.sum(), x, create_graph=True, allow_unused=True)
            if d1 is None:
                return zero, zero
            if not d1.requires_grad:
                return d1.detach(), zero
            (d2,) = torch.autograd.grad(d1.sum(), x, allow_unused=True)
        return d1.detach(), zero if d2 is None else d2.detach()

    def excluded(self) -> Any:
        shape = (*self.geometry.tile_batch, len(self.index.rows), len(self.index.cols))
        out = self._evaluate(self.ctx.zeros(shape))
        out = out.value if isinstance(out, Dual) else out
        return self.ctx.is_neg_inf(self.ctx.broadcast_to(out, shape))


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

    def apply_tangent(self, s: Any, s_dot: Any, tangents: dict[str, Any]) -> tuple[Any, Any]:
        for tile in self.tiles:
            s, s_dot = tile.apply_tangent(s, s_dot, tangents)
        return s, s_dot

    def pullback_tangent(
        self, gamma: Any, gamma_dot: Any, grad_tangents: dict[str, Any]
    ) -> tuple[Any, Any]:
        for tile in reversed(self.tiles):
            gamma, gamma_dot = tile.pullback_tangent(gamma, gamma_dot, grad_tangents)
        return gamma, gamma_dot

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
