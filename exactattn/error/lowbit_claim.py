"""The low-bit part of the claim grammar: how a kernel holds ``Q, K, V``, smooths, rotates,
casts ``p`` and accumulates ``p·V``, in ``--claim`` text, parsed into a
:class:`~exactattn.error.lowbit.Scheme` (whose :meth:`~exactattn.error.lowbit.Scheme.quantised`
charges the quantisation to the one :class:`~exactattn.error.bounds.Arith`).

The fields (each ``KEY=VALUE`` of a claim, :data:`exactattn.targets.CLAIM_FIELDS`):

* ``q``, ``k``, ``v`` — ``FORMAT[:GRANULARITY[:SCALE]]``: the element format
  (:data:`FORMATS`: ``e4m3``, ``e5m2``, ``e2m1``, ``int8``, ``int4``, or ``fp16``, a plain
  cast), one scale per group of the granularity (:data:`GRANULARITIES`: ``tensor``, ``head``
  (per batch and head), ``token`` (per row), ``channel`` (per column over all rows),
  ``block<r>`` (``r`` consecutive rows × all columns), ``group<g>`` (``g`` consecutive
  elements of a row)) and the scale's own format (:data:`exactattn.backends.quantize.
  SCALE_FORMATS`: ``fp32``, the default; ``e4m3``, NVFP4's two levels under an fp32 tensor
  scale; ``e8m0``, MX's powers of two). ``nvfp4`` is ``e2m1:group16:e4m3`` and ``mxfp4`` is
  ``e2m1:group32:e8m0``;
* ``smooth`` — ``k`` (``K ↦ K − k̄``, SageAttention's), ``q<r>`` (``Q ↦ Q − q̄`` per block of
  ``r`` rows, the mean added back as SageAttention 2 does), or both joined by ``+``;
* ``rotate`` — ``hadamard`` (FlashAttention-3's incoherent processing) or ``no``;
* ``p`` — the cast of ``p`` before ``p·V`` (:data:`P_CASTS`) and ``p_scale``, its static
  scale ``S`` (``p ↦ fl(p·S)/S``; default 1);
* ``quantiser`` — ``any`` (the default: any quantiser within each group's error; the bound
  charges it) or ``nearest``: the kernel computes each group's scale by its scale format's
  rule (``amax/max_F`` in fp32, MX's ``2^{⌊log₂ amax⌋ − e_max}``, NVFP4's two levels) and
  rounds ``x/s`` to nearest, saturating, so exact attention is taken at the quantised inputs
  themselves and only the kernel's arithmetic after them is bounded
  (:mod:`exactattn.error.nearest_quantiser`); it needs a quantised ``q``, ``k`` or ``v``,
  and with ``rotate=hadamard`` it takes the kernel to rotate by
  :func:`exactattn.error.lowbit.rotation` itself (its signs are part of what is quantised);
* ``pv_acc`` — the ``p·V`` accumulator (:data:`ACCUMULATORS`: ``fp32``, ``fp16``, ``fp22``
  truncating, ``fp22-rn``) and ``pv_chunk``, the terms it sums before each addition into an
  fp32 buffer (two-level accumulation).

An unknown format, granularity, scale format or accumulator, a group or block of rows that
is not a positive integer, is a ValueError that lists the valid values; a group that does
not divide the dimension it groups is said per case (:func:`unsupported`) and by
:meth:`~exactattn.error.lowbit.Operand.hold`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..backends.quantize import SCALE_FORMATS
from .lowbit import MXFP4, NVFP4, Operand, Scheme

FORMATS = ("e4m3", "e5m2", "e2m1", "int8", "int4", "fp16")
NAMED = {"nvfp4": NVFP4, "mxfp4": MXFP4}
GRANULARITIES = ("tensor", "head", "token", "channel", "block<r>", "group<g>")
P_CASTS = ("e4m3", "e5m2", "e2m1", "fp16", "nvfp4")
ACCUMULATORS = ("fp32", "fp16", "fp22", "fp22-rn")
LOWBIT_FIELDS = ("q", "k", "v", "smooth", "rotate", "p_scale", "pv_chunk", "quantiser")
QUANTISERS = ("any", "nearest")
_CAST_NAMES = {"fp16": "float16", "float16": "float16"}


def parse_operand(text: str, name: str) -> Operand:
    """``FORMAT[:GRANULARITY[:SCALE]]`` (module docstring) as an :class:`Operand`."""
    if text in NAMED:
        return NAMED[text]
    number, _, rest = text.partition(":")
    granularity, _, scale = rest.partition(":")
    if number not in FORMATS and number != "float16":
        raise ValueError(
            f"--claim {name}={text!r}: unknown format {number!r}; use one of "
            f"{FORMATS + tuple(NAMED)}"
        )
    if number in ("fp16", "float16"):
        if rest:
            raise ValueError(f"--claim {name}={text!r}: fp16 is a plain cast, it takes no scale")
        return Operand("float16")
    scale = scale or "fp32"
    if scale not in SCALE_FORMATS:
        raise ValueError(
            f"--claim {name}={text!r}: unknown scale format {scale!r}; use one of {SCALE_FORMATS}"
        )
    if scale != "fp32" and number.startswith("int"):
        raise ValueError(
            f"--claim {name}={text!r}: an {scale} scale needs a minifloat (e4m3, e5m2, e2m1); "
            "integer formats take fp32 scales"
        )
    match = re.fullmatch(
        r"(tensor|head|token|channel)|(block|group)([1-9]\d*)", granularity or "tensor"
    )
    if match is None:
        raise ValueError(
            f"--claim {name}={text!r}: unknown granularity {granularity!r}; use one of "
            f"{GRANULARITIES} (r, g: positive integers)"
        )
    if match.group(1):
        return Operand(number, match.group(1), None, scale)
    return Operand(number, match.group(2), int(match.group(3)), scale)


def operand_text(operand: Operand) -> str:
    """The ``FORMAT[:GRANULARITY[:SCALE]]`` text of ``operand`` (:func:`parse_operand`'s
    inverse)."""
    if operand.number == "float16":
        return "fp16"
    granularity = operand.granularity
    if granularity in ("block", "group"):
        granularity += str(operand.block)
    text = f"{operand.number}:{granularity}"
    return text if operand.scale == "fp32" else f"{text}:{operand.scale}"


def parse_smooth(text: str) -> tuple[bool, int | None]:
    """``k``, ``q<r>`` or ``q<r>+k``: (K smoothing, rows per Q smoothing block or None)."""
    smooth_k, smooth_q = False, None
    for item in filter(None, text.split("+")):
        match = re.fullmatch(r"k|q([1-9]\d*)", item)
        if match is None:
            raise ValueError(
                f"--claim smooth={text!r}: unknown item {item!r}; use k, q<r> (r rows per "
                "block) or both joined by + (q128+k)"
            )
        if item == "k":
            smooth_k = True
        else:
            smooth_q = int(match.group(1))
    return smooth_k, smooth_q


def parse_value(key: str, value: str) -> Any:
    """A low-bit claim field's value, checked (module docstring); the stored form is
    canonical text (operands, smoothing, rotation), a float (``p_scale``) or an int
    (``pv_chunk``)."""
    if key in ("q", "k", "v"):
        return operand_text(parse_operand(value, key))
    if key == "smooth":
        smooth_k, smooth_q = parse_smooth(value)
        return "+".join(([f"q{smooth_q}"] if smooth_q else []) + (["k"] if smooth_k else []))
    if key == "rotate":
        if value not in ("hadamard", "no"):
            raise ValueError(f"--claim rotate={value!r}: use hadamard or no")
        return value
    if key == "p_scale":
        try:
            scale = float(value)
        except ValueError:
            scale = math.nan
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"--claim p_scale must be a finite number > 0; got {value!r}")
        return scale
    if key == "quantiser":
        if value not in QUANTISERS:
            raise ValueError(f"--claim quantiser={value!r}: use one of {QUANTISERS}")
        return value
    if key == "pv_chunk":
        if not re.fullmatch(r"[1-9]\d*", value):
            raise ValueError(f"--claim pv_chunk must be an integer >= 1; got {value!r}")
        return int(value)
    raise KeyError(key)


def scheme_of(claim: Any) -> Scheme | None:
    """The :class:`Scheme` of a claim's low-bit fields (``claim``: any object with the
    attributes of :data:`LOWBIT_FIELDS`, ``p`` and ``pv_acc``), or None when it states no
    quantisation, smoothing or rotation (its ``p`` cast and accumulator are then plain
    :class:`~exactattn.error.bounds.Arith` fields)."""
    if not any(getattr(claim, x) not in (None, "no") for x in ("q", "k", "v", "smooth", "rotate")):
        return None
    smooth_k, smooth_q = parse_smooth(claim.smooth or "")
    operands = {
        x: Operand() if getattr(claim, x) is None else parse_operand(getattr(claim, x), x)
        for x in "qkv"
    }
    return Scheme(
        "claim",
        "a --claim",
        **operands,
        rotate=claim.rotate == "hadamard",
        smooth_k=smooth_k,
        smooth_q=smooth_q,
        p_cast=p_cast_name(claim.p),
        p_scale=claim.p_scale or 1.0,
        pv_acc=accumulator_name(claim.pv_acc),
        pv_chunk=claim.pv_chunk,
        quantiser=claim.quantiser or "any",
    )


def p_cast_name(p: str | None) -> str | None:
    """A claim's ``p`` as :class:`Scheme`'s ``p_cast`` (None: no low-bit cast)."""
    return _CAST_NAMES.get(p, p) if p in (*P_CASTS, "float16") else None


def accumulator_name(pv_acc: str | None) -> str:
    """A claim's ``pv_acc`` as :class:`Scheme`'s (``float16`` → ``fp16``; None: ``fp32``)."""
    return {"float32": "fp32", "float16": "fp16", None: "fp32"}.get(pv_acc, pv_acc)


def claim_text(scheme: Scheme) -> str:
    """The ``--claim`` text of ``scheme``'s arithmetic (fp32 storage, scores, statistics and
    accumulators; its reverse key order is the kernel's, not a claim)."""
    parts = ["input=fp32", "scores=fp32", "stats=fp32", "acc=fp32"]
    parts += [f"{x}={operand_text(getattr(scheme, x))}" for x in "qkv" if getattr(scheme, x).number]
    smooth = ([f"q{scheme.smooth_q}"] if scheme.smooth_q else []) + (
        ["k"] if scheme.smooth_k else []
    )
    if smooth:
        parts.append(f"smooth={'+'.join(smooth)}")
    if scheme.rotate:
        parts.append("rotate=hadamard")
    if scheme.p_cast:
        parts.append(f"p={'fp16' if scheme.p_cast == 'float16' else scheme.p_cast}")
    if scheme.p_scale != 1:
        parts.append(f"p_scale={scheme.p_scale:g}")
    if scheme.pv_acc != "fp32":
        parts.append(f"pv_acc={scheme.pv_acc}")
    if scheme.pv_chunk is not None:
        parts.append(f"pv_chunk={scheme.pv_chunk}")
    if scheme.exactly_quantised:
        parts.append("quantiser=nearest")
    return ",".join(parts)


def unsupported(scheme: Scheme, d: int, dv: int) -> str | None:
    """Why a kernel of ``scheme`` cannot take head dims ``d`` (q, k) and ``dv`` (v): a group
    that does not divide the dimension it groups; None when it can."""
    for name, dim in (("q", d), ("k", d), ("v", dv)):
        op = getattr(scheme, name)
        if op.granularity == "group" and op.block and dim % op.block:
            return f"{name}={operand_text(op)}: a group of {op.block} does not divide {dim}"
    return None
