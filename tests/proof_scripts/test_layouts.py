"""The interfaces for every length (``proofs/families/layouts_all_n.py``): each obligation is proved
on the library and refuted, with a counterexample, under its broken twin from
``proofs/families/mutants.py``."""

from __future__ import annotations

import pytest

from exactattn.proofs.engine import ledger
from exactattn.proofs.families import layouts_all_n, mutants
from tests.optional import requires

BY_NAME = {ob.name: ob for ob in layouts_all_n.obligations()}
NEEDS_Z3 = {layouts_all_n.VARLEN_MASK, layouts_all_n.VARLEN_STRUCTURE, layouts_all_n.PAGED_GATHER}


def _run(name: str) -> ledger.Outcome:
    if name in NEEDS_Z3:
        requires("z3")
    (outcome,) = ledger.run([BY_NAME[name]], stream=None)
    return outcome


@pytest.mark.parametrize("name", list(BY_NAME))
def test_each_all_n_interface_obligation_is_proved(name):
    outcome = _run(name)
    assert outcome.status == ledger.PROVED, outcome.detail


KILLS = [
    ("PackedSequences.tile: keys read one position right", layouts_all_n.VARLEN_MASK),
    ("packed_tile_kind: the keys' sequences read one late", layouts_all_n.VARLEN_STRUCTURE),
    ("cache_row: key t at row (t + 1) mod P of its page", layouts_all_n.PAGED_GATHER),
    ("new_row: appended keys read one row early", layouts_all_n.PAGED_GATHER),
    ("merge.fold: the last part dropped", layouts_all_n.MERGE_FOLD),
    ("sinks.initial_summary: the sink's value 1", layouts_all_n.SINK_START),
    ("sinks.sink_gradient: sign flipped", layouts_all_n.SINK_GRADIENT),
]


@pytest.mark.parametrize(("mutant", "name"), KILLS)
def test_each_broken_twin_is_refuted_with_a_counterexample(mutant, name):
    with mutants.BY_NAME[mutant].applied():
        outcome = _run(name)
    assert outcome.status == ledger.REFUTED, outcome.detail
    assert outcome.counterexample is not None and outcome.counterexample.point
