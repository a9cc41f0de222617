"""exactattn proofs: symbolic proof scripts that run the library's own tiled code over sympy.

One module per theorem family — :mod:`exactattn.proofs.families.monoid`,
:mod:`exactattn.proofs.families.forward`, :mod:`exactattn.proofs.families.reverse`,
:mod:`exactattn.proofs.families.general`, :mod:`exactattn.proofs.families.overflow`,
:mod:`exactattn.proofs.families.mutants`, :mod:`exactattn.proofs.families.tiles`,
:mod:`exactattn.proofs.families.dropout_bits`,
:mod:`exactattn.proofs.families.score_mods`, :mod:`exactattn.proofs.families.smt` and the opt-in
:mod:`exactattn.proofs.families.reach` — each stating its theorem in its docstring and exposing
``obligations(max_n)``. :mod:`exactattn.proofs.proof_run` names and runs them (the command is
:mod:`exactattn.commands.prove`: ``exactattn prove``, or ``python -m proofs`` from a checkout). The
specification side is :mod:`exactattn.proofs.engine.symbolic_spec` (written from the definitions,
never calling the code under test); :mod:`exactattn.proofs.engine.symbols`,
:mod:`exactattn.proofs.engine.mask_grid` and :mod:`exactattn.proofs.engine.checks` build the
symbolic problems and run the library on them over :mod:`exactattn.proofs.engine.context` (the sympy
backend with a free max) and :mod:`exactattn.proofs.engine.terms` (the same with light exact terms,
for the enumerated runs); :mod:`exactattn.proofs.engine.zero_test` is the zero test,
:mod:`exactattn.proofs.engine.solver` the SMT side (z3, the ``proofs`` extra),
:mod:`exactattn.proofs.engine.counterexamples` finds counterexamples,
:mod:`.engine` runs the obligations, :mod:`exactattn.proofs.engine.coverage_matrix` and
:mod:`.certificate` write the report, :mod:`.mutation` runs the tests against the mutants.
"""
