"""The `program` family: a user's mask_mod / score_mod proved exact, and refuted when broken."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

from exactattn.proofs import engine, mutants, program

from exactattn import algorithm
from exactattn.commands import prove

from . import programs

HERE = Path(__file__).parent
FILE = HERE / "programs.py"


def test_a_program_is_proved_from_the_command_line(capsys):
    argv = [f"--mask-mod={FILE}:causal", f"--score-mod={FILE}:alibi", "--max-n=2", "--heads=2"]
    assert prove.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("PROVED") == 4 and "ALL OK" in out


def test_per_batch_masks_and_empty_free_rows_are_proved():
    obligations = program.obligations_for(program.Program(programs.document, None, (2, 1)), 2)
    assert all(o.status == engine.PROVED for o in engine.run(obligations, stream=None))


def test_a_broken_merge_is_refuted_on_the_program():
    ob = program.obligations_for(program.Program(programs.causal, programs.alibi, (1, 2)), 3)
    with mock.patch.object(algorithm, "merge", mutants._merge_no_rescale(algorithm.merge)):
        (outcome,) = engine.run(ob[4:5], stream=None)
    assert outcome.status == engine.REFUTED and "program's Y" in outcome.counterexample.short()


def test_bad_program_arguments_are_usage_errors(capsys):
    assert prove.main(["--mask-mod=nocolon"]) == 2
    assert "module:function" in capsys.readouterr().err
    assert prove.main([f"--mask-mod={FILE}:missing"]) == 2
    assert "has no attribute 'missing'" in capsys.readouterr().err
    assert prove.main(["forward", f"--mask-mod={FILE}:causal"]) == 2
    assert "name no FAMILY" in capsys.readouterr().err
    assert prove.main([f"--mask-mod={FILE}:causal", "--heads=0"]) == 2
