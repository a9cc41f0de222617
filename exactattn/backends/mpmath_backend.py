"""Arbitrary-precision binary floating point: mpmath ``mpf`` numbers in object arrays.

Every operation rounds to ``prec`` bits (round-to-nearest), so ``MpmathContext(prec=11)``
emulates an IEEE-half-like significand with an unbounded exponent and
``MpmathContext(prec=200)`` serves as a high-precision reference. The precision is set
only inside :meth:`scope` (``mpmath.workprec``) and restored on exit, never globally.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import mpmath
import numpy as np

from .protocol import ObjectContext


class MpmathContext(ObjectContext):
    """mpf numbers rounded to ``prec`` bits (``dps`` decimal digits may be given instead)."""

    def __init__(self, prec: int | None = None, *, dps: int | None = None):
        if prec is not None and dps is not None:
            raise ValueError("give prec or dps, not both")
        if dps is not None:
            prec = mpmath.libmp.dps_to_prec(dps)
        prec = 113 if prec is None else prec
        if isinstance(prec, bool) or not isinstance(prec, int) or prec < 2:
            raise ValueError(f"prec must be an integer >= 2 bits; got {prec!r}")
        self.prec = prec
        self.name = f"mpmath[prec={prec}]"

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        with mpmath.workprec(self.prec):
            yield

    def _convert(self, x: Any) -> mpmath.mpf:
        if isinstance(x, (np.floating, np.integer)):
            x = x.item() if not isinstance(x, np.longdouble) else mpmath.mpf(str(x))
        return mpmath.mpf(x)

    def scalar(self, x: Any) -> mpmath.mpf:
        return self._convert(x)

    def default_scale(self, d: int) -> mpmath.mpf:
        return 1 / mpmath.sqrt(d)

    @property
    def neg_inf(self) -> mpmath.mpf:
        return mpmath.mpf("-inf")

    _exp = staticmethod(mpmath.exp)
    _log = staticmethod(mpmath.log)
    _tanh = staticmethod(mpmath.tanh)
    _finite = staticmethod(mpmath.isfinite)
