"""Low-bit number systems as emulated formats: saturating minifloats, scaled quantisation,
and a low-precision matmul whose accumulator is a knob.

**Minifloats** (:data:`MINIFLOATS`). ``F(p, e_min, e_max)`` as in
:mod:`exactattn.backends.emulated_backend` (``p`` significand bits, gradual underflow),
rounded to nearest-even by :func:`~exactattn.backends.emulated_backend.round_to_format` and
then *saturated* at the largest finite value: e4m3fn (OCP FP8, ``p = 4``, ``e_min = −6``,
largest 448 — the code ``S.1111.111`` is NaN, so there is no infinity and 480 is not a
number), e5m2 (``p = 3``, ``e_min = −14``, largest 57344) and e2m1 (OCP MX FP4, ``p = 2``,
``e_min = 0``, the numbers ``0, ½, 1, 1½, 2, 3, 4, 6``). A scaled quantisation never
overflows (the scale maps ``amax`` to the largest value), so saturation is what a kernel's
``cvt.satfinite`` does with the rest; IEEE overflow to ``±∞`` is wrong for e4m3fn and e2m1.

**Scaled quantisation** (:func:`quantize`): ``x ≈ s·fl(x/s)`` with one scale per group of
elements, ``s = amax_group|x| / max_F`` (``max_F``: 448, 6, 127 for INT8, 7 for INT4), and
``s = 1`` for a group whose ``amax`` is 0 (its values are 0 and stay 0). Granularities
(:data:`GRANULARITIES`, over an array ``(*batch, n, d)``): ``tensor`` (one scale;
FlashAttention-3 §4.3's baseline FP8), ``head`` (one per ``(batch, head)``: FA3's descale
factors), ``block`` (``block`` consecutive rows (tokens) × all of ``d``: FA3's block
quantisation, SageAttention's per-block scales), ``token`` (one per row), ``channel`` (one
per column over all rows: SageAttention 2's per-channel ``V``) and ``group`` (``block``
consecutive elements along ``d``: NVFP4's 16, MX's 32). Integers are symmetric,
``q = clip(round(x/s), −(2^{k−1} − 1), 2^{k−1} − 1)``, ties to even.

Error model (what :class:`Quantized` reports for :mod:`exactattn.error.bounds`): a minifloat
entry errs by ``|x̂ − x| ≤ u·|x| + s·μ`` (``u = 2^{−p}``, ``μ = 2^{e_min − p}``: half the
subnormal spacing, scaled); an integer entry by ``s/2``. The relative part is charged
``u + 2^{−51}`` (``x/s`` and ``s·q`` are float64 operations); the absolute part is the
largest over the groups (:attr:`Quantized.abs_error`).

**Two-level scales.** NVFP4 (NVIDIA Blackwell; SageAttention 3, arXiv:2505.11594 §3.1):
e2m1 values, an e4m3 scale per 16 elements, an fp32 scale per tensor,
``s_t = amax_tensor / (6·448)``, ``s_b = fl_e4m3(amax_b / (6·s_t))``. The block scale's
rounding may push ``x/(s_b s_t)`` up to ``6(1 + 2^{−4})``: saturated to 6, an error below
``2^{−4}`` relative, within e2m1's ``u = 2^{−2}``; a block scale that underflows to 0
zeroes the block (error ``≤ amax_b``, charged). MXFP4 (OCP Microscaling Formats v1.0 §5.3,
§6.3): e2m1 values and an e8m0 (power of two) scale per 32, ``X = 2^{⌊log₂ amax⌋ − 2}``
(2 = e2m1's largest exponent); ``x/X < 8`` saturates at 6, an error below ``2/8 = u``.

**The accumulator** (:func:`accumulate`): ``A·B`` with products exact (operands of at most
8 significand bits: their products fit float64) and summed left to right in an
accumulator format, ``acc = fl_A(acc + a_r b_r)``; with ``chunk``, every ``chunk`` terms
the accumulator is added into an fp32 buffer and restarted (SageAttention 2's two-level
accumulation, arXiv:2411.10958 §4.4). :data:`ACCUMULATORS`: ``fp32``, ``fp16`` and
``fp22`` — 1 sign, 8 exponent and 13 mantissa bits (``p = 14``), the accumulator
SageAttention 2 (§4.4) measured in Hopper's ``mma.f32.f8.f8.f32``, and DeepSeek-V3's
technical report (arXiv:2412.19437 §3.3.2: "limited to retaining around 14 bits") on the
H800's FP8 GEMM. Neither states the rounding; ``fp22`` truncates (toward zero), the
pessimistic reading, and ``fp22-rn`` rounds to nearest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .emulated_backend import EmulatedFormat, round_to_format


@dataclass(frozen=True)
class MiniFloat:
    """A saturating binary format: ``p`` significand bits, exponents ``e_min..e_max``."""

    name: str
    p: int
    e_min: int
    e_max: int
    largest: float

    @property
    def u(self) -> float:
        return 2.0**-self.p

    @property
    def mu(self) -> float:
        """Half the subnormal spacing ``2^{e_min − p}``: the absolute error near 0."""
        return 2.0 ** (self.e_min - self.p)

    @property
    def emulated(self) -> EmulatedFormat:
        return EmulatedFormat.of(self.p, (self.e_min, self.e_max), "nearest")


MINIFLOATS = {
    f.name: f
    for f in (
        MiniFloat("e4m3", 4, -6, 8, 448.0),
        MiniFloat("e5m2", 3, -14, 15, 57344.0),
        MiniFloat("e2m1", 2, 0, 2, 6.0),
    )
}
INTEGERS = {"int8": 127, "int4": 7}  # symmetric ranges ±(2^{k−1} − 1)
GRANULARITIES = ("tensor", "head", "block", "token", "channel", "group")
ACCUMULATORS = {
    "fp32": EmulatedFormat.of(24, 8, "nearest"),
    "fp16": EmulatedFormat.of(11, 5, "nearest"),
    "fp22": EmulatedFormat.of(14, 8, "toward_zero"),
    "fp22-rn": EmulatedFormat.of(14, 8, "nearest"),
}
_FP32 = ACCUMULATORS["fp32"]
_FLOAT64_REL = 2.0**-51  # x/s and s·q in float64: two roundings of 2^-53


def round_minifloat(x: Any, fmt: str | MiniFloat) -> np.ndarray:
    """``fl(x)`` in the saturating minifloat ``fmt`` (float64 in and out; NaN stays NaN)."""
    f = MINIFLOATS[fmt] if isinstance(fmt, str) else fmt
    r = round_to_format(np.asarray(x, dtype=np.float64), f.emulated)
    return np.clip(r, -f.largest, f.largest)


def round_integer(x: Any, bits: str) -> np.ndarray:
    """``clip(round(x), ±(2^{k−1} − 1))`` for ``int8``/``int4``, ties to even."""
    top = INTEGERS[bits]
    return np.clip(np.round(np.asarray(x, dtype=np.float64)), -top, top)


def e8m0(x: Any) -> np.ndarray:
    """The e8m0 (power of two) at or below ``x > 0``: ``2^{⌊log₂ x⌋}`` in ``2^{−127..127}``
    (OCP MX v1.0 §5.4: 8 exponent bits, no sign, no mantissa); 1 where ``x`` is 0."""
    x = np.asarray(x, dtype=np.float64)
    _, e = np.frexp(np.where(x > 0, x, 1.0))  # x = f·2^e, f ∈ [½, 1): ⌊log₂ x⌋ = e − 1
    return np.exp2(np.clip(e - 1, -127, 127).astype(np.float64))


def largest(number: str) -> float:
    """The largest magnitude of a minifloat or integer format."""
    if number in MINIFLOATS:
        return MINIFLOATS[number].largest
    if number in INTEGERS:
        return float(INTEGERS[number])
    raise ValueError(f"number must be one of {sorted({**MINIFLOATS, **INTEGERS})}; got {number!r}")


def group_amax(x: np.ndarray, granularity: str, block: int | None = None) -> np.ndarray:
    """``max |x|`` over each group of ``granularity``, broadcastable against ``x``
    (``block``: rows per block, or elements per group along the last axis)."""
    a = np.abs(np.asarray(x, dtype=np.float64))
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}; got {granularity!r}")
    if a.ndim < 2:
        raise ValueError(f"x needs at least 2 dims (n, d); got shape {a.shape}")
    if granularity in ("block", "group") and (
        isinstance(block, bool) or not isinstance(block, int) or block < 1
    ):
        raise ValueError(
            f"block must be an int >= 1 for granularity {granularity!r}; got {block!r}"
        )
    n, d = a.shape[-2:]
    if granularity == "tensor":
        return np.full((1,) * a.ndim, a.max(initial=0.0))
    if granularity == "head":
        return a.max(axis=(-2, -1), keepdims=True, initial=0.0)
    if granularity == "token":
        return a.max(axis=-1, keepdims=True, initial=0.0)
    if granularity == "channel":
        return a.max(axis=-2, keepdims=True, initial=0.0)
    if granularity == "block":
        blocks = -(-n // block)
        padded = np.zeros((*a.shape[:-2], blocks * block, d))
        padded[..., :n, :] = a
        top = padded.reshape(*a.shape[:-2], blocks, block * d).max(axis=-1, initial=0.0)
        return np.repeat(top, block, axis=-1)[..., :n, None]
    if d % block:
        valid = [g for g in range(1, d + 1) if d % g == 0]
        raise ValueError(
            f"a group of {block} elements does not divide the last dim {d}; "
            f"groups that divide it: {valid}"
        )
    top = a.reshape(*a.shape[:-1], d // block, block).max(axis=-1, initial=0.0)
    return np.repeat(top, block, axis=-1)


@dataclass(frozen=True)
class Quantized:
    """``values = s·fl(x/s)`` (float64) and its error model ``|x̂ − x| ≤ rel·|x| + abs``."""

    values: np.ndarray
    scale: np.ndarray
    rel: float  # relative part (0 for integers)
    abs_error: float  # absolute part, the largest over the groups
    p: int  # significand bits of the element format (53 for integers: no relative error)
    abs_each: np.ndarray | None = None  # each entry's own group's absolute part (≤ abs_error)


SCALE_FORMATS = ("fp32", "e4m3", "e8m0")  # the format a group's scale is held in


def quantize(
    x: Any,
    number: str,
    granularity: str = "tensor",
    block: int | None = None,
    scale_format: str = "fp32",
) -> Quantized:
    """``x ≈ s·fl(x/s)`` with one scale per group (module docstring); ``number`` is
    ``e4m3``, ``e5m2``, ``e2m1``, ``int8`` or ``int4``; ``scale_format`` the scale's own
    format: ``fp32`` (``s = amax/max_F``, held exactly), ``e4m3`` (two-level, NVFP4's:
    :func:`_two_level`) or ``e8m0`` (a power of two, MX's: :func:`_power_of_two`)."""
    if scale_format not in SCALE_FORMATS:
        raise ValueError(f"scale_format must be one of {SCALE_FORMATS}; got {scale_format!r}")
    if scale_format != "fp32" and number not in MINIFLOATS:
        raise ValueError(
            f"an {scale_format} scale takes a minifloat element format {sorted(MINIFLOATS)}; "
            f"got {number!r} (integer formats take fp32 scales)"
        )
    x = np.asarray(x, dtype=np.float64)
    top = largest(number)
    amax = group_amax(x, granularity, block)
    if scale_format == "e4m3":
        return _two_level(x, MINIFLOATS[number], amax)
    if scale_format == "e8m0":
        return _power_of_two(x, MINIFLOATS[number], amax)
    scale = np.where(amax > 0, amax / top, 1.0)
    each = np.broadcast_to(scale, x.shape)
    if number in INTEGERS:
        values = scale * round_integer(x / scale, number)
        return Quantized(values, scale, _FLOAT64_REL, float(scale.max(initial=0) / 2), 53, each / 2)
    f = MINIFLOATS[number]
    values = scale * round_minifloat(x / scale, f)
    return Quantized(
        values, scale, f.u + _FLOAT64_REL, float(scale.max(initial=0)) * f.mu, f.p, each * f.mu
    )


def _saturation(x: np.ndarray, f: MiniFloat, scale: np.ndarray) -> float:
    """The largest relative error of saturating ``x/s`` at ``max_F`` (0 where ``|x| ≤ s·max_F``):
    ``1 − s·max_F/|x|``, measured (a rounded scale may leave ``x/s`` beyond ``max_F``)."""
    a = np.abs(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        lost = np.where(a > scale * f.largest, 1 - scale * f.largest / a, 0.0)
    return float(lost.max(initial=0.0))


def _two_level(x: np.ndarray, f: MiniFloat, amax: np.ndarray) -> Quantized:
    """NVFP4's scales for any minifloat ``F``: an fp32 tensor scale ``s_t = amax_tensor /
    (max_F·448)`` and an e4m3 scale per group ``s_b = fl_e4m3(amax_b / (max_F·s_t))``. A
    group scale rounded down leaves ``x/(s_b s_t)`` above ``max_F``: saturated, a relative
    error charged as measured (:func:`_saturation`; below ``2^{−4}/(1 + 2^{−4})`` for a
    normal ``s_b``); a group scale that underflows to 0 zeroes the group (error ``≤
    amax_b``, charged as absolute)."""
    amax_t = float(np.abs(x).max(initial=0.0))
    s_t = float(np.float32(amax_t / (f.largest * 448))) if amax_t > 0 else 1.0
    scale = round_minifloat(amax / (f.largest * s_t), "e4m3") * s_t
    zeroed = scale == 0
    safe = np.where(zeroed, 1.0, scale)
    values = np.where(zeroed, 0.0, safe * round_minifloat(x / safe, f))
    lost = np.broadcast_to(np.where(zeroed, amax, 0.0), x.shape)
    each = np.maximum(np.broadcast_to(scale, x.shape) * f.mu, lost)
    rel = max(f.u, _saturation(x, f, safe)) + _FLOAT64_REL
    return Quantized(values, scale, rel, float(each.max(initial=0.0)), f.p, each)


def _power_of_two(x: np.ndarray, f: MiniFloat, amax: np.ndarray) -> Quantized:
    """MX's scale for any minifloat ``F`` (OCP MX v1.0 §6.3): the e8m0 ``X =
    2^{⌊log₂ amax⌋ − e_max(F)}`` per group; ``x/X < 2^{e_max + 1}`` may pass ``max_F`` and
    saturates (e2m1: below ``1 − 6/8 = u``; e4m3: ``1 − 448/512``), charged as measured."""
    scale = np.where(amax > 0, e8m0(amax) * 2.0**-f.e_max, 1.0)
    values = scale * round_minifloat(x / scale, f)
    each = np.broadcast_to(scale, x.shape) * f.mu
    rel = max(f.u, _saturation(x, f, scale)) + _FLOAT64_REL
    return Quantized(values, scale, rel, float(each.max(initial=0.0)), f.p, each)


def quantize_per_tensor(x: Any, number: str) -> np.ndarray:
    """``s·fl(x/s)`` with ``s = amax|x| / max_F`` (FlashAttention-3 §4.3's baseline FP8)."""
    return quantize(x, number, "tensor").values


def tensor_scale(x: Any, number: str) -> float:
    """The per-tensor scale ``s = amax|x| / max_F`` (1 for an all-zero tensor)."""
    return float(group_amax(np.asarray(x), "tensor").max()) / largest(number) or 1.0


def nvfp4(x: Any) -> Quantized:
    """NVFP4: e2m1 values, an e4m3 scale per 16 elements of the last axis, an fp32 tensor
    scale (module docstring)."""
    return quantize(x, "e2m1", "group", 16, "e4m3")


def mxfp4(x: Any) -> Quantized:
    """MXFP4 (OCP MX v1.0): e2m1 values and an e8m0 scale ``2^{⌊log₂ amax⌋ − 2}`` per 32."""
    return quantize(x, "e2m1", "group", 32, "e8m0")


def accumulate(a: Any, b: Any, accumulator: str = "fp32", chunk: int | None = None) -> np.ndarray:
    """``a @ b`` with exact products summed left to right in ``accumulator``; with
    ``chunk``, each ``chunk`` terms' sum is added into an fp32 buffer (two-level).
    float64 in and out; operands of ``(..., r, n)`` and ``(..., n, c)``."""
    if accumulator not in ACCUMULATORS:
        raise ValueError(f"accumulator must be one of {sorted(ACCUMULATORS)}; got {accumulator!r}")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"chunk must be an int >= 1 or None; got {chunk!r}")
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    fmt = ACCUMULATORS[accumulator]
    shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
    acc, buffer = np.zeros(shape), np.zeros(shape)
    n = a.shape[-1]
    for r in range(n):
        acc = round_to_format(acc + a[..., :, r : r + 1] * b[..., r : r + 1, :], fmt)
        if chunk is not None and ((r + 1) % chunk == 0 or r == n - 1):
            buffer = round_to_format(buffer + acc, _FP32)
            acc = np.zeros(shape)
    return buffer if chunk is not None else acc


def hadamard(d: int) -> np.ndarray:
    """The orthogonal Hadamard matrix ``H_d / √d`` (Sylvester; ``d`` a power of two)."""
    if isinstance(d, bool) or not isinstance(d, int) or d < 1 or d & (d - 1):
        raise ValueError(f"d must be a power of two for the Hadamard rotation; got {d!r}")
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(d)
