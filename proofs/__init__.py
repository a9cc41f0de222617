"""exactattn proofs: symbolic proof scripts that run the library's own tiled code over sympy.

One module per theorem family — :mod:`.monoid`, :mod:`.forward`, :mod:`.reverse`,
:mod:`.general`, :mod:`.overflow`, :mod:`.mutants` — each stating its theorem in its
docstring and exposing ``obligations(max_n)``. :mod:`.cli` runs them
(``exactattn prove`` or ``python -m proofs`` from a checkout); :mod:`.symbolic` is the
zero test, :mod:`.numeric` finds counterexamples, :mod:`.engine` runs and reports.
"""
