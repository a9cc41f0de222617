"""Differential testing across number systems (``exactattn difftest``).

Hypothesis draws cases (:mod:`.strategies`, :mod:`.cases`); every backend available on
the machine (:mod:`.targets`) runs the forward and the reverse; each output is compared
with naive attention in certified (flint) or high (mpmath) precision (:mod:`.reference`)
within a bound derived from the configuration's unit roundoff and the problem size
(:mod:`.tolerance`); failures are shrunk and written as replay files (:mod:`.runner`).
"""

from .cases import Case, Spec, build_case
from .check import Finding, check_case
from .runner import run, save_failures
from .targets import Target, discover

__all__ = [
    "Case",
    "Finding",
    "Spec",
    "Target",
    "build_case",
    "check_case",
    "discover",
    "run",
    "save_failures",
]
