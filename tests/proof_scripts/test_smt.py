"""The SMT family: it proves the iterator's statements, refutes each broken formula with a
model, and says SKIPPED — never PROVED — without z3."""

from __future__ import annotations

import sys

import pytest

from exactattn.core import masks
from exactattn.proofs.engine import ledger, solver
from exactattn.proofs.families import blockmask, mutants, smt
from tests.optional import requires

BY_NAME = {ob.name: ob for ob in smt.obligations()}
NEEDS_NO_SOLVER = {smt.COMPOSITION[1], smt.LOOP[2]}


def _run(name: str) -> ledger.Outcome:
    (outcome,) = ledger.run([BY_NAME[name]], stream=None)
    return outcome


def test_every_obligation_is_proved():
    requires("z3")
    outcomes = ledger.run(smt.obligations(), stream=None)
    assert [o.status for o in outcomes] == [ledger.PROVED] * len(outcomes), [
        (o.obligation.name, o.detail) for o in outcomes if o.status != ledger.PROVED
    ]


# (mutant, the obligation that must refute it with a model / a configuration)
KILLS = [
    ("alignment offset: sign flipped", smt.WINDOW[0]),
    ("window_row_span: stop one row short", smt.WINDOW[1]),
    ("window_row_span: stop not clamped to n_q", smt.WINDOW[1]),
    ("window_tile_kind: FULL one key too wide", smt.WINDOW[2]),
    ("window_tile_kind: EMPTY one key too early", smt.WINDOW[2]),
    ("padding_tile_kind: FULL once the shortest length reaches e − 1", smt.PADDING[0]),
    ("And.classify: FULL if any part is FULL", smt.COMPOSITION[0]),
    ("Or.classify: EMPTY if any part is EMPTY", smt.COMPOSITION[0]),
    ("Or.row_span: the intersection of the parts' spans", smt.COMPOSITION[1]),
    ("Band.intersect: the wider window side kept", smt.LOWERING),
    ("tiles: row runs overlap by one row", smt.LOOP[2]),
    ("tiles: row runs skip their first row", smt.LOOP[2]),
    ("key_block: the last key block runs past n_k", smt.LOOP[3]),
    ("row_run: runs after the first start one row late", smt.LOOP[4]),
    ("runs: the loop resumes one past each run's end", smt.LOOP[3]),
    ("create_block_mask restated: the padding rounds down", blockmask.CONSTRUCTION),
    ("blocks_of: a tile's last block dropped", blockmask.KIND),
    ("block_rows: the span stops one block early", blockmask.SPAN),
]


@pytest.mark.parametrize(("mutant", "obligation"), KILLS)
def test_each_broken_formula_is_refuted_with_a_counterexample(mutant, obligation):
    if obligation not in NEEDS_NO_SOLVER:
        requires("z3")
    with mutants.BY_NAME[mutant].applied():
        outcome = _run(obligation)
    assert outcome.status == ledger.REFUTED, outcome.detail
    cex = outcome.counterexample
    assert cex is not None and cex.point and cex.lhs != cex.rhs


def test_a_refutation_prints_the_model():
    requires("z3")
    with mutants.BY_NAME["window_row_span: stop not clamped to n_q"].applied():
        line = _run(smt.WINDOW[1]).line()
    assert "counterexample" in line and "stop =" in line and "n_q=" in line


def test_the_loop_statements_can_fail():
    """The partition and counting claims are not vacuous: a run end without the min is not
    inside [s, e), and a tile counted without its kind contract over-counts."""
    requires("z3")
    s, e, w, f = solver.ints("s e w f")
    with pytest.raises(ledger.Refuted, match="false"):
        solver.prove("a run [f, f + w) is inside [s, e)", f + w <= e, [w >= 1, s <= f, f < e])
    solver.prove("a run [f, min(f + w, e)) is inside [s, e)", solver.Z3.min(f + w, e) <= e)


def test_the_iterators_own_formulas_run_on_symbols_and_a_changed_one_is_refuted():
    """The all-n obligations call ``algorithm.key_block`` / ``row_run`` / ``run_widths`` /
    ``runs`` themselves: a change there (not in a copy) is what they refute."""
    requires("z3")
    assert _run(smt.LOOP[3]).status == ledger.PROVED
    with mutants.BY_NAME["key_block: the last key block runs past n_k"].applied():
        outcome = _run(smt.LOOP[3])
    assert outcome.status == ledger.REFUTED and "n_k=" in outcome.counterexample.short()
    with mutants.BY_NAME["row_run: runs after the first start one row late"].applied():
        assert _run(smt.LOOP[4]).status == ledger.REFUTED


def test_a_solver_unknown_or_timeout_is_unknown_never_proved():
    requires("z3")
    x, y, z = solver.ints("x y z")
    hard = [x >= 1, y >= 1, z >= 1, x * x * x + y * y * y == z * z * z]  # Fermat, n = 3

    def check() -> None:
        solver.prove("no cubes add up to a cube", x < 0, hard, timeout_ms=1)

    outcome = ledger.outcome(ob := ledger.Obligation("smt", "hard", "-", check), ledger.check(ob))
    assert outcome.status == ledger.UNKNOWN and not outcome.ok
    assert "UNKNOWN" in outcome.line() and "PROVED" not in outcome.line()
    assert "1 FAILED" in ledger.summary([outcome], 1.0)
    twin = ledger.Obligation("mutants", "m", "-", check, expect_refuted=True)
    assert not ledger.outcome(twin, ledger.check(twin)).ok  # a mutant left unknown: not killed


def test_paths_explores_every_outcome_of_the_codes_comparisons():
    requires("z3")
    paths = solver.Paths()
    a, b = paths.symbol("a"), paths.symbol("b")
    results = paths.explore(lambda: min(a, b))
    assert len(results) == 2
    assert {str(r.term) for _, r in results} == {"a", "b"}
    paths = solver.Paths()
    a, b = paths.symbol("a"), paths.symbol("b")
    paths.hypotheses.append(a.term < b.term)
    assert [str(r.term) for _, r in paths.explore(lambda: min(a, b))] == ["a"]


def test_the_structure_formulas_run_on_solver_terms_unchanged():
    requires("z3")
    z3 = solver.load()
    a, e, n_q = z3.Ints("a e n_q")
    start, stop = masks.window_row_span(None, 0, 0, a, e, n_q, solver.Z3)
    assert "a" in str(start) and str(stop) == "n_q"


def test_without_z3_the_solver_obligations_are_skipped_never_proved(monkeypatch):
    monkeypatch.setitem(sys.modules, "z3", None)
    solver.load.cache_clear()
    try:
        outcomes = ledger.run(smt.obligations(), stream=None)
        skipped = [o for o in outcomes if o.status == ledger.SKIPPED]
        assert {o.obligation.name for o in skipped} == set(BY_NAME) - NEEDS_NO_SOLVER
        assert all("pip install 'exactattn[proofs]'" in o.detail for o in skipped)
        assert all(o.ok for o in outcomes)  # SKIPPED is not a failure ...
        summary = ledger.summary(outcomes, 1.0)
        proved = len(NEEDS_NO_SOLVER)
        assert f"{proved} proved" in summary and f"{len(skipped)} skipped" in summary
        # ... and a mutant only the solver judges is SKIPPED, not "not killed"
        probes = {"smt": [BY_NAME[smt.LOWERING]]}
        wider = mutants.BY_NAME["Band.intersect: the wider window side kept"]
        with pytest.raises(ledger.Skipped, match="exactattn\\[proofs\\]"):
            mutants.kill(wider, probes, {})
    finally:
        solver.load.cache_clear()
