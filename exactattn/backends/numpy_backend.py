"""IEEE arithmetic on NumPy arrays: float16, float32, float64 and longdouble.

The precision policy is explicit: inputs are held in ``storage``, scores, the running
summary (m, ℓ, z) and the gradient accumulators in ``compute``, and ``p`` is rounded to
``p_cast`` before the ``p·V`` product. ``NumpyContext("float16", compute="float32",
p_cast="float16")`` is the FlashAttention-2 policy (fp16 tensor-core inputs, fp32
statistics and accumulators, ``P`` cast to fp16 for the second GEMM).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .protocol import ArrayContext

FLOAT_DTYPES = (np.float16, np.float32, np.float64, np.longdouble)


def _float_dtype(value: Any, argument: str) -> np.dtype | None:
    if value is None:
        return None
    dtype = np.dtype(value)
    if dtype.type not in FLOAT_DTYPES:
        names = ", ".join(np.dtype(t).name for t in FLOAT_DTYPES)
        raise TypeError(f"{argument} must be one of {names}; got {dtype.name}")
    return dtype


class NumpyContext(ArrayContext):
    """NumPy floats with an explicit storage / compute / p-cast precision policy."""

    def __init__(self, storage: Any = "float64", compute: Any = None, p_cast: Any = None):
        self.storage_dtype = _float_dtype(storage, "storage")
        self.compute_dtype = _float_dtype(compute, "compute") or self.storage_dtype
        self.p_cast_dtype = _float_dtype(p_cast, "p_cast")
        parts = [self.storage_dtype.name]
        if self.compute_dtype != self.storage_dtype:
            parts.append(f"compute={self.compute_dtype.name}")
        if self.p_cast_dtype is not None:
            parts.append(f"p_cast={self.p_cast_dtype.name}")
        self.name = "numpy[" + ",".join(parts) + "]"

    def asarray(self, x: Any) -> np.ndarray:
        return np.asarray(x).astype(self.storage_dtype, copy=False)

    def as_compute(self, x: Any) -> np.ndarray:
        return np.asarray(x).astype(self.compute_dtype, copy=False)

    def compute(self, x: np.ndarray) -> np.ndarray:
        return x.astype(self.compute_dtype, copy=False)

    def output(self, x: np.ndarray) -> np.ndarray:
        return x.astype(self.storage_dtype, copy=False)

    def round_p(self, p: np.ndarray) -> np.ndarray:
        if self.p_cast_dtype is None:
            return p
        return p.astype(self.p_cast_dtype).astype(self.compute_dtype)

    def scalar(self, x: Any) -> np.generic:
        return self.compute_dtype.type(x)

    def default_scale(self, d: int) -> np.generic:
        return self.compute_dtype.type(1) / np.sqrt(self.compute_dtype.type(d))

    @property
    def neg_inf(self) -> np.generic:
        return self.compute_dtype.type(-np.inf)

    def exp_shifted(self, s: np.ndarray, shift: np.ndarray) -> np.ndarray:
        # In place: the score tile is scratch, and one fewer (rows × b) temporary matters.
        np.subtract(s, shift[..., None], out=s)
        return np.exp(s, out=s)
