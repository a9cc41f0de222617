"""Precision configurations: which arithmetic a run uses, given as data.

A configuration is a small dict (see :data:`CONFIGS`) naming a backend and its precision
policy: ``storage`` (inputs and outputs), ``compute`` (scores, running ``m, ℓ, z``,
accumulators), ``p_cast`` (``p`` is rounded to it before the ``p·V`` product; the
FlashAttention-2 policy casts to the input dtype) and optionally ``quantize`` (inputs are
quantised per tensor to an FP8 format, the baseline FP8 recipe of FlashAttention-3 §4.3).
``mpN`` (for any ``N ≥ 2``) is mpmath at ``N`` significand bits with every operation
rounded, the emulated-mantissa experiment of Golden et al. (2024).

The same configuration runs the tiled algorithm and the naive reference, in the same
arithmetic. Torch rows need :mod:`exactattn.backends.torch_backend`; when it cannot be
imported, :func:`available` says why and the sweep skips them with a note.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends import MpmathContext, NumpyContext
from ..backends.base import ArrayContext
from .formats import Format, get_format

CONFIGS: dict[str, dict[str, Any]] = {
    "np-fp16": {"backend": "numpy", "storage": "float16"},
    "np-fp32": {"backend": "numpy", "storage": "float32"},
    "np-fp64": {"backend": "numpy", "storage": "float64"},
    "np-fa2-fp16": {
        "backend": "numpy",
        "storage": "float16",
        "compute": "float32",
        "p_cast": "float16",
    },
    "torch-fp16": {"backend": "torch", "storage": "float16", "compute": "float16"},
    "torch-bf16": {"backend": "torch", "storage": "bfloat16", "compute": "bfloat16"},
    "torch-fp32": {"backend": "torch", "storage": "float32"},
    "torch-fp64": {"backend": "torch", "storage": "float64"},
    "torch-fa2-fp16": {
        "backend": "torch",
        "storage": "float16",
        "compute": "float32",
        "p_cast": "float16",
    },
    "torch-fa2-bf16": {
        "backend": "torch",
        "storage": "bfloat16",
        "compute": "float32",
        "p_cast": "bfloat16",
    },
    "torch-fp8-e4m3": {
        "backend": "torch",
        "storage": "float32",
        "quantize": "e4m3",
        "p_cast": "e4m3",
    },
    "torch-fp8-e5m2": {
        "backend": "torch",
        "storage": "float32",
        "quantize": "e5m2",
        "p_cast": "e5m2",
    },
}

_MP = re.compile(r"mp(\d+)")
_FP8 = ("e4m3", "e5m2")


@dataclass(frozen=True)
class Config:
    """One precision configuration: its formats and how to build its ``ctx``."""

    name: str
    backend: str
    storage: str
    compute: str
    p_cast: str | None = None
    quantize: str | None = None

    @property
    def input_format(self) -> Format:
        """The format the inputs are rounded to (FP8 for quantised configurations)."""
        return get_format(self.quantize or self.storage)

    @property
    def compute_format(self) -> Format:
        return get_format(self.compute)

    @property
    def p_format(self) -> Format:
        """The format ``p`` has in the ``p·V`` product."""
        return get_format(self.p_cast or self.compute)

    @property
    def ulp_format(self) -> Format:
        """Errors are counted in ulps of the input format (fp16 for the FA-2 fp16 policy)."""
        return self.input_format

    @property
    def bits(self) -> int:
        """Significand bits of the input format (the x-axis of the mantissa plots)."""
        return self.input_format.p

    def make_ctx(self) -> ArrayContext:
        if self.backend == "numpy":
            return NumpyContext(self.storage, compute=self.compute, p_cast=self.p_cast)
        if self.backend == "mpmath":
            return MpmathContext(prec=get_format(self.compute).p)
        from . import fp8

        return fp8.torch_context(self.storage, self.compute, self.p_cast)

    def prepare(self, x: np.ndarray) -> np.ndarray:
        """The input as this configuration receives it (FP8 per-tensor quantised if set)."""
        if self.quantize is None:
            return x
        from . import fp8

        return fp8.quantize_per_tensor(x, self.quantize)


@functools.cache
def get_config(name: str) -> Config:
    """The configuration called ``name`` (a key of :data:`CONFIGS` or ``mpN``)."""
    match = _MP.fullmatch(name)
    if match:
        bits = int(match.group(1))
        if bits < 2:
            raise ValueError(f"mpN needs N >= 2 significand bits; got {name!r}")
        return Config(name, "mpmath", f"p{bits}", f"p{bits}")
    if name not in CONFIGS:
        raise ValueError(f"unknown configuration {name!r}; use one of {sorted(CONFIGS)} or mpN")
    spec = dict(CONFIGS[name])
    spec.setdefault("compute", spec["storage"])
    return Config(name=name, **spec)


def available(name: str) -> tuple[bool, str]:
    """Whether the configuration can run here, and if not, why."""
    config = get_config(name)
    if config.backend != "torch":
        return True, ""
    if importlib.util.find_spec("torch") is None:
        return False, "torch is not installed"
    try:
        importlib.import_module("exactattn.backends.torch_backend")
    except ImportError as error:
        return False, f"exactattn.backends.torch_backend is not importable ({error})"
    return True, ""


def to_float64(x: Any) -> np.ndarray:
    """A backend's array as float64 NumPy (mpf and arb entries via their float value)."""
    if hasattr(x, "detach"):
        return x.detach().to("cpu").double().numpy()
    arr = np.asarray(x)
    if arr.dtype == object:
        return np.frompyfunc(float, 1, 1)(arr).astype(np.float64)
    return arr.astype(np.float64)
