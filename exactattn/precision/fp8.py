"""FP8 (e4m3, e5m2) as casts through torch's float8 dtypes, for the FP8 configurations.

FlashAttention-3 §4.3's *baseline FP8* quantises Q, K, V per tensor (one scale
``s = amax|X| / max_fp8``, ``X ≈ s·fp8(X/s)``), multiplies with an fp32 accumulator and
casts ``P`` to FP8 for the ``P·V`` GEMM. Here the dequantised inputs are fp32 numbers
(exact: an FP8 value times ``s`` fits fp32's 24 bits up to one rounding), the torch
context computes in fp32, and ``round_p`` casts ``p ∈ [0, 1]`` to FP8 and back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FP8_DTYPES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def _dtype(name: str) -> Any:
    import torch

    if name in FP8_DTYPES:
        return getattr(torch, FP8_DTYPES[name])
    return getattr(torch, name)


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


def torch_context(storage: str, compute: str, p_cast: str | None) -> Any:
    """A :class:`TorchContext` on the CPU; ``p_cast`` may be an FP8 format name."""
    from ..backends.torch_backend import TorchContext

    if p_cast not in FP8_DTYPES:
        return TorchContext(
            _dtype(storage), compute=_dtype(compute), p_cast=p_cast and _dtype(p_cast)
        )
    fp8 = _dtype(p_cast)

    class Fp8PContext(TorchContext):
        """The torch context with ``p`` rounded to FP8 before the ``p·V`` product."""

        def round_p(self, p: Any) -> Any:
            return p.to(fp8).to(self.compute_dtype)

    ctx = Fp8PContext(_dtype(storage), compute=_dtype(compute), p_cast=_dtype(compute))
    ctx.name = ctx.name.removesuffix("]") + f",p_cast={p_cast}]"
    return ctx
