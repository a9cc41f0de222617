"""Counter-based dropout keep-bits ``r(seed, batch·head, i, j)``, identical on every backend.

Dropout keeps weight ``p_ij`` with factor ``ρ_ij = r_ij / (1 − p)``. The reverse pass must
replay the *same* realised ``r_ij`` without storing an ``(n_q, n_k)`` mask, so ``r_ij`` is a
pure function of the seed and the indices, recomputed per tile in both passes (the same
role Philox plays in FlashAttention). The function is a chain of 32-bit integer hashes
(Wellons' "lowbias32") evaluated in int64 with every product split so nothing overflows;
it uses only ``^ >> & * +`` on integer arrays, so NumPy and torch (CPU or CUDA) produce
bit-identical keep-bits.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

MASK32 = 0xFFFFFFFF
KEEP_BITS = 24  # r_ij = 1 iff the top 24 bits of the hash are >= round(p · 2^24)


def _mul32(x: Any, c: int) -> Any:
    """``x · c mod 2^32`` for ``0 ≤ x < 2^32`` without exceeding 2^49 in int64."""
    hi, lo = c >> 16, c & 0xFFFF
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def hash32(x: Any) -> Any:
    """Wellons' lowbias32 finaliser on values in ``[0, 2^32)``."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


@dataclass(frozen=True)
class Dropout:
    """Dropout at rate ``p`` with keep-bits drawn from ``seed`` (any int in [0, 2^64))."""

    p: float
    seed: int

    def __post_init__(self) -> None:
        p = self.p
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p < 1.0:
            raise ValueError(f"dropout_p must be a number in [0, 1); got {p!r}")
        seed = self.seed
        if (
            isinstance(seed, bool)
            or not isinstance(seed, numbers.Integral)
            or not 0 <= seed < 2**64
        ):
            raise ValueError(f"seed must be an integer in [0, 2**64); got {seed!r}")
        object.__setattr__(self, "p", float(p))
        object.__setattr__(self, "seed", int(seed))

    @property
    def threshold(self) -> int:
        return round(self.p * (1 << KEEP_BITS))

    def keep(self, batch_index: Any, i: Any, j: Any) -> Any:
        """``r_ij`` as booleans: ``batch_index`` (*batch, 1, 1), ``i`` (r, 1), ``j`` (1, b)."""
        key = hash32(hash32(self.seed & MASK32) ^ (self.seed >> 32))
        key = hash32(key ^ (batch_index & MASK32))
        key = hash32(key ^ i)
        return (hash32(key ^ hash32(j)) >> (32 - KEEP_BITS)) >= self.threshold

    def factors(self, ctx: Any, batch_index: Any, i: Any, j: Any) -> Any:
        """``ρ_ij = r_ij / (1 − p)`` as a tile of the context's compute type."""
        one = ctx.scalar(1)
        return ctx.where(self.keep(batch_index, i, j), one / (one - ctx.scalar(self.p)), 0 * one)


def make_dropout(dropout_p: float, seed: int | None) -> Dropout | None:
    """``None`` for ``p = 0``; otherwise a :class:`Dropout`, which needs an explicit seed."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise ValueError(f"dropout_p must be a number in [0, 1); got {dropout_p!r}")
    if dropout_p == 0:
        return None
    if seed is None:
        raise ValueError(
            "dropout_p > 0 needs seed=<int>: the reverse pass replays the same keep-bits"
        )
    return Dropout(dropout_p, seed)
