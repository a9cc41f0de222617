"""IEEE arithmetic on torch tensors, on the CPU or a CUDA device.

The same precision policy as :class:`~exactattn.backends.numpy_backend.NumpyContext`,
made explicit: inputs are held in ``storage`` (the tensors' dtype), scores, the running
summary (m, ℓ, z), δ and the gradient accumulators in ``compute``, and ``p`` is rounded to
``p_cast`` before the ``p·V`` product. By default float16 and bfloat16 inputs get
``compute=float32, p_cast=<input dtype>``: the FlashAttention-2 policy (half-precision
tensor-core inputs, fp32 statistics and accumulators, ``P`` cast to the input dtype for
the second GEMM). float32 and float64 compute in their own dtype with no cast of ``p``.

The context only ever sees tensors the caller owns or tiles of them; it never records an
autograd graph itself (:mod:`exactattn.torch` runs the passes under ``torch.no_grad``).
Constants (``scalar``) are 0-dim tensors of the compute dtype on the device, so constant
arithmetic (``1/(1−p)``, ``1/sqrt(d)``) rounds exactly as NumPy's does in that dtype.
"""

from __future__ import annotations

from typing import Any

from ..infra.optional import needs
from .protocol import ArrayContext

with needs("TorchContext (exactattn.backends.torch_backend)"):
    import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
HALF_DTYPES = (torch.float16, torch.bfloat16)
LOG2_E = 1.4426950408889634  # log₂e, rounded to the compute dtype where it is used

_NAMES = {
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float": torch.float32,
    "float64": torch.float64,
    "double": torch.float64,
}


def _float_dtype(value: Any, argument: str) -> torch.dtype | None:
    if value is None:
        return None
    dtype = _NAMES.get(value, value) if isinstance(value, str) else value
    if dtype not in FLOAT_DTYPES:
        names = ", ".join(str(t).removeprefix("torch.") for t in FLOAT_DTYPES)
        raise TypeError(f"{argument} must be one of {names}; got {value!r}")
    return dtype


class TorchContext(ArrayContext):
    """torch tensors on one device with a storage / compute / p-cast precision policy.

    ``TorchContext(torch.bfloat16, device="cuda")`` is the FlashAttention-2 policy;
    ``TorchContext(torch.bfloat16, compute=torch.bfloat16)`` keeps everything in bf16
    (p then needs no cast); pass ``p_cast=<compute dtype>`` to keep fp32 ``p`` with
    half-precision inputs.
    """

    def __init__(
        self,
        dtype: Any = torch.float32,
        device: Any = "cpu",
        compute: Any = None,
        p_cast: Any = None,
    ):
        self.storage_dtype = _float_dtype(dtype, "dtype")
        default = torch.float32 if self.storage_dtype in HALF_DTYPES else self.storage_dtype
        self.compute_dtype = _float_dtype(compute, "compute") or default
        p_cast = _float_dtype(p_cast, "p_cast")
        if p_cast is None and self.compute_dtype != self.storage_dtype:
            p_cast = self.storage_dtype
        # Rounding p to the compute dtype is the identity: record it as "no cast".
        self.p_cast_dtype = None if p_cast == self.compute_dtype else p_cast
        self.device = torch.device(device)
        parts = [str(self.storage_dtype).removeprefix("torch.")]
        if self.compute_dtype != self.storage_dtype:
            parts.append(f"compute={str(self.compute_dtype).removeprefix('torch.')}")
        if self.p_cast_dtype is not None:
            parts.append(f"p_cast={str(self.p_cast_dtype).removeprefix('torch.')}")
        parts.append(str(self.device))
        self.name = "torch[" + ",".join(parts) + "]"
        self._constants: dict[Any, torch.Tensor] = {}

    # --- construction -----------------------------------------------------------------
    def asarray(self, x: Any) -> torch.Tensor:
        return torch.as_tensor(x, device=self.device).to(self.storage_dtype)

    def as_compute(self, x: Any) -> torch.Tensor:
        return torch.as_tensor(x, device=self.device).to(self.compute_dtype)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.compute_dtype)  # no copy when the dtype already agrees

    def output(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.storage_dtype)

    def round_p(self, p: torch.Tensor) -> torch.Tensor:
        if self.p_cast_dtype is None:
            return p
        return p.to(self.p_cast_dtype).to(self.compute_dtype)

    def comparable(self, x: torch.Tensor) -> Any:
        """float64 NumPy on the host (exact for every torch float dtype)."""
        return x.detach().to("cpu").double().numpy()

    def scalar(self, x: Any) -> torch.Tensor:
        """A 0-dim tensor of the compute dtype on the device (cached per value)."""
        if isinstance(x, torch.Tensor):
            return x.to(device=self.device, dtype=self.compute_dtype)
        key = (type(x), x)
        constant = self._constants.get(key)
        if constant is None:
            constant = torch.tensor(x, dtype=self.compute_dtype, device=self.device)
            self._constants[key] = constant
        return constant

    def default_scale(self, d: int) -> torch.Tensor:
        return self.scalar(1) / torch.sqrt(self.scalar(d))

    @property
    def neg_inf(self) -> float:
        return float("-inf")  # exact in every float dtype

    def full(self, shape: tuple[int, ...], value: Any) -> torch.Tensor:
        return torch.full(shape, float(value), dtype=self.compute_dtype, device=self.device)

    def zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.compute_dtype, device=self.device)

    def adopt(self, x: Any) -> torch.Tensor:
        return torch.as_tensor(x, device=self.device)

    def index(self, start: int, stop: int) -> torch.Tensor:
        return torch.arange(start, stop, dtype=torch.int64, device=self.device)

    # --- arithmetic the algorithm needs -----------------------------------------------
    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)

    def transpose(self, a: torch.Tensor) -> torch.Tensor:
        return a.transpose(-1, -2)

    def exp(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x)

    def log(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)

    def tanh(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)

    def exp_shifted(self, s: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """``e^{s − shift} = 2^{(s − shift)·log₂e}``, in place (the score tile is scratch).

        torch's ``exp`` on the CPU goes through MKL's vector maths, which takes a slow
        generic path on some CPUs (4x ``exp2`` on the AMD EPYC benchmark machine); ``exp2``
        is SLEEF's vectorised code everywhere. The price is two more roundings of the
        argument (``log₂e`` rounded, and the product): ``2u|s − shift|`` more in the
        exponent, which ``exactattn.error.bounds`` charges (``EXP_ARG_ROUNDINGS``;
        ``docs/error_bound.md``, step 3).
        """
        return s.sub_(shift.unsqueeze(-1)).mul_(LOG2_E).exp2_()

    def maximum(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.maximum(a, b)

    def rowmax(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] == 0:
            return self.full(tuple(x.shape[:-1]), self.neg_inf)
        return torch.amax(x, dim=-1)

    def rowsum(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=-1)

    def where(self, cond: Any, a: Any, b: Any) -> torch.Tensor:
        return torch.where(cond, a, b)

    def is_neg_inf(self, x: torch.Tensor) -> torch.Tensor:
        return torch.isneginf(x)

    def any(self, x: Any) -> bool:
        x = torch.as_tensor(x)
        if x.dtype == torch.bool and x.numel():
            # torch.any on a bool tile is a scalar loop (~20x a vectorised max of its bytes)
            return bool(x.view(torch.uint8).max())
        return bool(torch.any(x))

    def sum_to(self, x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """Sum ``x`` over the leading axes that broadcasting added to reach ``shape``."""
        shape = tuple(shape)
        extra = x.dim() - len(shape)
        if extra:
            x = torch.sum(x, dim=tuple(range(extra)))
        axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
        return torch.sum(x, dim=axes, keepdim=True) if axes else x

    def broadcast_to(self, x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.broadcast_to(x, shape)

    # --- checks ------------------------------------------------------------------------
    def nonfinite(self, x: torch.Tensor) -> torch.Tensor:
        return ~torch.isfinite(x)
