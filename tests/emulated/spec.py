"""The specification side of the emulator tests, written from the definitions alone.

* :func:`spec_round`: ``fl(x)`` in a format ``F(p, e_min, e_max)`` computed in exact
  rational arithmetic (``fractions.Fraction``; Python's ``round`` ties to even);
* :func:`mpmath_round`: mpmath's rounding of a float64 to ``p`` bits (``from_float``);
* :class:`ReferenceMpmath`: mpmath at ``prec = p`` with every ``+ − × ÷`` rounded by mpmath
  in the given mode, and ``exp``/``log`` correctly rounded (evaluated 64 bits wider, then
  rounded once). mpmath's own ``exp`` at ``prec = p`` is not correctly rounded: it returns
  the far neighbour of a near-midpoint value in about 1 of 10^4 arguments (measured, for
  p = 8..52), while libm's float64 exp rounded to ``p`` bits never did for p ≤ 32;
* :func:`edge_values`: float64 inputs that exercise every branch of a rounding.

None of this calls :mod:`exactattn.backends.emulated_backend`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from fractions import Fraction

import mpmath
import numpy as np

import exactattn as ea

MPMATH_MODE = {"nearest": "n", "toward_zero": "d"}


def spec_round(x: float, p: int, emin=None, emax=None, mode: str = "nearest") -> float:
    """``fl(x)``: ``N·2^{e−p+1}``, ``e = max(⌊log₂|x|⌋, e_min)``, ``N`` rounded per ``mode``."""
    if not math.isfinite(x) or x == 0:
        return x
    a = Fraction(abs(x))
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1  # now 2^e <= a < 2^(e+1)
    if emin is not None:
        e = max(e, emin)
    quantum = Fraction(2) ** (e - p + 1)
    n = a / quantum
    r = (round(n) if mode == "nearest" else math.floor(n)) * quantum
    emax = 1023 if emax is None else emax  # an unbounded format still lives in float64
    if r >= Fraction(2) ** (emax + 1):
        largest = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
        r = math.inf if mode == "nearest" else largest
    return math.copysign(float(r), x)


def mpmath_round(x: float, p: int, mode: str) -> float:
    """mpmath's rounding of ``x`` to ``p`` bits (unbounded exponent); IEEE's sign on zero."""
    if not math.isfinite(x):
        return x
    r = mpmath.libmp.to_float(mpmath.libmp.from_float(x, p, MPMATH_MODE[mode]))
    return math.copysign(r, x) if r == 0 else r


def same_bits(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Elementwise: the same float64 word, or both NaN."""
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    return (got.view(np.int64) == expected.view(np.int64)) | (np.isnan(got) & np.isnan(expected))


def same_values(got: np.ndarray, expected_mpf: np.ndarray) -> np.ndarray:
    """Elementwise: the float64 value equals the mpf value (p ≤ 53 bits: exactly convertible)."""
    expected = np.array([float(e) for e in np.asarray(expected_mpf).flat]).reshape(
        np.shape(expected_mpf)
    )
    return same_bits(np.asarray(got, dtype=np.float64) + 0.0, expected + 0.0)  # −0 == +0


class ReferenceMpmath(ea.MpmathContext):
    """mpmath at ``prec = p`` rounding every operation in ``mode``; exp/log correctly rounded.

    The rounding mode of mpf arithmetic is mpmath's ``_prec_rounding`` pair; it is set
    only inside :meth:`scope` and restored on exit, like the precision.
    """

    def __init__(self, prec: int, mode: str = "nearest"):
        super().__init__(prec)
        self.mode = MPMATH_MODE[mode]
        self.name = f"reference-mpmath[prec={prec},{mode}]"

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        with super().scope():
            saved = mpmath.mp._prec_rounding[1]
            mpmath.mp._prec_rounding[1] = self.mode
            try:
                yield
            finally:
                mpmath.mp._prec_rounding[1] = saved

    def _rounded(self, fn, x: np.ndarray) -> np.ndarray:
        def one(e):
            with mpmath.workprec(self.prec + 64):
                wide = fn(e)
            return mpmath.mpf(mpmath.libmp.mpf_pos(wide._mpf_, self.prec, self.mode))

        return np.asarray(np.frompyfunc(one, 1, 1)(x), dtype=object)

    def exp(self, x: np.ndarray) -> np.ndarray:
        return self._rounded(mpmath.exp, x)

    def log(self, x: np.ndarray) -> np.ndarray:
        return self._rounded(mpmath.log, x)


def edge_values(rng: np.random.Generator, p: int, emin=None, emax=None) -> np.ndarray:
    """Random words, ties at ``p`` bits and their neighbours, carries, subnormals, overflow."""
    low = -1074 + p if emin is None else emin - 3
    high = 1000 if emax is None else emax
    exponents = rng.integers(low, high + 1, size=120)
    significands = rng.integers(2 ** (p - 1), 2**p, size=120)
    significands[:8] = 2**p - 1  # the tie above rounds up into the next binade
    ties = np.ldexp((2 * significands + 1).astype(np.float64), exponents - p)
    words = rng.integers(0, 2**63 - 2**52, size=300, dtype=np.int64)  # any finite magnitude
    near = np.ldexp(rng.random(120) + 1, rng.integers(low, high + 1, size=120))
    subnormal64 = np.ldexp(rng.integers(1, 2**52, size=40).astype(np.float64), -1074)
    parts = [
        ties,
        np.nextafter(ties, np.inf),
        np.nextafter(ties, -np.inf),
        words.view(np.float64),
        near,
        subnormal64,
        [0.0, 5e-324, 2.0**-1022, np.finfo(np.float64).max, 1.0, 1.5, 2.5, 3.5],
    ]
    if emin is not None:
        n = rng.integers(0, 2 ** (p - 1), size=60)
        n[:2] = [0, 2 ** (p - 1) - 1]  # half the smallest subnormal; the carry into 2^emin
        sub_ties = np.ldexp((2 * n + 1).astype(np.float64), emin - p)
        parts += [sub_ties, np.nextafter(sub_ties, np.inf), np.nextafter(sub_ties, 0)]
    if emax is not None:
        largest = np.ldexp(2.0 - 2.0 ** (1 - p), emax)
        tie = largest + np.ldexp(1.0, emax - p)  # halfway to 2^(emax+1): rounds to +inf
        parts.append([largest, np.nextafter(largest, np.inf), tie, np.nextafter(tie, 0)])
        if emax < 1022:
            parts.append(np.ldexp(1.0, [emax + 1, emax + 2]))
    values = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in parts])
    return np.concatenate([values, -values])
