"""The proof context's realness shortcut (:func:`exactattn.proofs.engine.context._real`)."""

from __future__ import annotations

import numpy as np
import pytest
import sympy

from exactattn.proofs.engine import context

X, Y = sympy.Symbol("x", real=True), sympy.Symbol("y", real=True)


def test_real_by_form_covers_what_the_algorithm_builds():
    shared = sympy.exp(X - Y, evaluate=False)
    assert context._real(X * shared / (1 + shared) + sympy.Rational(1, 3) * Y**2)


@pytest.mark.parametrize(
    "expr",
    [sympy.log(X), X * sympy.I, sympy.Symbol("z") + 1, sympy.sqrt(X), -sympy.oo],
    ids=["log", "imaginary unit", "symbol of unknown kind", "half power", "minus infinity"],
)
def test_anything_else_is_not_shown_real_and_goes_to_sympy(expr):
    assert not context._real(expr)


def test_the_proof_context_still_rejects_a_complex_input():
    ctx = context.ProofContext()
    assert ctx.asarray(np.array([X * sympy.exp(Y, evaluate=False)], dtype=object))[0] is not None
    with pytest.raises(TypeError, match="real"):
        ctx.asarray(np.array([X + sympy.I], dtype=object))
