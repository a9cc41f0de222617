"""Precision configurations of the sweep: views of the target registry's exactattn entries.

A configuration is a registry entry of the ``api`` convention (:mod:`exactattn.targets.builtin`
holds the list: NumPy, torch, FP8, ``mpN`` and the emulated formats ``emuN-rn|rz``): a
backend and its precision policy — ``storage`` (inputs and outputs), ``compute`` (scores,
running ``m, ℓ, z``, accumulators), ``p_cast`` (``p`` is rounded to it before the ``p·V``
product; the FlashAttention-2 policy casts to the input dtype), ``quantize`` (per-tensor FP8
inputs, FlashAttention-3 §4.3's baseline), ``rounding`` (``nearest`` or ``toward_zero``) and
``granularity`` (what one rounding covers: ``native`` hardware arithmetic, every ``scalar``
operation, or each whole ``op``). :func:`get_config` reads an entry; :func:`available` says
whether it runs here; :meth:`Config.arith` is the arithmetic the error bound
(:mod:`exactattn.error.bounds`) assumes for it.

The same configuration runs the tiled algorithm and the naive reference, in the same
arithmetic. Torch rows need :mod:`exactattn.backends.torch_backend`; when torch cannot be
imported, :func:`available` says why and the sweep skips them with a note.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import targets
from ..backends.formats import Format, get_format
from ..backends.protocol import ArrayContext
from ..error import bounds

SWEEP_BACKENDS = ("numpy", "torch", "mpmath", "emulated", "lowbit")
GRANULARITY = {"numpy": "native", "torch": "native", "mpmath": "scalar"}


@dataclass(frozen=True)
class Config:
    """One precision configuration: its formats and how to build its ``ctx``."""

    name: str
    backend: str
    storage: str
    compute: str
    p_cast: str | None = None
    quantize: str | None = None
    rounding: str = "nearest"
    granularity: str = "native"

    @property
    def scheme(self) -> Any:
        """The low-bit scheme (:mod:`exactattn.error.lowbit`) of a ``lowbit`` configuration."""
        from ..error.lowbit import SCHEMES

        return SCHEMES[self.quantize] if self.backend == "lowbit" else None

    @property
    def input_format(self) -> Format:
        """The format the inputs are rounded to (FP8 for quantised configurations; a
        low-bit scheme's coarsest)."""
        if self.scheme is not None:
            return get_format(self.scheme.ulp_format)
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
        return targets.get(self.name).options.ctx()

    def arith(self, inputs: dict[str, np.ndarray], block: int) -> bounds.Arith:
        """The arithmetic of this configuration at key-block size ``block`` (``n_k`` for the
        naive computation) on ``inputs``, for :func:`exactattn.error.bounds.bounds` with
        ``input_rounding``: its registry entry's (:meth:`exactattn.targets.Variant.arith`)."""
        return targets.variant(self.name).arith(block, inputs)

    def prepare(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``q, k, v`` as this configuration receives them: FP8 per-tensor quantised if
        set, a low-bit scheme's transformed and quantised inputs (:meth:`Scheme.hold`)."""
        if self.scheme is not None:
            return self.scheme.hold(inputs)["inputs"]
        if self.quantize is None:
            return inputs
        from ..backends.quantize import quantize_per_tensor

        return {x: quantize_per_tensor(a, self.quantize) for x, a in inputs.items()}

    def exact(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The float64 inputs the bound is taken on: a scheme's quantised inputs where it
        states its quantiser (:meth:`~exactattn.error.lowbit.Scheme.reference_inputs`; the
        bound is then of the distance to exact attention there), else its exact
        transformations of them (the same exact attention), else the inputs."""
        if self.scheme is None:
            return inputs
        return self.scheme.reference_inputs(inputs) or self.scheme.exact(inputs)[0]


@functools.cache
def get_config(name: str) -> Config:
    """The configuration called ``name`` (a registry entry of the ``api`` convention, ``mpN``
    or ``emuN-rn|rz``)."""
    try:
        target = targets.get(name)
    except targets.UnknownTarget:
        raise ValueError(
            f"unknown configuration {name!r}; use one of {sorted(names())}, mpN or emuN-rn|rz"
        ) from None
    options = target.options
    if target.convention != "api" or options.backend not in SWEEP_BACKENDS:
        raise ValueError(
            f"{name!r} is a registry target but not a precision configuration; use one of "
            f"{sorted(names())}, mpN or emuN-rn|rz"
        )
    backend = options.backend
    return Config(
        name,
        backend,
        options.storage,
        options.compute,
        options.p_cast,
        options.quantize,
        options.rounding or "nearest",
        options.granularity or GRANULARITY.get(backend, "native"),
    )


def names() -> list[str]:
    """The registered precision configurations (``mpN`` and ``emuN-rn|rz`` besides)."""
    return [
        name
        for name, target in targets.registry().items()
        if target.convention == "api"
        and target.options.backend in SWEEP_BACKENDS
        and target.options.path == "tiled"
        and not name.startswith("mp")
    ]


def available(name: str) -> tuple[bool, str]:
    """Whether the configuration (or registry target ``name[dtype]``) can run here, and if
    not, why."""
    try:
        target = targets.get(get_config(name).name)
    except ValueError:
        target = targets.variant(name).target
    why = targets.unavailable(target)
    return why is None, why or ""


def sweep_names(names: list[str]) -> list[str]:
    """Registry names as the sweep's ``config`` knob: configurations as they are, foreign
    targets as ``name[dtype]`` (a bare name that runs in several dtypes: each of float16,
    bfloat16, float32 it takes). Unknown names raise :class:`~exactattn.targets.UnknownTarget`."""
    out: list[str] = []
    for name in names:
        try:
            get_config(name)
            out.append(name)
            continue
        except ValueError:
            pass
        base, bracket, _ = name.partition("[")
        target = targets.get(base)
        if bracket or len(target.caps.dtypes) == 1:
            targets.variant(name)  # checks the dtype
            out.append(name)
        else:
            kinds = [x for x in ("float16", "bfloat16", "float32") if x in target.caps.dtypes]
            out += [f"{base}[{x}]" for x in kinds]
    return list(dict.fromkeys(out))


def to_float64(x: Any) -> np.ndarray:
    """A backend's array as float64 NumPy (mpf and arb entries via their float value)."""
    if hasattr(x, "detach"):
        return x.detach().to("cpu").double().numpy()
    arr = np.asarray(x)
    if arr.dtype == object:
        return np.frompyfunc(float, 1, 1)(arr).astype(np.float64)
    return arr.astype(np.float64)
