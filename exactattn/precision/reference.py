"""The certified reference: the library's tiled code over arb balls (python-flint).

:class:`~exactattn.backends.flint_backend.FlintContext` runs ``exactattn.attention`` and
``attention_backward`` unchanged; every output is a ball that encloses the exact value for
the given float64 inputs (and the float64 scale ``c``). The sweep measures every
configuration against the balls' midpoints, stored as double-double pairs
``(hi, lo)`` with ``mid ≈ hi + lo`` so that even float64 runs are measured against a
reference far more accurate than themselves; ``radius`` is the largest ball radius over
Y and the gradients, a certificate that the reference is exact to that absolute accuracy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import api
from ..backends.flint_backend import FlintContext

OUTPUTS = ("y", "dq", "dk", "dv")


@dataclass
class Reference:
    """Midpoints ``hi + lo`` per output, the largest radius, and the time it took."""

    hi: dict[str, np.ndarray]
    lo: dict[str, np.ndarray]
    radius: float
    seconds: float
    prec: int
    extra: dict[str, Any] = field(default_factory=dict)


def split_balls(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """arb balls → ``(hi, lo, largest radius)``, ``hi = fl(mid)``, ``lo = fl(mid − hi)``."""
    flat = list(np.asarray(x, dtype=object).flat)
    hi = np.array([float(e) for e in flat], dtype=np.float64)
    lo = np.array([float(e.mid() - h) for e, h in zip(flat, hi)], dtype=np.float64)
    radius = max((float(e.rad()) for e in flat), default=0.0)
    return hi.reshape(x.shape), lo.reshape(x.shape), radius


def certified_reference(
    inputs: dict[str, np.ndarray],
    *,
    scale: float,
    mask: Any = None,
    prec: int = 200,
    block_size: int = 256,
    grads: bool = True,
) -> Reference:
    """Enclosures of ``Y`` (and ``dQ, dK, dV`` at upstream ``G`` when ``grads``)."""
    ctx = FlintContext(prec)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    keywords = dict(scale=scale, mask=mask, block_size=block_size, backend=ctx)
    start = time.perf_counter()
    y, stats = api.attention(q, k, v, return_stats=True, **keywords)
    outputs = {"y": y}
    if grads:
        outputs["dq"], outputs["dk"], outputs["dv"] = api.attention_backward(
            q, k, v, y, stats, inputs["g"], **keywords
        )
    seconds = time.perf_counter() - start
    hi, lo, radius = {}, {}, 0.0
    for name, x in outputs.items():
        hi[name], lo[name], r = split_balls(x)
        radius = max(radius, r)
    return Reference(hi=hi, lo=lo, radius=radius, seconds=seconds, prec=prec)
