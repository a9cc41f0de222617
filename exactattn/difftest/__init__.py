"""Differential testing of exactattn's own number systems (``exactattn difftest``).

Hypothesis draws cases (:mod:`exactattn.cases.strategies`, :mod:`exactattn.cases`); every exactattn
configuration of the target registry (:mod:`exactattn.targets`) available on the machine runs the
forward and the reverse (:mod:`.targets`); each output is compared with certified naive
attention (:mod:`exactattn.oracle.certified`) within the bound of the configuration's arithmetic
(:mod:`exactattn.error.bounds`), both through :mod:`exactattn.testing.tolerance`; failures are
shrunk and written as replay files (:mod:`exactattn.difftest.campaign`). ``exactattn check``
(:mod:`exactattn.testing`) runs the same machinery over any registered target, foreign ones
included.
"""
