"""Deterministic test inputs ``Q, K, V`` and upstream gradient ``G`` (float64).

Distributions (entries i.i.d.):

* ``normal``: N(0, 1);
* ``fa3-outliers``: N(0, 1) + N(0, 100)·Bernoulli(0.001), FlashAttention-3 §4.3's inputs
  with rare large outliers (standard deviation 10);
* ``large-logits``: N(0, 16), so the scores ``c·q·k`` have standard deviation 16 at the
  default scale (softmax nearly one-hot, exponent range stressed).

``G`` is always N(0, 1). The generator's seed is a pure function of the sweep seed, the
distribution and the sizes, so every grid point sees the same inputs in every run, on
every worker, whatever the order.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np


def _normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape)


def _fa3_outliers(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    outlier = rng.random(shape) < 0.001
    return rng.standard_normal(shape) + outlier * rng.normal(0.0, 10.0, shape)


def _large_logits(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.normal(0.0, 4.0, shape)


DISTRIBUTIONS: dict[str, Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]] = {
    "normal": _normal,
    "fa3-outliers": _fa3_outliers,
    "large-logits": _large_logits,
}


def input_seed(seed: int, dist: str, n: int, d: int) -> int:
    """The generator seed of one problem (stable across processes and Python versions)."""
    entropy = [int(seed), zlib.crc32(dist.encode()), int(n), int(d)]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0])


def make_inputs(dist: str, n: int, d: int, seed: int) -> dict[str, np.ndarray]:
    """``{"q", "k", "v", "g"}`` of shape (n, d) drawn from ``dist`` with the problem's seed."""
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"dist must be one of {sorted(DISTRIBUTIONS)}; got {dist!r}")
    rng = np.random.default_rng(input_seed(seed, dist, n, d))
    draw = DISTRIBUTIONS[dist]
    q, k, v = (draw(rng, (n, d)) for _ in range(3))
    return {"q": q, "k": k, "v": v, "g": rng.standard_normal((n, d))}
