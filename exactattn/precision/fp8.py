"""FP8 (e4m3, e5m2) inputs for the FP8 configurations: per-tensor quantisation.

FlashAttention-3 §4.3's *baseline FP8* quantises Q, K, V per tensor (one scale
``s = amax|X| / max_fp8``, ``X ≈ s·fp8(X/s)``), multiplies with an fp32 accumulator and
casts ``P`` to FP8 for the ``P·V`` GEMM. Here the dequantised inputs are fp32 numbers
(exact: an FP8 value times ``s`` fits fp32's 24 bits up to one rounding); the arithmetic,
fp32 with ``p`` cast to FP8, is the torch context
:class:`~exactattn.backends.fp8_backend.Fp8Context`.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _dtype(fmt: str) -> Any:
    from ..backends.fp8_backend import FP8_DTYPES

    return FP8_DTYPES[fmt]


def tensor_scale(x: np.ndarray, fmt: str) -> float:
    """The per-tensor scale ``s = amax|x| / max_fp8`` (1 for an all-zero tensor)."""
    import torch

    amax = float(np.max(np.abs(x))) if x.size else 0.0
    return amax / float(torch.finfo(_dtype(fmt)).max) if amax > 0 else 1.0


def quantize_per_tensor(x: np.ndarray, fmt: str) -> np.ndarray:
    """``s·fp8(x/s)`` with ``s = amax|x| / max_fp8`` (float64 in, float64 out)."""
    import torch

    dtype = _dtype(fmt)
    scale = tensor_scale(x, fmt)
    q = torch.from_numpy(np.asarray(x, dtype=np.float64) / scale).to(dtype)
    return q.to(torch.float64).numpy() * scale
