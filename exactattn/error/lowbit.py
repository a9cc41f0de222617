"""Low-bit attention schemes as precision policies over the one tiled algorithm.

A scheme's ``quantiser`` is ``any`` (any quantisation within each group's error: charged
to the bound as an error of the inputs) or ``nearest``: the rule is stated (scales by the
scale format's rule, ``x/s`` to nearest), so the quantised inputs are known
(:meth:`Scheme.reference_inputs`, :mod:`exactattn.error.nearest_quantiser`) and exact
attention is taken there; the built-in schemes that quantise state theirs.

A :class:`Scheme` says how a kernel holds ``Q, K, V`` (quantisation of each, by
:mod:`exactattn.backends.quantize`), which exact transformations it applies first, and the context
(:class:`~exactattn.backends.lowbit_backend.LowbitContext`) the tiled algorithm of
:mod:`exactattn.core.algorithm` runs in: the cast of ``p`` with its static scale, the ``p·V``
accumulator, the online-softmax order. Nothing here iterates over blocks.

**Exact transformations** (the exact answer does not change; only their float64 rounding
is charged to the bound, :meth:`Scheme.arith`):

* *incoherent processing* (FlashAttention-3, Shah et al. 2024, arXiv:2407.08608 §3.3):
  ``Q ↦ QM``, ``K ↦ KM`` with ``M = diag(±1)·H_d/√d`` orthogonal, so ``QMMᵀKᵀ = QKᵀ``;
  it spreads outliers over the head dim before quantisation (a head dim that is not a
  power of two: blocks of Hadamards, :func:`rotation`). Charged: each entry of ``fl(xM)`` is
  within ``h·2^{−53}·‖x_i‖₁/√h`` of ``xM``, ``h`` the blocks' size (Higham §3.1);
* *K smoothing* (SageAttention, Zhang et al. 2024, arXiv:2410.02367 §4.2): ``K ↦ K −
  mean_j K_j``: every score of row ``i`` moves by the same ``q_i·k̄``, and softmax is
  invariant to a row's shift. Charged: the subtraction's ``2^{−53}`` relative;
* *Q smoothing* (SageAttention 2, Zhang et al. 2024, arXiv:2411.10958 §3.2): ``Q ↦ Q −
  q̄_blk`` per block of rows before quantisation; the kernel adds ``q̄_blk·K̂ᵀ`` back (an
  fp32 bias). Here the mean is added back to the dequantised rows in float64 before the
  fp32 product (the same quantisation; the fp32 rounding of the bias is folded into the
  product's). Charged: the two float64 operations;
* *reverse key order* (arXiv:2606.06521 §4): keys and values in reverse order — attention
  without a mask is invariant to a permutation of the keys; the tiled loop then meets the
  sink (key 0) last.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..backends import quantize as qz
from ..backends.formats import Format, get_format
from .bounds import Arith, Entrywise

FLOAT64_U = 2.0**-53
FP16 = ("float16", 2.0**-11, 2.0**-25)  # name, u, μ


@dataclass(frozen=True)
class Operand:
    """How one input is held: ``number`` (``e4m3``, ``e5m2``, ``e2m1``, ``int8``, ``int4``,
    ``float16``: a plain cast, or None: as given) with one scale per group of
    ``granularity`` (``block``: its rows, or a ``group``'s elements along the last axis),
    the scale held in ``scale`` (``fp32``, ``e4m3``: NVFP4's two levels, ``e8m0``: MX's
    powers of two; :func:`exactattn.backends.quantize.quantize`)."""

    number: str | None = None
    granularity: str = "tensor"
    block: int | None = None
    scale: str = "fp32"

    def hold(self, x: np.ndarray, name: str = "x") -> tuple[np.ndarray, float, np.ndarray]:
        """``(x̂, rel, abs)`` with ``|x̂ − x| ≤ rel·|x| + abs`` entrywise (``abs`` shaped like
        ``x``: each entry its own group's); a group that does not divide the last axis is a
        ValueError naming ``name``."""
        if self.number is None:
            return x, 0.0, np.zeros(x.shape)
        if self.number == "float16":
            return x.astype(np.float16).astype(np.float64), FP16[1], np.full(x.shape, FP16[2])
        if self.granularity == "group" and self.block and x.shape[-1] % self.block:
            valid = [g for g in range(1, x.shape[-1] + 1) if x.shape[-1] % g == 0]
            raise ValueError(
                f"{name}: a group of {self.block} does not divide its last dim "
                f"{x.shape[-1]}; groups that divide it: {valid}"
            )
        got = qz.quantize(x, self.number, self.granularity, self.block, self.scale)
        return got.values, got.rel, np.broadcast_to(got.abs_each, x.shape)


@dataclass(frozen=True)
class Scheme:
    """A low-bit attention kernel's precision policy (module docstring); ``source`` cites
    the paper and section it follows."""

    name: str
    source: str
    q: Operand = field(default_factory=Operand)
    k: Operand = field(default_factory=Operand)
    v: Operand = field(default_factory=Operand)
    rotate: bool = False
    smooth_k: bool = False
    smooth_q: int | None = None  # rows per block whose mean is taken out of Q
    p_cast: str | None = None  # e4m3, e2m1-free: nvfp4, float16
    p_scale: float = 1.0
    pv_acc: str = "fp32"
    pv_chunk: int | None = None
    reverse: bool = False
    running_max: bool = True
    quantiser: str = "any"  # or "nearest": the rule of exactattn.error.nearest_quantiser

    def ctx(self) -> Any:
        from ..backends.lowbit_backend import LowbitContext

        return LowbitContext(
            self.p_cast, self.p_scale, self.pv_acc, self.pv_chunk, self.running_max
        )

    # --- inputs ---------------------------------------------------------------------------
    def exact(self, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float, float]:
        """The transformed float64 inputs (same exact attention) and the ``(rel, abs)``
        their float64 rounding may add to each entry; reverse key order reverses an
        ``allowed`` set given with them too."""
        q, k, v = (np.asarray(inputs[x], dtype=np.float64) for x in "qkv")
        rel, abs_ = 0.0, 0.0
        if self.rotate:
            m = rotation(q.shape[-1])
            for x in (q, k):
                abs_ = max(abs_, _rotation_error(x))
            q, k = q @ m, k @ m
        if self.smooth_k:
            k = k - k.mean(axis=-2, keepdims=True)
            rel += FLOAT64_U
        out = {**inputs}
        if self.reverse:  # and the allowed set, when given (``allowed``: (*B, n_q, n_k))
            k, v = k[..., ::-1, :].copy(), v[..., ::-1, :].copy()
            if inputs.get("allowed") is not None:
                out["allowed"] = np.asarray(inputs["allowed"])[..., ::-1]
        return {**out, "q": q, "k": k, "v": v}, rel, abs_

    def hold(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        """The inputs as the kernel holds them (dequantised, float64), with the error model
        ``|x̂ − x| ≤ rel·|x| + abs`` over ``q, k, v`` against :meth:`exact`'s inputs: per
        operand and entry (``rels``, ``each``: each entry its own group's) and the largest
        of them (``rel``, ``abs``)."""
        exact, rel_t, abs_t = self.exact(inputs)
        held, rels, each = dict(exact), {}, {}
        for name, operand in (("q", self.q), ("k", self.k), ("v", self.v)):
            x = exact[name]
            mean = None
            if name == "q" and self.smooth_q:
                mean = _block_mean(x, self.smooth_q)
                x = x - mean
            values, rel, abs_ = operand.hold(x, name)
            if mean is not None:
                values = values + mean
                rel, abs_ = _smoothed(rel, abs_, np.abs(mean))
            held[name] = values
            rels[name] = rel + rel_t
            each[name] = abs_ + abs_t
        return {
            "inputs": held,
            "exact": exact,
            "rels": rels,
            "each": each,
            "rel": max(rels.values()),
            "abs": max(float(a.max(initial=0.0)) for a in each.values()),
        }

    # --- the bound --------------------------------------------------------------------------
    def arith(self, block: int | None, inputs: dict[str, np.ndarray]) -> Arith:
        """The arithmetic :func:`exactattn.error.bounds.bounds` assumes, for the inputs of
        :meth:`exact` (``inputs`` as given, before the transformations) with
        ``input_rounding``: fp32 storage and compute (NumPy's float32 SIMD exp: ``funcs =
        4``), the quantisation as ``quant_rel``/``quant_abs`` (:meth:`quantised`), ``p``'s
        cast as a format whose ``μ`` is the scaled cast's (``μ_F/S``), the ``p·V``
        accumulator and its chunk."""
        fp32 = get_format("float32")
        base = Arith(
            input=fp32,
            compute=fp32,
            acc=fp32,
            output=fp32,
            block=block,
            funcs=4.0,
            p=p_format(self.p_cast, self.p_scale),
            pv_acc=None if self.pv_acc == "fp32" else ACC_FORMATS[self.pv_acc],  # fp32: acc
            pv_chunk=self.pv_chunk,
        )
        return self.quantised(base, inputs)

    def quantised(self, base: Arith, inputs: dict[str, np.ndarray]) -> Arith:
        """``base`` with this scheme's quantisation of ``inputs`` (as given) charged: the
        error model of :meth:`hold` per operand and entry (``quant_each``,
        :class:`~exactattn.error.bounds.Entrywise`) and its largest (``quant_rel``,
        ``quant_abs``), widened for a kernel that works in ``base``'s compute format
        (``u``) rather than float64: ``x/s``, the scale and ``s·x̂`` of a quantised operand
        rounded (``(1 + rel)(1 + u)³ − 1``, ``abs·(1 + u)²``); K's mean computed in it (a
        shift by up to ``(n_k + 1)·u·max|k|`` that the bound, taken on the float64-smoothed
        keys, sees as error) and the subtraction (``u``); Q's subtraction and mean added back
        (``3u·max|q|``); the rotation's sums (``(h + 2)·u·‖x_i‖₁/√h``,
        :func:`_rotation_error` at ``u``). A scheme that states its quantiser
        (:attr:`exactly_quantised`) is charged instead what separates a kernel's held inputs
        from :meth:`reference_inputs` (:meth:`_nearest`): the bound is then taken there."""
        held_by = {x: getattr(self, x).number is not None for x in "qkv"}  # quantised or cast
        if not any(held_by.values()) and not (self.rotate or self.smooth_k or self.smooth_q):
            return base  # the inputs as given: nothing to charge
        if self.exactly_quantised:
            _, rels, each = self._nearest(inputs, base.compute.u)
            return replace(
                base,
                quant_rel=max(rels.values()),
                quant_abs=max(float(a.max(initial=0.0)) for a in each.values()),
                quant_each=Entrywise(rels, each),
            )
        held = self.hold(inputs)
        u = base.compute.u
        q, k = (np.abs(np.asarray(inputs[x], dtype=np.float64)) for x in "qk")
        extra_rel = {"q": 0.0, "k": u if self.smooth_k else 0.0, "v": 0.0}
        extra_abs = {"q": 0.0, "k": 0.0, "v": 0.0}
        if self.rotate:
            for name, x in (("q", q), ("k", k)):
                extra_abs[name] += _rotation_error(x, u)
        if self.smooth_k:
            extra_abs["k"] += (k.shape[-2] + 1) * u * float(k.max(initial=0.0)) * 1.01
        if self.smooth_q:
            extra_abs["q"] += 3 * u * float(q.max(initial=0.0)) * 1.01
        rels = {
            x: ((1 + r) * (1 + u) ** 3 - 1 if held_by[x] else r) + extra_rel[x]
            for x, r in held["rels"].items()
        }
        each = {
            x: (a * (1 + u) ** 2 if held_by[x] else a) + extra_abs[x]
            for x, a in held["each"].items()
        }
        return replace(
            base,
            quant_rel=max(rels.values()),
            quant_abs=max(float(a.max(initial=0.0)) for a in each.values()),
            quant_each=Entrywise(rels, each),
        )

    # --- the exact quantiser (quantiser="nearest") ------------------------------------------
    @property
    def exactly_quantised(self) -> bool:
        """Whether this scheme states its quantiser (``nearest``) and quantises an input."""
        return self.quantiser == "nearest" and any(getattr(self, x).number for x in "qkv")

    def reference_inputs(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """The inputs exact attention is taken at when the quantiser is stated: ``x̃`` of
        :mod:`exactattn.error.nearest_quantiser` for ``q, k, v`` (after the exact
        transformations, keys in the case's order), the other entries of ``inputs`` as
        given; None when it is not (the quantisation is then an error to bound)."""
        if not self.exactly_quantised:
            return None
        values, _, _ = self._nearest(inputs, 2.0**-24)
        return {**inputs, **values}

    def _nearest(
        self, inputs: dict[str, np.ndarray], u: float
    ) -> tuple[dict[str, np.ndarray], dict[str, float], dict[str, np.ndarray]]:
        """:meth:`_quantise_nearest`, once per scheme, ``u`` and inputs: a check reads it for
        the reference, the bound's inputs, its arithmetic and the expected error of one case
        (the arrays come back read-only)."""
        key = (self, u, *(_digest(inputs[x]) for x in "qkv"))
        if key not in _NEAREST_SEEN:
            values, rels, each = self._quantise_nearest(inputs, u)
            for a in (*values.values(), *each.values()):
                a.setflags(write=False)
            _NEAREST_SEEN[key] = values, rels, each
            while len(_NEAREST_SEEN) > NEAREST_KEPT:
                del _NEAREST_SEEN[next(iter(_NEAREST_SEEN))]  # the oldest
        values, rels, each = _NEAREST_SEEN[key]
        return dict(values), dict(rels), dict(each)

    def _quantise_nearest(
        self, inputs: dict[str, np.ndarray], u: float
    ) -> tuple[dict[str, np.ndarray], dict[str, float], dict[str, np.ndarray]]:
        """``x̃`` per input and its error model against a kernel of unit roundoff ``u``
        (:func:`exactattn.error.nearest_quantiser.hold`): the pre-quantisation values are
        :meth:`exact`'s (float64); the kernel's own are within ``near`` of them: the
        rotation in ``u`` and in float64 (:func:`_rotation_error`), K's mean in ``u`` and the
        subtraction (``(n_k + 3)·u·r``, float64's too), Q's block mean and its subtraction
        (``3u·r``), which the kernel adds back, so Q's values are off by it too, and
        ``x̃ = fl(q̃ + q̄)`` by float64's ``u`` (``r``: the largest entry before smoothing,
        rotated where the scheme rotates). Keys and values come back in the case's order
        (quantised in the kernel's, reversed or not)."""
        from . import nearest_quantiser

        exact, _, rotation_64 = self.exact(inputs)
        values, rels, each = {}, {}, {}
        for name, operand in (("q", self.q), ("k", self.k), ("v", self.v)):
            x, original = exact[name], np.asarray(inputs[name], dtype=np.float64)
            near = 0.0
            if self.rotate and name in "qk":
                near += _rotation_error(np.abs(original), u) + rotation_64
                original = original @ rotation(original.shape[-1])
            top = float(np.abs(original).max(initial=0.0)) + near  # every entry before smoothing
            if self.smooth_k and name == "k":
                near += ((x.shape[-2] + 3) * (u + FLOAT64_U) * 1.01 + 2 * u) * top
            mean, shift = None, 0.0
            if self.smooth_q and name == "q":
                mean = _block_mean(x, self.smooth_q)
                shift = 3 * (u + FLOAT64_U) * top * 1.01
                near += shift
                x = x - mean
            got = nearest_quantiser.hold(
                operand.number, operand.granularity, operand.block, operand.scale, x, near, u
            )
            values[name], rels[name], each[name] = got.values, got.rel, got.each
            if mean is not None:
                values[name] = got.values + mean
                rels[name] = got.rel + FLOAT64_U
                each[name] = got.each + shift * (1 + got.rel)
        if self.reverse:  # quantised in the kernel's key order, read in the case's
            for got in (values, each):
                got.update({x: got[x][..., ::-1, :].copy() for x in "kv"})
        return values, rels, each

    @property
    def ulp_format(self) -> str:
        """The format errors are counted in ulps of: the coarsest of the inputs'."""
        numbers = [o.number for o in (self.q, self.k, self.v) if o.number]
        if any(n in ("e2m1", "int4") for n in numbers):
            return "e2m1"
        if any(n in ("e4m3", "int8") for n in numbers):
            return "e4m3"
        if "e5m2" in numbers:
            return "e5m2"
        return "float16" if numbers else "float32"


NEAREST_KEPT = 8  # the last cases' x̃ and error models kept (Scheme._nearest)
_NEAREST_SEEN: dict[tuple, tuple] = {}


def _digest(x: Any) -> tuple:
    """An array's identity by value: its shape, dtype and a hash of its bytes."""
    a = np.ascontiguousarray(x)
    return a.shape, a.dtype.str, hashlib.blake2b(a.tobytes(), digest_size=16).digest()


# the accumulators as formats of the bound (truncation: one bit fewer, to nearest)
ACC_FORMATS = {
    "fp32": get_format("float32"),
    "fp16": get_format("float16"),
    "fp22": Format("fp22-rz", 13, -126),
    "fp22-rn": Format("fp22", 14, -126),
}


def p_format(p_cast: str | None, scale: float = 1.0) -> Format | None:
    """``p ↦ fl_F(p·S)/S`` as a format: ``F``'s bits, ``μ_F`` divided by ``2^{⌊log₂ S⌋}``
    (at least ``μ_F/S``). NVFP4 ``p`` (values ≤ 1, an e4m3 scale per 16 keys of at most
    ``(1/6)(1 + 2^{−4})``): e2m1's ``u`` and ``μ ≥ 0.25·(17/96)``."""
    if p_cast is None:
        return None
    if p_cast == "float16":
        return get_format("float16")
    if p_cast == "nvfp4":
        return Format("nvfp4-p", 2, -2)  # μ = 2^{−4} ≥ 0.0443
    f = qz.MINIFLOATS[p_cast]
    return Format(f"{p_cast}/S", f.p, f.e_min - math.floor(math.log2(scale)))


def rotation(d: int) -> np.ndarray:
    """FlashAttention-3's random orthogonal ``M = diag(±1)·H`` (signs fixed per ``d``), ``H``
    the orthogonal Hadamard matrix ``H_d/√d`` for ``d`` a power of two, else block-diagonal
    with blocks ``H_h/√h``, ``h`` the largest power of two dividing ``d`` (80 = 5·16: five
    blocks of 16), still orthogonal, so ``QMMᵀKᵀ = QKᵀ`` for every head dim."""
    rng = np.random.default_rng([zlib.crc32(b"incoherent"), d])
    h = d & -d  # the largest power of two dividing d
    return rng.choice([-1.0, 1.0], size=d)[:, None] * np.kron(np.eye(d // h), qz.hadamard(h))


def _rotation_error(x: np.ndarray, u: float = FLOAT64_U) -> float:
    """``max_i (h + 2)·u·‖x_i‖₁/√h`` (with a margin; float64's ``u`` by default; ``h`` the
    Hadamard blocks' size, :func:`rotation`): each entry of ``fl(xM)`` is a sum of ``h``
    products ``±x_ir/√h`` (``1/√h`` itself rounded; the blocks' zeros add exactly)."""
    d = x.shape[-1]
    h = d & -d
    return (h + 2) * u * float(np.abs(x).sum(axis=-1).max(initial=0.0)) / math.sqrt(h) * 1.01


def _smoothed(rel: float, abs_: Any, top: Any) -> tuple[float, Any]:
    """The error model of ``q̂ = fl(q̄ + Q(fl(q − q̄)))`` against ``q`` from ``Q``'s
    ``(rel, abs)`` on ``q' = fl(q − q̄)``, ``|q̄| ≤ top`` (scalars or per entry), float64's ``u``:
    ``|q̂ − q| ≤ u|q − q̄| + |Q(q') − q'| + u|q̄ + Q(q')|`` with ``|q − q̄| ≤ |q| + top`` and
    ``|q'| ≤ (1 + u)(|q| + top)``: ``(r(1 + u) + 3u)(|q| + top) + a(1 + u)²`` (the ``u²``
    terms of ``|q̂|`` folded into the factor 3)."""
    u = FLOAT64_U
    r = rel * (1 + u) + 3 * u
    return r, r * top + abs_ * (1 + u) ** 2


def _block_mean(x: np.ndarray, rows: int) -> np.ndarray:
    """Each row's block mean (blocks of ``rows`` consecutive rows), broadcast to ``x``."""
    n = x.shape[-2]
    out = np.empty_like(x)
    for start in range(0, n, rows):
        out[..., start : start + rows, :] = x[..., start : start + rows, :].mean(
            axis=-2, keepdims=True
        )
    return out


FP8_BLOCK = 128  # FlashAttention-3's kBlockM for head dim 64–128
SAGE_Q, SAGE_K, SAGE_THREAD = 128, 64, 16  # SageAttention's b_q, b_kv; per-thread groups

NVFP4 = Operand("e2m1", "group", 16, "e4m3")  # and an fp32 tensor scale (two levels)
MXFP4 = Operand("e2m1", "group", 32, "e8m0")

SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        Scheme(
            "fa3-fp8-tensor",
            "FlashAttention-3 (arXiv:2407.08608) §4.3 'baseline FP8': per-tensor e4m3 Q, K, V, "
            "p cast to e4m3, fp32 accumulators",
            quantiser="nearest",
            q=Operand("e4m3"),
            k=Operand("e4m3"),
            v=Operand("e4m3"),
            p_cast="e4m3",
        ),
        Scheme(
            "fa3-fp8-block",
            "FlashAttention-3 §3.3 block quantisation (one e4m3 scale per block of 128 rows)",
            quantiser="nearest",
            q=Operand("e4m3", "block", FP8_BLOCK),
            k=Operand("e4m3", "block", FP8_BLOCK),
            v=Operand("e4m3", "block", FP8_BLOCK),
            p_cast="e4m3",
        ),
        Scheme(
            "fa3-fp8-block-hadamard",
            "FlashAttention-3 §3.3 block quantisation + incoherent processing (random "
            "Hadamard rotation of Q and K)",
            quantiser="nearest",
            q=Operand("e4m3", "block", FP8_BLOCK),
            k=Operand("e4m3", "block", FP8_BLOCK),
            v=Operand("e4m3", "block", FP8_BLOCK),
            rotate=True,
            p_cast="e4m3",
        ),
        Scheme(
            "sage1",
            "SageAttention (arXiv:2410.02367) §4: INT8 Q, K per block (b_q = 128, b_kv = 64) "
            "with K smoothing; P and V in fp16 with an fp16 accumulator (§4.4)",
            quantiser="nearest",
            q=Operand("int8", "block", SAGE_Q),
            k=Operand("int8", "block", SAGE_K),
            v=Operand("float16"),
            smooth_k=True,
            p_cast="float16",
            pv_acc="fp16",
        ),
        Scheme(
            "sage2-int8",
            "SageAttention2 (arXiv:2411.10958) §3–4: INT8 Q, K per thread (groups of 16 rows) "
            "with Q (per 128-row block) and K smoothing; e4m3 V per channel, P scaled by 448 "
            "to e4m3; P·V in FP22 per 32 keys into an FP32 buffer (two-level, §4.4)",
            quantiser="nearest",
            q=Operand("int8", "block", SAGE_THREAD),
            k=Operand("int8", "block", SAGE_THREAD),
            v=Operand("e4m3", "channel"),
            smooth_k=True,
            smooth_q=SAGE_Q,
            p_cast="e4m3",
            p_scale=448.0,
            pv_acc="fp22",
            pv_chunk=32,
        ),
        Scheme(
            "sage2-int8-fp22",
            "SageAttention2 as sage2-int8 but P·V accumulated in the FP22 accumulator over the "
            "whole key block (what §4.4's two-level accumulation avoids)",
            quantiser="nearest",
            q=Operand("int8", "block", SAGE_THREAD),
            k=Operand("int8", "block", SAGE_THREAD),
            v=Operand("e4m3", "channel"),
            smooth_k=True,
            smooth_q=SAGE_Q,
            p_cast="e4m3",
            p_scale=448.0,
            pv_acc="fp22",
        ),
        Scheme(
            "sage2-int4",
            "SageAttention2 §3.3: INT4 Q, K per thread with Q and K smoothing; e4m3 V and P, "
            "two-level FP22/FP32 accumulation",
            quantiser="nearest",
            q=Operand("int4", "block", SAGE_THREAD),
            k=Operand("int4", "block", SAGE_THREAD),
            v=Operand("e4m3", "channel"),
            smooth_k=True,
            smooth_q=SAGE_Q,
            p_cast="e4m3",
            p_scale=448.0,
            pv_acc="fp22",
            pv_chunk=32,
        ),
        Scheme(
            "sage3-nvfp4",
            "SageAttention3 (arXiv:2505.11594) §3: NVFP4 Q, K, V (e2m1, e4m3 scale per 16, fp32 "
            "tensor scale) with K smoothing; P in NVFP4 per 16 keys; fp32 accumulation",
            quantiser="nearest",
            q=NVFP4,
            k=NVFP4,
            v=NVFP4,
            smooth_k=True,
            p_cast="nvfp4",
        ),
        Scheme(
            "mxfp4",
            "OCP MX v1.0 MXFP4 Q, K, V (e2m1, e8m0 scale per 32), p cast to e4m3",
            quantiser="nearest",
            q=MXFP4,
            k=MXFP4,
            v=MXFP4,
            p_cast="e4m3",
        ),
        *(
            Scheme(
                f"pcast-{order}{'-s256' if scale > 1 else ''}",
                f"arXiv:2606.06521 §3–5: fp32 Q, K, V (isolating the P cast), p·S cast to e4m3 "
                f"with S = {scale:g}, keys in {'reverse' if order == 'rev' else 'forward'} "
                "order, online softmax (running max)",
                p_cast="e4m3",
                p_scale=scale,
                reverse=order == "rev",
            )
            for order in ("fwd", "rev")
            for scale in (1.0, 256.0)
        ),
    )
}
