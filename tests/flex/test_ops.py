"""exactattn.core.ops: values and derivatives of the functions a score_mod calls, per backend.

The derivative carried by a :class:`~exactattn.core.ops.Dual` is checked against sympy's own
``diff`` of the same formula written with sympy (exact), against mpmath's numerical
differentiation (60 digits), and against torch autograd of the formula on torch tensors
(float64) — three derivatives computed without the dual numbers.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import sympy

from exactattn.backends import MpmathContext, NumpyContext, SympyContext
from exactattn.core import ops
from tests.optional import requires

# (name, f written with exactattn.core.ops and operators, the same f written with sympy)
HALF, QUARTER = sympy.Rational(1, 2), sympy.Rational(1, 4)
FORMULAS = [
    ("soft-cap", lambda x: 3 * ops.tanh(x / 3), lambda x: 3 * sympy.tanh(x / 3)),
    ("exp-log", lambda x: ops.log(1 + ops.exp(x)) - 0.5,
     lambda x: sympy.log(1 + sympy.exp(x)) - HALF),
    ("sqrt-pow", lambda x: ops.sqrt(1 + x**2) * x, lambda x: sympy.sqrt(1 + x**2) * x),
    ("quotient", lambda x: (2 - x) / (1 + x * x), lambda x: (2 - x) / (1 + x * x)),
    ("abs", lambda x: ops.abs(x - 1) + abs(-x), lambda x: sympy.Abs(x - 1) + sympy.Abs(x)),
    ("where", lambda x: ops.where(x > 0.5, x * x, 1 - x),
     lambda x: sympy.Piecewise((x * x, x > HALF), (1 - x, True))),
    ("minimum", lambda x: ops.minimum(x, 0.25) * 4, lambda x: sympy.Min(x, QUARTER) * 4),
    ("maximum", lambda x: ops.maximum(0.25, x * 2), lambda x: sympy.Max(QUARTER, 2 * x)),
]  # fmt: skip
POINTS = [-1.25, -0.3, 0.1, 0.7, 2.0]


@pytest.mark.parametrize("name, f, f_sympy", FORMULAS, ids=[f[0] for f in FORMULAS])
def test_the_tangent_is_sympys_derivative(name, f, f_sympy):
    x = sympy.Symbol("x", real=True)
    ctx = SympyContext()
    out = f(ops.Dual(ctx, np.array([x], dtype=object), ctx.scalar(1)))
    want = f_sympy(x)
    for point in POINTS:  # exact comparison at rational points (Piecewise branches too)
        at = {x: sympy.nsimplify(point)}
        assert sympy.simplify(out.value[0].subs(at) - want.subs(at)) == 0
        derivative = sympy.diff(want, x).subs(at)
        assert sympy.simplify(np.broadcast_to(out.tangent, (1,))[0].subs(at) - derivative) == 0


@pytest.mark.parametrize("name, f, f_sympy", FORMULAS, ids=[f[0] for f in FORMULAS])
def test_the_tangent_is_mpmaths_numerical_derivative(name, f, f_sympy):
    ctx = MpmathContext(200)
    with ctx.scope():
        xs = np.array([mpmath.mpf(p) for p in POINTS], dtype=object)
        out = f(ops.Dual(ctx, xs, ctx.scalar(1)))
        for x, value, tangent in zip(xs, out.value, np.broadcast_to(out.tangent, xs.shape)):
            scalar = lambda t: f(ops.Dual(ctx, np.array([t], dtype=object))).value[0]  # noqa: E731
            assert abs(value - scalar(x)) == 0
            assert abs(tangent - mpmath.diff(scalar, x)) < mpmath.mpf(10) ** -50


@pytest.mark.parametrize("name, f, f_sympy", FORMULAS, ids=[f[0] for f in FORMULAS])
def test_numpy_duals_and_torch_tensors_agree_with_torch_autograd(name, f, f_sympy):
    torch = requires("torch")
    xs = torch.tensor(POINTS, dtype=torch.float64, requires_grad=True)
    y = f(xs)  # the ops dispatch to torch's functions on tensors
    (grad,) = torch.autograd.grad(y.sum(), xs)
    ctx = NumpyContext()
    out = f(ops.Dual(ctx, np.array(POINTS), ctx.scalar(1)))
    np.testing.assert_allclose(out.value, y.detach().numpy(), rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(np.broadcast_to(out.tangent, (5,)), grad.numpy(), rtol=1e-14)


def test_flint_tangents_enclose_the_derivative():
    flint = requires("flint")
    from exactattn.backends.flint_backend import FlintContext

    ctx = FlintContext(120)
    x = sympy.Symbol("x", real=True)
    with ctx.scope():
        xs = np.array([flint.arb(p) for p in POINTS], dtype=object)
        for _, f, f_sympy in FORMULAS[:5]:
            out = f(ops.Dual(ctx, xs, ctx.scalar(1)))
            for p, tangent in zip(POINTS, np.broadcast_to(out.tangent, xs.shape)):
                want = sympy.diff(f_sympy(x), x).subs(x, sympy.Rational(p)).evalf(40)
                assert tangent.overlaps(flint.arb(str(want))), (tangent, want)
                assert tangent.rad() < 1e-30


def test_overlapping_balls_cannot_choose_a_branch():
    flint = requires("flint")
    from exactattn.backends.flint_backend import FlintContext

    score = ops.Dual(FlintContext(), np.array([flint.arb("0.5 +/- 0.1")], dtype=object))
    with pytest.raises(ValueError, match="undecided"):
        ops.where(score > 0.55, score, 0 * score)


def test_functions_dispatch_on_the_argument_type():
    torch = requires("torch")
    t = torch.tensor([0.5, 2.0], dtype=torch.float64)
    assert isinstance(ops.tanh(t), torch.Tensor)
    torch.testing.assert_close(ops.tanh(t), torch.tanh(t), rtol=0, atol=0)
    np.testing.assert_array_equal(ops.exp(np.array([0.5, 2.0])), np.exp([0.5, 2.0]))
    with mpmath.workprec(80):
        mp = np.array([mpmath.mpf("0.5"), mpmath.mpf(2)], dtype=object)
        assert list(ops.log(mp)) == [mpmath.log(e) for e in mp]
    s = sympy.Symbol("s")
    assert ops.sqrt(np.array([s], dtype=object))[0] == sympy.sqrt(s)
    with pytest.raises(TypeError, match="mpmath, python-flint or sympy entries"):
        ops.exp(np.array(["a"], dtype=object))


def test_constants_of_every_kind_combine_with_a_dual_on_either_side():
    torch = requires("torch")
    ctx = MpmathContext(80)
    with ctx.scope():
        score = ops.Dual(ctx, np.array([mpmath.mpf(1), mpmath.mpf(2)], dtype=object), 1)
        table = torch.tensor([0.25, -0.5], dtype=torch.float32)  # exact in binary
        out = table + score * np.array([2, 3]) - True + 1 / score - (score - 3) / 2
        want = [0.25 + 2 - 1 + 1 - (1 - 3) / 2, -0.5 + 6 - 1 + 0.5 - (2 - 3) / 2]
        assert list(out.value) == [mpmath.mpf(w) for w in want]
        assert list(np.broadcast_to(out.tangent, (2,))) == [2 - 1 - 0.5, 3 - 0.25 - 0.5]


def test_a_torch_function_on_a_dual_is_named():
    torch = requires("torch")
    ctx = NumpyContext()
    score = ops.Dual(ctx, np.array([0.5]))
    with pytest.raises(ops.TorchFunctionOnScore, match=r"torch\.tanh"):
        torch.tanh(score)
    assert (torch.ones(1) * score).value[0] == 0.5  # a tensor's operator defers to the Dual


def test_a_score_in_an_exponent_is_refused():
    ctx = NumpyContext()
    score = ops.Dual(ctx, np.array([0.5]), ctx.scalar(1))
    with pytest.raises(TypeError, match="exponent"):
        score**score


# --- the specification side of a proof ---------------------------------------------------------
def test_specification_evaluates_the_mods_on_the_whole_grid():
    def prefix_lm(b, h, q_idx, kv_idx):
        return (kv_idx <= b + 1) | (q_idx >= kv_idx)

    def relative(score, b, h, q_idx, kv_idx):
        return ops.tanh(score) + (h + 1) * (kv_idx - q_idx)

    allowed, modified = ops.specification(
        3, 4, batch=(2, 2), mask_mod=prefix_lm, score_mod=relative
    )
    for b, h, i, j in np.ndindex(2, 2, 3, 4):
        assert allowed[b, h, i, j] == (j <= b + 1 or i >= j)
        s = sympy.Symbol(f"s_{b}_{h}_{i}_{j}", real=True)
        assert sympy.simplify(modified[b, h, i, j] - (sympy.tanh(s) + (h + 1) * (j - i))) == 0


def test_specification_takes_given_scores_and_keeps_undecided_branches():
    q = sympy.Symbol("q", real=True)
    scores = np.array([[q, 2 * q]], dtype=object)
    allowed, modified = ops.specification(
        1, 2, score_mod=lambda s, b, h, i, j: ops.where(s > 0, s, s / 2), scores=scores
    )
    assert allowed.all() and allowed.shape == (1, 1, 1, 2)
    assert modified[0, 0, 0, 1] == sympy.Piecewise((2 * q, 2 * q > 0), (q, True))


def test_specification_refuses_a_non_boolean_mask_mod():
    with pytest.raises(TypeError, match="mask_mod must return booleans"):
        ops.specification(2, 2, mask_mod=lambda b, h, i, j: i - j)
