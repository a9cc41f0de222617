"""A call's preparation: where every entry point's arguments become one :class:`Call`.

The entry points — the array API (:mod:`exactattn.api`), :func:`exactattn.torch.attention`,
:func:`exactattn.torch.flex_attention` and the torch operator's plan
(:func:`exactattn.torch.op.plan_of`) — each turn their own signature into the same few
objects (a mask ``A_i``, the score modifications, dropout) and hand them to :func:`prepare`,
which builds the sizes (:class:`~exactattn.core.masks.Geometry`, here and nowhere else for a
call), takes the mask's and the modifications' arrays into the context, checks them against
the sizes and resolves ``c`` and ``b``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..backends.protocol import Array, ArrayContext
from . import validation
from .algorithm import geometry_of
from .dropout import Dropout
from .masks import Geometry, Mask, as_mask
from .scores import ScoreMod


@dataclass(frozen=True)
class Call:
    """A prepared call: the context, its arrays (``q``, ``k``, ``v`` and any others the
    entry point checks, such as ``y`` and ``grad_y``) and the resolved keywords.

    ``block_size`` is ``b``, or None where the torch path chooses it from the sizes and the
    lowered mask (:func:`exactattn.torch.passes.plan_for`).
    """

    ctx: ArrayContext
    arrays: dict[str, Array]
    geometry: Geometry
    scale: Any
    block_size: int | None
    mask: Mask | None
    dropout: Dropout | None
    score_mod: ScoreMod | None
    enable_gqa: bool
    empty_rows: str
    check_finite: bool

    def keywords(self) -> dict[str, Any]:
        """The keywords the tiled and naive passes share."""
        return dict(
            scale=self.scale,
            mask=self.mask,
            dropout=self.dropout,
            score_mod=self.score_mod,
            enable_gqa=self.enable_gqa,
        )


def prepare(
    ctx: ArrayContext,
    arrays: dict[str, Array],
    *,
    scale: Any,
    block_size: Any,
    mask: Any,
    score_mod: ScoreMod | None,
    dropout: Dropout | None,
    enable_gqa: Any,
    empty_rows: str = "zero",
    check_finite: bool = False,
    default_block_size: int | None = None,
    checked: bool = True,
) -> Call:
    """The :class:`Call` of ``arrays`` (already the context's: call inside ``ctx.scope()``).

    ``mask`` is anything :func:`~exactattn.core.masks.as_mask` takes; ``score_mod`` and
    ``dropout`` are built by the entry point from its own arguments. With ``checked`` the
    shapes, the mask and the modifications against the sizes, ``scale`` and ``block_size``
    are checked (and, with ``check_finite``, every array's values). ``checked=False`` is the
    torch operator's: its callers checked all of it (the strict API, or SDPA's contract,
    which lets ``d = 0`` and any float ``scale`` through), so nothing is checked twice.
    """
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    if checked:
        validation.check_policy(empty_rows)
        if not isinstance(enable_gqa, bool):
            raise TypeError(f"enable_gqa must be a bool; got {enable_gqa!r}")
        validation.check_qkv(q, k, v, enable_gqa)
    geometry = geometry_of(q, k, v, enable_gqa)
    mask = as_mask(mask)
    if mask is not None:
        mask = mask.adopt(ctx)
        if checked:
            mask.validate(geometry)
    if score_mod is not None:
        score_mod = score_mod.adopt(ctx)
        if checked:
            score_mod.validate(geometry)
    if check_finite:
        for name, x in arrays.items():
            validation.check_finite(ctx, name, x)
        if score_mod is not None:
            score_mod.check_finite(ctx)
    if checked:
        scale = validation.check_scale(ctx, scale, q.shape[-1])
        block_size = validation.check_block_size(block_size, default_block_size)
    else:
        scale = ctx.default_scale(q.shape[-1]) if scale is None else ctx.scalar(scale)
    return Call(
        ctx=ctx,
        arrays=arrays,
        geometry=geometry,
        scale=scale,
        block_size=block_size,
        mask=mask,
        dropout=dropout,
        score_mod=score_mod,
        enable_gqa=enable_gqa,
        empty_rows=empty_rows,
        check_finite=check_finite,
    )
