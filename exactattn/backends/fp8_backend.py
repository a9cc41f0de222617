"""FP8 (e4m3, e5m2) through torch's float8 dtypes: FlashAttention-3's baseline FP8.

FlashAttention-3 §4.3's *baseline FP8* quantises Q, K, V per tensor (one scale
``s = amax|X| / max_fp8``, ``X ≈ s·fp8(X/s)``:
:func:`exactattn.backends.quantize.quantize_per_tensor`, NumPy only, one rounding for every low-bit
format), multiplies with an fp32 accumulator and casts ``P`` to FP8 for the ``P·V`` product. The
dequantised inputs are fp32 numbers (exact: an FP8 value times ``s`` fits fp32's 24 bits up to one
rounding).
:class:`Fp8Context` is the torch context of that policy: storage and compute as
:class:`~exactattn.backends.torch_backend.TorchContext` (fp32 in the ``torch-fp8-*``
configurations), and ``round_p`` casts ``p ∈ [0, 1]`` to torch's float8 dtype and back.
"""

from __future__ import annotations

from typing import Any

from ..infra.optional import needs
from .torch_backend import TorchContext

with needs("Fp8Context (exactattn.backends.fp8_backend)"):
    import torch

FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


class Fp8Context(TorchContext):
    """The torch context with ``p`` rounded to the FP8 format ``fmt`` before ``p·V``."""

    def __init__(
        self, fmt: str, dtype: Any = "float32", device: Any = "cpu", compute: Any = "float32"
    ):
        if fmt not in FP8_DTYPES:
            raise ValueError(f"fmt must be one of {sorted(FP8_DTYPES)}; got {fmt!r}")
        super().__init__(dtype, device=device, compute=compute, p_cast=compute)
        self.fp8_dtype = FP8_DTYPES[fmt]
        self.name = self.name.removesuffix("]") + f",p_cast={fmt}]"

    def round_p(self, p: torch.Tensor) -> torch.Tensor:
        return p.to(self.fp8_dtype).to(self.compute_dtype)


def torch_context(storage: str, compute: str, p_cast: str | None) -> TorchContext:
    """The CPU torch context of a configuration's dtype names; ``p_cast`` may be an FP8 one."""
    if p_cast in FP8_DTYPES:
        return Fp8Context(p_cast, storage, compute=compute)
    return TorchContext(storage, compute=compute, p_cast=p_cast)
