"""Low-bit attention schemes as precision policies over the one tiled algorithm.

A :class:`Scheme` says how a kernel holds ``Q, K, V`` (quantisation of each, by
:mod:`exactattn.backends.quantize`), which exact transformations it applies first, and the context
(:class:`~exactattn.backends.lowbit_backend.LowbitContext`) the tiled algorithm of
:mod:`exactattn.core.algorithm` runs in: the cast of ``p`` with its static scale, the ``p·V``
accumulator, the online-softmax order. Nothing here iterates over blocks.

**Exact transformations** (the exact answer does not change; only their float64 rounding
is charged to the bound, :meth:`Scheme.arith`):

* *incoherent processing* (FlashAttention-3, Shah et al. 2024, arXiv:2407.08608 §3.3):
  ``Q ↦ QM``, ``K ↦ KM`` with ``M = diag(±1)·H_d/√d`` orthogonal, so ``QMMᵀKᵀ = QKᵀ``;
  it spreads outliers over the head dim before quantisation. Charged: each entry of
  ``fl(xM)`` is within ``d·2^{−53}·‖x_i‖₁/√d`` of ``xM`` (Higham §3.1);
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

import math
import zlib
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..backends import quantize as qz
from ..backends.formats import Format, get_format
from .bounds import Arith

FLOAT64_U = 2.0**-53
FP16 = ("float16", 2.0**-11, 2.0**-25)  # name, u, μ


@dataclass(frozen=True)
class Operand:
    """How one input is held: ``number`` (``e4m3``, ``e5m2``, ``int8``, ``int4``,
    ``nvfp4``, ``mxfp4``, ``float16``, or None: as given) at a granularity."""

    number: str | None = None
    granularity: str = "tensor"
    block: int | None = None

    def hold(self, x: np.ndarray) -> tuple[np.ndarray, float, float]:
        """``(x̂, rel, abs)`` with ``|x̂ − x| ≤ rel·|x| + abs``."""
        if self.number is None:
            return x, 0.0, 0.0
        if self.number == "float16":
            return x.astype(np.float16).astype(np.float64), FP16[1], FP16[2]
        if self.number == "nvfp4":
            got = qz.nvfp4(x)
        elif self.number == "mxfp4":
            got = qz.mxfp4(x)
        else:
            got = qz.quantize(x, self.number, self.granularity, self.block)
        return got.values, got.rel, got.abs_error


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

    def ctx(self) -> Any:
        from ..backends.lowbit_backend import LowbitContext

        return LowbitContext(
            self.p_cast, self.p_scale, self.pv_acc, self.pv_chunk, self.running_max
        )

    # --- inputs ---------------------------------------------------------------------------
    def exact(self, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float, float]:
        """The transformed float64 inputs (same exact attention) and the ``(rel, abs)``
        their float64 rounding may add to each entry."""
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
        if self.reverse:
            k, v = k[..., ::-1, :].copy(), v[..., ::-1, :].copy()
        return {**inputs, "q": q, "k": k, "v": v}, rel, abs_

    def hold(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        """The inputs as the kernel holds them (dequantised, float64), with the error model
        ``|x̂ − x| ≤ rel·|x| + abs`` over ``q, k, v`` against :meth:`exact`'s inputs."""
        exact, rel_t, abs_t = self.exact(inputs)
        held, rels, abss = dict(exact), [], []
        for name, operand in (("q", self.q), ("k", self.k), ("v", self.v)):
            x = exact[name]
            mean = None
            if name == "q" and self.smooth_q:
                mean = _block_mean(x, self.smooth_q)
                x = x - mean
            values, rel, abs_ = operand.hold(x)
            if mean is not None:
                values = values + mean
                rel, abs_ = _smoothed(rel, abs_, float(np.abs(mean).max(initial=0.0)))
            held[name] = values
            rels.append(rel)
            abss.append(abs_)
        return {
            "inputs": held,
            "exact": exact,
            "rel": max(rels) + rel_t,
            "abs": max(abss) + abs_t,
        }

    # --- the bound --------------------------------------------------------------------------
    def arith(self, block: int | None, inputs: dict[str, np.ndarray]) -> Arith:
        """The arithmetic :func:`exactattn.error.bounds.bounds` assumes, for the inputs of
        :meth:`exact` with ``input_rounding``: fp32 storage and compute (NumPy's float32
        SIMD exp: ``funcs = 4``), the quantisation as ``quant_rel``/``quant_abs``, ``p``'s
        cast as a format whose ``μ`` is the scaled cast's (``μ_F/S``), the ``p·V``
        accumulator and its chunk."""
        held = self.hold(inputs)
        fp32 = get_format("float32")
        return replace(
            Arith(input=fp32, compute=fp32, acc=fp32, output=fp32, block=block, funcs=4.0),
            p=_p_format(self.p_cast, self.p_scale),
            quant_rel=held["rel"],
            quant_abs=held["abs"],
            pv_acc=_ACC_FORMATS[self.pv_acc],
            pv_chunk=self.pv_chunk,
        )

    @property
    def ulp_format(self) -> str:
        """The format errors are counted in ulps of: the coarsest of the inputs'."""
        numbers = [o.number for o in (self.q, self.k, self.v) if o.number]
        if any(n in ("nvfp4", "mxfp4", "int4") for n in numbers):
            return "e2m1"
        if any(n in ("e4m3", "int8") for n in numbers):
            return "e4m3"
        if "e5m2" in numbers:
            return "e5m2"
        return "float16" if numbers else "float32"


# the accumulators as formats of the bound (truncation: one bit fewer, to nearest)
_ACC_FORMATS = {
    "fp32": get_format("float32"),
    "fp16": get_format("float16"),
    "fp22": Format("fp22-rz", 13, -126),
    "fp22-rn": Format("fp22", 14, -126),
}


def _p_format(p_cast: str | None, scale: float) -> Format | None:
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
    """FlashAttention-3's random orthogonal ``M = diag(±1)·H_d/√d`` (signs fixed per ``d``)."""
    rng = np.random.default_rng([zlib.crc32(b"incoherent"), d])
    return rng.choice([-1.0, 1.0], size=d)[:, None] * qz.hadamard(d)


def _rotation_error(x: np.ndarray) -> float:
    """``max_i d·2^{−53}·‖x_i‖₁/√d`` (with a margin): each entry of ``fl(xM)`` is a sum of
    ``d`` products ``±x_ir/√d`` (``1/√d`` itself rounded)."""
    d = x.shape[-1]
    return (
        (d + 2) * FLOAT64_U * float(np.abs(x).sum(axis=-1).max(initial=0.0)) / math.sqrt(d) * 1.01
    )


def _smoothed(rel: float, abs_: float, top: float) -> tuple[float, float]:
    """The error model of ``q̂ = fl(q̄ + Q(fl(q − q̄)))`` against ``q`` from ``Q``'s
    ``(rel, abs)`` on ``q' = fl(q − q̄)``, ``|q̄| ≤ top``, float64's ``u``:
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

SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        Scheme(
            "fa3-fp8-tensor",
            "FlashAttention-3 (arXiv:2407.08608) §4.3 'baseline FP8': per-tensor e4m3 Q, K, V, "
            "p cast to e4m3, fp32 accumulators",
            q=Operand("e4m3"),
            k=Operand("e4m3"),
            v=Operand("e4m3"),
            p_cast="e4m3",
        ),
        Scheme(
            "fa3-fp8-block",
            "FlashAttention-3 §3.3 block quantisation (one e4m3 scale per block of 128 rows)",
            q=Operand("e4m3", "block", FP8_BLOCK),
            k=Operand("e4m3", "block", FP8_BLOCK),
            v=Operand("e4m3", "block", FP8_BLOCK),
            p_cast="e4m3",
        ),
        Scheme(
            "fa3-fp8-block-hadamard",
            "FlashAttention-3 §3.3 block quantisation + incoherent processing (random "
            "Hadamard rotation of Q and K)",
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
            q=Operand("nvfp4"),
            k=Operand("nvfp4"),
            v=Operand("nvfp4"),
            smooth_k=True,
            p_cast="nvfp4",
        ),
        Scheme(
            "mxfp4",
            "OCP MX v1.0 MXFP4 Q, K, V (e2m1, e8m0 scale per 32), p cast to e4m3",
            q=Operand("mxfp4"),
            k=Operand("mxfp4"),
            v=Operand("mxfp4"),
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
