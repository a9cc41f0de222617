"""The named input distributions of every case (float64 entries, i.i.d.), in one table.

The precision sweep's (:func:`make_inputs`: ``Q, K, V`` and ``G`` of one problem):

* ``normal``: N(0, 1);
* ``fa3-outliers``: N(0, 1) + N(0, 100)·Bernoulli(0.001), FlashAttention-3 §4.3's inputs
  with rare large outliers (standard deviation 10);
* ``large-logits``: N(0, 16), so the scores ``c·q·k`` have standard deviation 16 at the
  default scale (softmax nearly one-hot, exponent range stressed).

* ``sink-A`` (``A`` a whole number): N(0, 1) with an *attention sink* of strength ``A``:
  every query's first coordinate is 1 and key 0 is ``(A·√d, 0, …, 0)``, so at the default
  scale ``c = 1/√d`` key 0 scores exactly ``A`` against every row, while the other scores
  stay ``~N(0, 1)`` (``c²(1 + Σ_{r>0} q_ir²) ≈ 1``): arXiv:2606.06521's sink.

``G`` is always N(0, 1). The generator's seed is a pure function of the sweep seed, the
distribution and the sizes, so every grid point sees the same inputs in every run, on
every worker, whatever the order.

The drawn cases' (``exactattn check`` and difftest, :func:`exactattn.cases.build_case`,
one array at a time from the case's data seed):

* ``outliers``: N(0, 1) + N(0, 100)·Bernoulli(0.05), FlashAttention-3's outliers made
  denser so that a small case holds one;
* ``tiny``: N(0, 10^-12) (entries near 10^-6: underflow of products in low precision);
* ``uniform_int``: integers uniform in −3..3 (exact in every format: ties and equal
  scores);
* ``large_logits``: N(0, 1) entries whose scale ``c`` the case sets so that the largest
  ``|s_ij|`` is the drawn logit.

A name keeps its meaning (the seeds of replay files and sweeps depend on it): a new
distribution is a new name.
"""

from __future__ import annotations

import math
import re
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


def _outliers(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    spikes = rng.random(shape) < 0.05
    return rng.standard_normal(shape) + 10 * rng.standard_normal(shape) * spikes


def _tiny(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape) * 1e-6


def _uniform_int(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(-3, 4, size=shape).astype(np.float64)


DISTRIBUTIONS: dict[str, Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]] = {
    "normal": _normal,
    "fa3-outliers": _fa3_outliers,
    "large-logits": _large_logits,
    "outliers": _outliers,
    "tiny": _tiny,
    "uniform_int": _uniform_int,
    "large_logits": _normal,
}
SWEPT = ("normal", "fa3-outliers", "large-logits")  # what make_inputs draws (and sink-A)
SINK = re.compile(r"sink-(\d+)")


def fill(rng: np.random.Generator, shape: tuple[int, ...], name: str) -> np.ndarray:
    """One array of ``shape`` drawn from the distribution ``name``."""
    if name not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {sorted(DISTRIBUTIONS)}; got {name!r}")
    return DISTRIBUTIONS[name](rng, shape)


def input_seed(seed: int, dist: str, n: int, d: int) -> int:
    """The generator seed of one problem (stable across processes and Python versions)."""
    entropy = [int(seed), zlib.crc32(dist.encode()), int(n), int(d)]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0])


def make_inputs(dist: str, n: int, d: int, seed: int) -> dict[str, np.ndarray]:
    """``{"q", "k", "v", "g"}`` of shape (n, d) drawn from ``dist`` with the problem's seed."""
    sink = SINK.fullmatch(dist)
    if dist not in SWEPT and sink is None:
        raise ValueError(f"dist must be one of {sorted(SWEPT)} or sink-A; got {dist!r}")
    rng = np.random.default_rng(input_seed(seed, dist, n, d))
    draw = DISTRIBUTIONS["normal" if sink else dist]
    q, k, v = (draw(rng, (n, d)) for _ in range(3))
    if sink:
        q[:, 0] = 1.0
        k[0] = 0.0
        k[0, 0] = int(sink.group(1)) * math.sqrt(d)
    return {"q": q, "k": k, "v": v, "g": rng.standard_normal((n, d))}
