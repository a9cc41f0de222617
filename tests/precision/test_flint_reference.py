"""The flint backend: arb balls from the library's tiled code enclose the exact values.

The independent witness is mpmath at a much higher precision than the balls (its own
rounding error is ~2^-300, far inside a 2^-100 ball): every mpmath value must lie inside
the corresponding flint ball, for Y, lse and the three gradients.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

import exactattn
from exactattn.backends import backend_of, resolve_backend
from exactattn.core import masks
from tests.optional import requires

flint = requires("flint")

from flint import arb

from exactattn.backends.flint_backend import FlintContext

BALL_PREC = 100
WITNESS = exactattn.MpmathContext(prec=300)


def _problem(seed: int, n_q: int = 7, n_k: int = 9, d: int = 3, v: int = 2):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((n_q, d)),
        rng.standard_normal((n_k, d)),
        rng.standard_normal((n_k, v)),
        rng.standard_normal((n_q, v)),
    )


def _both(backend, q, k, v, g, **keywords):
    y, stats = exactattn.attention(q, k, v, return_stats=True, backend=backend, **keywords)
    grads = exactattn.attention_backward(q, k, v, y, stats, g, backend=backend, **keywords)
    return {"y": y, "lse": stats.lse, "dq": grads[0], "dk": grads[1], "dv": grads[2]}


def _outside(balls: np.ndarray, points: np.ndarray) -> list[tuple]:
    """Indices where the mpmath point is not inside the arb ball."""
    bad = []
    with FlintContext(400).scope(), mpmath.workprec(300):  # the point converts exactly
        for index in np.ndindex(balls.shape):
            ball, point = balls[index], points[index]
            if mpmath.isinf(point):
                if ball.is_finite() or float(ball) != float(point):
                    bad.append(index)
                continue
            sign, man, exp, _ = point._mpf_
            if not ball.contains(arb(flint.fmpz(-man if sign else man)) * arb(2) ** exp):
                bad.append(index)
    return bad


@pytest.mark.parametrize(
    ("mask", "block_size", "dropout_p"),
    [
        (None, 4, 0.0),
        (masks.causal(), 2, 0.0),
        (masks.sliding_window(2), 3, 0.0),
        (None, 1, 0.0),
        (masks.causal(), 3, 0.25),
    ],
)
def test_mpmath_lies_inside_the_flint_balls(mask, block_size, dropout_p):
    q, k, v, g = _problem(1, n_q=7, n_k=7 if mask is not None else 9)
    keywords = dict(mask=mask, block_size=block_size, scale=0.7, dropout_p=dropout_p, seed=3)
    balls = _both(FlintContext(BALL_PREC), q, k, v, g, **keywords)
    points = _both(WITNESS, q, k, v, g, **keywords)
    for name in balls:
        assert _outside(balls[name], points[name]) == [], name


def test_a_wrong_shift_in_the_reverse_leaves_the_balls():
    """The containment check can fail: the reverse with m + 1 (not the forward's m)."""
    q, k, v, g = _problem(2)
    ctx = FlintContext(BALL_PREC)
    y, stats = exactattn.attention(q, k, v, return_stats=True, backend=ctx, block_size=4)
    shifted = exactattn.Stats(stats.m + arb(1), stats.l, stats.lse)
    dq = exactattn.attention_backward(q, k, v, y, shifted, g, backend=ctx, block_size=4)[0]
    witness = _both(WITNESS, q, k, v, g, block_size=4)
    assert len(_outside(dq, witness["dq"])) > 0


def test_balls_are_tight_and_discriminate_float64():
    q, k, v, g = _problem(3, n_q=16, n_k=16, d=8, v=8)
    balls = _both(FlintContext(BALL_PREC), q, k, v, g, block_size=5)
    floats = _both(None, q, k, v, g, block_size=5)
    for name, ball in balls.items():
        radius = max(float(e.rad()) for e in ball.flat)
        mid = np.array([float(e) for e in ball.flat]).reshape(ball.shape)
        error = np.abs(floats[name] - mid).max()
        assert radius < 2.0**-80, name
        assert 0 < error < 1e-13, name  # float64 is off by rounding, far outside the balls
        assert error > 1e10 * radius, name


def test_empty_rows_give_exact_zero_and_minus_infinity():
    q, k, v, g = _problem(4, n_q=5, n_k=5)
    allowed = np.ones((5, 5), dtype=bool)
    allowed[2] = False
    out = _both(FlintContext(80), q, k, v, g, mask=allowed, empty_rows="zero", block_size=2)
    assert all(e == 0 for e in out["y"][2])
    assert out["lse"][2] == arb("-inf")
    assert all(e == 0 for e in out["dq"][2])
    assert all(e.is_finite() for e in out["y"][[0, 1, 3, 4]].flat)


def test_scope_sets_and_restores_the_precision():
    before = flint.ctx.prec
    ctx = FlintContext(123)
    with ctx.scope():
        assert flint.ctx.prec == 123
    assert flint.ctx.prec == before
    with pytest.raises(RuntimeError), ctx.scope():
        raise RuntimeError
    assert flint.ctx.prec == before


def test_native_matmul_matches_object_matmul_with_broadcast():
    ctx = FlintContext(64)
    rng = np.random.default_rng(5)
    with ctx.scope():
        a = ctx.asarray(rng.standard_normal((2, 1, 3, 4)))
        b = ctx.asarray(rng.standard_normal((3, 4, 5)))
        native = ctx.matmul(a, b)
        generic = a @ b
        assert native.shape == generic.shape == (2, 3, 3, 5)
        assert all(x.overlaps(y) for x, y in zip(native.flat, generic.flat))
        empty = ctx.matmul(ctx.asarray(np.ones((2, 0))), ctx.asarray(np.ones((0, 3))))
        assert empty.shape == (2, 3) and all(e == 0 for e in empty.flat)


def test_the_max_is_an_exact_representative():
    ctx = FlintContext(64)
    with ctx.scope():
        x = np.array([[arb(1, 0.5), arb(2, 0.25), arb("-inf")]], dtype=object)
        m = ctx.rowmax(x)
        assert m[0] == arb(2) and m[0].rad() == 0
        both = ctx.maximum(np.array([arb("-inf")], dtype=object), np.array([arb(3)]))
        assert both[0] == arb(3)
        assert ctx.is_neg_inf(ctx.rowmax(np.array([[arb("-inf")]], dtype=object)))[0]


def test_backend_lookup_and_conversion():
    ctx = FlintContext()
    with ctx.scope():
        balls = ctx.asarray(np.array([[0.1, -2.0], [3.5, 1e-300]]))
    assert isinstance(backend_of(("q", balls)), FlintContext)
    assert isinstance(resolve_backend("flint"), FlintContext)
    assert all(e.rad() == 0 for e in balls.flat)  # binary64 values convert exactly
    assert float(balls[0, 0]) == 0.1
    with pytest.raises(ValueError, match="prec"):
        FlintContext(1)
    assert ctx.nonfinite(np.array([arb("-inf"), arb(1)], dtype=object)).tolist() == [True, False]
