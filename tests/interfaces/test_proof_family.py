"""The interfaces proof family: its obligations prove and its broken twins are refuted."""

from __future__ import annotations

import pytest

from exactattn.proofs.engine import ledger
from exactattn.proofs.families import interfaces


def _run(obligations):
    return [ledger.outcome(ob, ledger.check(ob)) for ob in obligations]


def test_every_broken_twin_is_refuted_with_a_counterexample():
    twins = [ob for ob in interfaces.obligations(3) if ob.expect_refuted]
    assert len(twins) == 4
    for outcome in _run(twins):
        assert outcome.status == ledger.REFUTED, (outcome.obligation.name, outcome.detail)


def test_a_few_obligations_prove():
    fast = [
        interfaces.varlen(interfaces.VARLEN_LENGTHS[2], True),
        interfaces.sinks_exact(1, 2),
        interfaces.merge_partition(2, [[0], [1]]),
        interfaces.merge_without_overflow(),
    ]
    for outcome in _run(fast):
        assert outcome.status == ledger.PROVED, (outcome.obligation.name, outcome.detail)


@pytest.mark.slow
def test_the_whole_family_proves():
    outcomes = _run(interfaces.obligations(4))
    assert all(o.ok for o in outcomes), [o.obligation.name for o in outcomes if not o.ok]
