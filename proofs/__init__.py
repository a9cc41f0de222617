"""exactattn proofs: symbolic proof scripts that run the library's own tiled code over sympy.

One module per theorem family — :mod:`.monoid`, :mod:`.forward`, :mod:`.reverse`,
:mod:`.general`, :mod:`.overflow`, :mod:`.mutants`, :mod:`.tiles`, :mod:`.dropout`,
:mod:`.scores`, :mod:`.smt` and the opt-in :mod:`.reach` — each stating its theorem in its
docstring and exposing ``obligations(max_n)``. :mod:`.runner` names and runs them (the
command is :mod:`exactattn.commands.prove`: ``exactattn prove``, or ``python -m proofs``
from a checkout). The specification side is :mod:`.spec` (written from the definitions,
never calling the code under test); :mod:`.inputs`, :mod:`.grid` and :mod:`.checks` build
the symbolic problems and run the library on them over :mod:`.context` (the sympy backend
with a free max) and :mod:`.terms` (the same with light exact terms, for the enumerated
runs); :mod:`.symbolic` is the zero test, :mod:`.solver` the SMT side (z3, the
``proofs`` extra), :mod:`.numeric` finds counterexamples, :mod:`.engine` runs the
obligations, :mod:`.coverage` and :mod:`.certificate` write the report, :mod:`.mutation`
runs the tests against the mutants.
"""
