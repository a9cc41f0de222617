"""Differential testing of exactattn's own number systems (``exactattn difftest``).

Hypothesis draws cases (:mod:`.strategies`, :mod:`.cases`); every exactattn configuration
of the target registry (:mod:`exactattn.targets`) available on the machine runs the
forward and the reverse (:mod:`.targets`); each output is compared with naive attention
in certified (flint) or high (mpmath) precision (:mod:`.reference`) within a bound derived
from the configuration's arithmetic (:mod:`.tolerance`); failures are shrunk and written
as replay files (:mod:`.runner`). ``exactattn check`` (:mod:`exactattn.testing`) runs the
same machinery over any registered target, foreign ones included.
"""
