"""The `program` family: a user's mask_mod / score_mod proved exact, and refuted when broken."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

from exactattn.commands import prove
from exactattn.core import algorithm
from exactattn.proofs.engine import ledger
from exactattn.proofs.families import flex_program, mutants

from . import programs

HERE = Path(__file__).parent
FILE = HERE / "programs.py"


def test_a_program_is_proved_from_the_command_line(capsys):
    argv = [f"--mask-mod={FILE}:causal", f"--score-mod={FILE}:alibi", "--max-n=2", "--heads=2"]
    assert prove.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("PROVED") == 4 and "ALL OK" in out


def test_per_batch_masks_and_empty_free_rows_are_proved():
    obligations = flex_program.obligations_for(
        flex_program.Program(programs.document, None, (2, 1)), 2
    )
    assert all(o.status == ledger.PROVED for o in ledger.run(obligations, stream=None))


def test_a_broken_merge_is_refuted_on_the_program():
    ob = flex_program.obligations_for(
        flex_program.Program(programs.causal, programs.alibi, (1, 2)), 3
    )
    with mock.patch.object(algorithm, "merge", mutants._merge_no_rescale(algorithm.merge)):
        (outcome,) = ledger.run(ob[4:5], stream=None)
    assert outcome.status == ledger.REFUTED and "program's Y" in outcome.counterexample.short()


def test_bad_program_arguments_are_usage_errors(capsys):
    assert prove.main(["--mask-mod=nocolon"]) == 2
    assert "module:function" in capsys.readouterr().err
    assert prove.main([f"--mask-mod={FILE}:missing"]) == 2
    assert "has no attribute 'missing'" in capsys.readouterr().err
    assert prove.main(["forward", f"--mask-mod={FILE}:causal"]) == 2
    assert "name no FAMILY" in capsys.readouterr().err
    assert prove.main([f"--mask-mod={FILE}:causal", "--heads=0"]) == 2


# --- every length (--all-n) ------------------------------------------------------------------
FLEX = HERE / "flex_programs.py"


def _all_n(fn: str, **options) -> list[ledger.Outcome]:
    from tests.optional import requires

    requires("z3")
    requires("torch")
    mods = {k: flex_program.load(f"{FLEX}:{v}", k) for k, v in options.pop("mods", {}).items()}
    mask_mod = flex_program.load(f"{FLEX}:{fn}", "mask_mod")
    pb = flex_program.Program(mask_mod, None, all_n=True, **mods, **options)
    obligations = [
        o for o in flex_program.all_n_obligations(pb, 3) if o.family == flex_program.FAMILY
    ]
    return ledger.run(obligations, stream=None)


def test_flexattentions_examples_are_proved_for_every_length():
    for fn in ("causal", "sliding_window", "prefix_lm", "dilated"):
        outcomes = _all_n(fn)
        assert [o.status for o in outcomes] == [ledger.PROVED] * 2, (fn, outcomes)
    document = _all_n("document", assume=(("DOCUMENT", "nondecreasing"),))
    assert [o.status for o in document] == [ledger.PROVED] * 2


def test_a_sound_block_structure_is_proved_and_a_wrong_one_refuted_at_the_smallest_length():
    right = _all_n("causal", mods={"block_mod": "causal_blocks"})
    assert "block structure" in right[-1].obligation.name
    assert right[-1].status == ledger.PROVED
    outcome = _all_n("causal", mods={"block_mod": "causal_blocks_diagonal_full"})[-1]
    assert outcome.status == ledger.REFUTED
    cex = outcome.counterexample
    assert cex.point["n"] == "2" and cex.lhs == "FULL" and cex.rhs == "masked"
    assert int(cex.point["i"]) < int(cex.point["j"])  # a pair above the diagonal, in a FULL block


def test_a_mod_that_cannot_be_traced_names_the_operation_and_the_enumerated_proof_runs(capsys):
    from tests.optional import requires

    requires("z3")
    requires("torch")
    argv = [f"--mask-mod={FLEX}:near_in_floats", "--all-n", "--max-n=2"]
    assert prove.main(argv) == 1
    out = capsys.readouterr().out
    assert "UNDECIDED" in out and "not traced for all n: the tensor method .float()" in out
    assert out.count("program   forward:") == 2 and "forward" in out
    assert all("PROVED" in line for line in out.splitlines() if "program   forward" in line)


def test_the_tracer_reads_where_and_refuses_a_python_if():
    from tests.optional import requires

    requires("z3")
    requires("torch")
    import torch

    from exactattn.proofs.engine import trace

    found = trace.trace(lambda b, h, i, j: torch.where(i >= j, True, False) & (j >= 0))
    assert "If" in str(found.allowed)

    def branching(b, h, i, j):
        return i >= j if i > 0 else j == 0

    try:
        trace.trace(branching)
    except trace.Untraceable as error:
        assert "Python if" in str(error)
    else:
        raise AssertionError("a Python if on an index was traced")


def test_all_n_options_are_checked(capsys):
    assert prove.main([f"--mask-mod={FLEX}:document", "--assume=DOCUMENT:sorted", "--all-n"]) == 2
    assert "ARRAY:nondecreasing" in capsys.readouterr().err
    assert prove.main([f"--mask-mod={FLEX}:causal", f"--block-mod={FLEX}:causal_blocks"]) == 2
    assert "add --all-n" in capsys.readouterr().err


def test_the_all_n_example_the_mutants_are_judged_by_is_proved():
    from tests.optional import requires

    requires("z3")
    outcomes = ledger.run(flex_program.example_obligations(), stream=None)
    assert [o.status for o in outcomes] == [ledger.PROVED] * 3
    assert {m.name for m in mutants.MUTANTS if m.of_the_proofs} == {
        "trace: q_idx ≥ kv_idx traced as q_idx > kv_idx",
        "block structure: the diagonal (partial) blocks marked FULL",
        "create_block_mask restated: the padding rounds down",
    }
