"""The ctx of a low-bit attention kernel: fp32 storage and compute (the dequantised inputs),
``p`` cast to a low-bit format with a static scale before ``p·V``, and the ``p·V`` product
accumulated in a chosen accumulator (:func:`exactattn.backends.quantize.accumulate`).

The inputs arrive already quantised and dequantised (``s·fl(x/s)``, float64, by
:mod:`exactattn.error.lowbit`), so ``Q Kᵀ`` on them in fp32 is the kernel's integer or FP8
product followed by the fp32 descale, up to the fp32 rounding of the dequantised values
(charged by the bound as storage rounding). What the algorithm cannot see from outside is
what this context changes:

* ``round_p``: ``p ↦ fl_F(p·S)/S`` for a minifloat ``F`` (e4m3) and a static scale ``S``
  (FlashAttention-3 casts ``p ≤ 1`` with ``S = 1``; SageAttention 2 scales by 448;
  arXiv:2606.06521 argues for ``S = 2^8``), a cast to fp16 (SageAttention 1), or NVFP4
  along the keys (SageAttention 3; the tile's amax as its tensor scale). It counts
  the ``p > 0`` it sends to 0 (:attr:`underflow`), the P-cast paper's *collapse*;
* ``pv_product``: the product in the accumulator format, two-level with ``chunk``;
* ``running_max``: ``p`` against the running max, FlashAttention-2/3's online softmax (the
  order in which a cast of ``p`` underflows behind a sink seen first).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .numpy_backend import NumpyContext
from .quantize import ACCUMULATORS, MINIFLOATS, accumulate, nvfp4, round_minifloat

P_CASTS = (*MINIFLOATS, "float16", "nvfp4")


class LowbitContext(NumpyContext):
    """fp32 NumPy arithmetic with a low-bit ``p`` cast and ``p·V`` accumulator."""

    def __init__(
        self,
        p_cast: str | None = None,
        p_scale: float = 1.0,
        pv_acc: str = "fp32",
        pv_chunk: int | None = None,
        running_max: bool = True,
    ):
        super().__init__("float32", compute="float32")
        if p_cast is not None and p_cast not in P_CASTS:
            raise ValueError(f"p_cast must be one of {P_CASTS} or None; got {p_cast!r}")
        if not (isinstance(p_scale, (int, float)) and p_scale > 0 and np.isfinite(p_scale)):
            raise ValueError(f"p_scale must be a finite number > 0; got {p_scale!r}")
        if pv_acc not in ACCUMULATORS:
            raise ValueError(f"pv_acc must be one of {sorted(ACCUMULATORS)}; got {pv_acc!r}")
        self.p_cast, self.p_scale, self.pv_acc, self.pv_chunk = p_cast, p_scale, pv_acc, pv_chunk
        self.running_max = running_max
        self.underflow = np.zeros(2, dtype=np.int64)  # (p > 0 cast to 0, p > 0)
        self.name = (
            f"lowbit[p={p_cast},S={p_scale:g},acc={pv_acc},chunk={pv_chunk},"
            f"{'running' if running_max else 'block'}-max]"
        )

    def round_p(self, p: np.ndarray) -> np.ndarray:
        if self.p_cast is None:
            return p
        if self.p_cast == "float16":
            out = p.astype(np.float16).astype(np.float32)
        elif self.p_cast == "nvfp4":  # e2m1 with an e4m3 scale per 16 keys, one per tile
            wide = np.asarray(p, dtype=np.float64)
            pad = -wide.shape[-1] % 16  # a partial tile padded with p = 0 (amax unchanged)
            padded = np.pad(wide, [(0, 0)] * (wide.ndim - 1) + [(0, pad)])
            out = nvfp4(padded).values[..., : wide.shape[-1]].astype(np.float32)
        else:
            scaled = np.asarray(p, dtype=np.float64) * self.p_scale
            out = (round_minifloat(scaled, self.p_cast) / self.p_scale).astype(np.float32)
        positive = p > 0
        self.underflow += [int(np.count_nonzero(positive & (out == 0))), int(positive.sum())]
        return out

    def pv_product(self, p: np.ndarray, v: np.ndarray) -> np.ndarray:
        weights = self.round_p(p)
        if self.pv_acc == "fp32" and self.pv_chunk is None:
            return self.matmul(weights, v)  # NumPy's fp32 matmul: an fp32 accumulator
        return accumulate(weights, v, self.pv_acc, self.pv_chunk).astype(np.float32)

    def measures(self) -> dict[str, Any]:
        """The fraction of positive ``p`` the cast sent to 0 since the last call (reset)."""
        zeros, positive = (int(x) for x in self.underflow)
        self.underflow[:] = 0
        return {"p_underflow": zeros / positive if positive else float("nan")}
