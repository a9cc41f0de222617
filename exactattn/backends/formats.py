"""The one table of number formats: precision ``p`` (significand bits), exponent range, ulp,
and every name a format goes by (``fp16``, ``half``, ``torch.float16`` … → ``float16``).

``u = 2^{-p}`` is the unit roundoff of round-to-nearest; ``ulp(x) = 2^{max(e, e_min) − p + 1}``
for ``2^e ≤ |x| < 2^{e+1}``; ``μ = 2^{e_min − p}`` is half the subnormal spacing, the
absolute rounding error of gradual underflow. An ``e_min`` of ``None`` is an unbounded
exponent (mpmath's emulated formats).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Format:
    """A binary format with ``p`` significand bits (implicit bit included)."""

    name: str
    p: int
    e_min: int | None  # exponent of the smallest normal number; None: unbounded

    @property
    def u(self) -> float:
        """Unit roundoff ``2^{-p}``."""
        return 2.0**-self.p

    @property
    def mu(self) -> float:
        """Half the subnormal spacing, ``2^{e_min − p}`` (0 for an unbounded exponent)."""
        return 0.0 if self.e_min is None else 2.0 ** (self.e_min - self.p)

    def ulp(self, x: np.ndarray) -> np.ndarray:
        """Spacing of the format at ``|x|`` (NaN at 0 for an unbounded exponent)."""
        x = np.abs(np.asarray(x, dtype=np.float64))
        _, e = np.frexp(x)  # x = f·2^e with f ∈ [0.5, 1): floor(log2 x) = e − 1
        e = e.astype(np.float64) - 1
        if self.e_min is None:
            return np.where(x > 0, np.exp2(e - self.p + 1), np.nan)
        return np.exp2(np.maximum(np.where(x > 0, e, self.e_min), self.e_min) - self.p + 1)


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("float64", 53, -1022),
        Format("float32", 24, -126),
        Format("bfloat16", 8, -126),
        Format("float16", 11, -14),
        Format("e4m3", 4, -6),
        Format("e5m2", 3, -14),
        Format("e2m1", 2, 0),
    )
}


ALIASES = {
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "float": "float32",
    "single": "float32",
    "fp64": "float64",
    "double": "float64",
    "fp8": "e4m3",
    "fp8-e4m3": "e4m3",
    "fp8-e5m2": "e5m2",
    "e4m3fn": "e4m3",
    "float8_e4m3fn": "e4m3",
    "float8_e5m2": "e5m2",
    "fp4": "e2m1",
    "float4_e2m1fn": "e2m1",
}
LARGEST = {
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
    "float32": 3.4028234663852886e38,
    "float64": 1.7976931348623157e308,
    "e4m3": 448.0,  # e4m3fn: no infinity, the top exponent holds numbers up to 448
    "e5m2": 57344.0,
    "e2m1": 6.0,  # OCP MX FP4: no infinity, no NaN
}  # the largest finite number of each format
LONGDOUBLE_NAMES = ("longdouble", "float128", "float96")


def get_format(name: str) -> Format:
    """A format by name: an IEEE/FP8 name above, or ``pN`` for N bits, unbounded exponent."""
    if name in FORMATS:
        return FORMATS[name]
    match = re.fullmatch(r"p(\d+)", name)
    if match and int(match.group(1)) >= 2:
        return Format(name, int(match.group(1)), None)
    raise ValueError(f"unknown number format {name!r}; use one of {sorted(FORMATS)} or pN")


def canonical_name(name: str) -> str:
    """The table's name of a format (``fp16`` → ``float16``; ``pN`` and ``longdouble``
    kept); a ValueError names the accepted formats."""
    canonical = ALIASES.get(name, name)
    if canonical != "longdouble":
        get_format(canonical)
    return canonical


def format_names(items: str | Iterable[str]) -> tuple[str, ...]:
    """Format names as ``--dtypes`` and ``--supports dtypes=`` take them: one string or
    several, each holding names separated by spaces or ``+`` (``float32+float16``,
    ``"float32 float16"``, ``fp16``), each made canonical (:func:`canonical_name`, which
    names the accepted formats for an unknown one); repeats kept once, in order."""
    parts = [items] if isinstance(items, str) else list(items)
    names = [canonical_name(x) for part in parts for x in re.split(r"[\s+]+", part) if x]
    if not names:
        raise ValueError(f"no format named in {items!r}; use one of {sorted(FORMATS)}")
    return tuple(dict.fromkeys(names))


def number_format(spec: Any) -> Format:
    """A :class:`Format` from a name (``fp16``, ``bf16``, ``float32``, ``e4m3``, ``p11`` …),
    a NumPy or torch dtype, or a Format (returned as is).

    ``pN`` is ``N`` significand bits with an unbounded exponent (mpmath, emulated formats).
    """
    if isinstance(spec, Format):
        return spec
    if isinstance(spec, np.dtype) or (isinstance(spec, type) and issubclass(spec, np.generic)):
        spec = np.dtype(spec).name
    name = str(spec).removeprefix("torch.").lower()
    name = ALIASES.get(name, name)
    if name in LONGDOUBLE_NAMES:
        info = np.finfo(np.longdouble)
        return Format("longdouble", info.nmant + 1, info.minexp)
    try:
        return get_format(name)
    except ValueError:
        raise ValueError(
            f"unknown number format {spec!r}; use fp16, bf16, fp32, fp64, e4m3, e5m2, "
            "a NumPy/torch float dtype, or pN (N significand bits, unbounded exponent)"
        ) from None
