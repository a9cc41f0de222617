"""score_mod(score, b, h, q_idx, kv_idx) and mask_mods through exactattn.attention on every
backend: NumPy, mpmath, flint (certified), sympy (exact); its place after softcap and bias;
what it may not do (torch functions off torch, another shape, booleans, indices out of range).
The expected side is the formula with NumPy (or sympy) over the whole grid."""

from __future__ import annotations

import numpy as np
import pytest
import sympy

import exactattn as ea
from exactattn.core import ops
from tests.optional import requires

torch = requires("torch")

B, H, N, D = 2, 3, 7, 4
SLOPES = torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64)


def alibi_softcap(score, b, h, q_idx, kv_idx):
    return 2 * ops.tanh(score / 2) + SLOPES[h] * (kv_idx - q_idx)


def causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def _inputs(seed=0, n=N):
    rng = np.random.default_rng(seed)
    q, k, v, g = (rng.standard_normal((B, H, n, D)) for _ in range(4))
    return 3 * q, k, v, g


def _expected(q, k, v, g=None, *, softcap=None, bias=None, mod=alibi_softcap, allowed=None):
    """``(Y, (dq, dk, dv))`` of the formula, via torch autograd on the materialised grid."""
    n = q.shape[-2]
    _, h, i, j = (torch.from_numpy(x) for x in np.ix_(range(B), range(H), range(n), range(n)))
    leaves = [torch.from_numpy(x).requires_grad_(True) for x in (q, k, v)]
    s = leaves[0] @ leaves[1].transpose(-1, -2) / D**0.5
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + torch.from_numpy(bias)
    if mod is not None:
        s = 2 * torch.tanh(s / 2) + SLOPES[h] * (j - i)  # alibi_softcap, written again
    if allowed is not None:
        s = s.masked_fill(~torch.from_numpy(allowed), float("-inf"))
    y = torch.softmax(s, dim=-1) @ leaves[2]
    if g is None:
        return y.detach().numpy(), None
    return y.detach().numpy(), [
        x.numpy() for x in torch.autograd.grad(y, leaves, torch.from_numpy(g))
    ]


@pytest.mark.parametrize("block_size", [1, 3, 64])
def test_numpy_forward_and_reverse(block_size):
    q, k, v, g = _inputs()
    kw = dict(score_mod=alibi_softcap, mask=causal, block_size=block_size)
    y, stats = ea.attention(q, k, v, return_stats=True, **kw)
    grads = ea.attention_backward(q, k, v, y, stats, g, **kw)
    y_s, grads_s = _expected(q, k, v, g, allowed=np.tril(np.ones((N, N), dtype=bool)))
    np.testing.assert_allclose(y, y_s, atol=1e-13)
    for got, want in zip(grads, grads_s):
        np.testing.assert_allclose(got, want, atol=1e-12)


def test_score_mod_comes_after_softcap_and_bias():
    q, k, v, g = _inputs(1)
    bias = np.random.default_rng(2).standard_normal((H, N, N))
    kw = dict(score_mod=alibi_softcap, softcap=4.0, bias=bias, block_size=3)
    y, stats = ea.attention(q, k, v, return_stats=True, **kw)
    grads = ea.attention_backward(q, k, v, y, stats, g, **kw)
    y_s, grads_s = _expected(q, k, v, g, softcap=4.0, bias=bias)
    np.testing.assert_allclose(y, y_s, atol=1e-13)
    for got, want in zip(grads, grads_s):
        np.testing.assert_allclose(got, want, atol=1e-12)


def test_mpmath_forward_and_reverse_at_high_precision():
    q, k, v, g = _inputs(3, n=4)
    kw = dict(score_mod=alibi_softcap, mask=causal, block_size=2, backend=ea.MpmathContext(120))
    y, stats = ea.attention(q, k, v, return_stats=True, **kw)
    grads = ea.attention_backward(q, k, v, y, stats, g, **kw)
    y_s, grads_s = _expected(q, k, v, g, allowed=np.tril(np.ones((4, 4), dtype=bool)))
    np.testing.assert_allclose(np.asarray(y, dtype=float), y_s, atol=1e-14)
    for got, want in zip(grads, grads_s):
        np.testing.assert_allclose(np.asarray(got, dtype=float), want, atol=1e-13)


def test_flint_balls_enclose_the_result_forward_and_reverse():
    """Certified: every ball contains the 300-bit mpmath value (the same program)."""
    flint = requires("flint")
    import mpmath

    from exactattn.backends.flint_backend import FlintContext

    q, k, v, g = _inputs(4, n=5)
    kw = dict(score_mod=alibi_softcap, mask=causal, block_size=2)
    balls, ball_stats = ea.attention(q, k, v, backend=FlintContext(200), return_stats=True, **kw)
    ball_grads = ea.attention_backward(
        q, k, v, balls, ball_stats, g, backend=FlintContext(200), **kw
    )
    y, stats = ea.attention(q, k, v, backend=ea.MpmathContext(300), return_stats=True, **kw)
    grads = ea.attention_backward(q, k, v, y, stats, g, backend=ea.MpmathContext(300), **kw)
    with FlintContext(320).scope():  # the decimal point values parsed to ~1e-90
        for got, want in zip((balls, *ball_grads), (y, *grads)):
            for ball, point in zip(got.flat, want.flat):
                assert ball.contains(flint.arb(mpmath.nstr(point, 90))), (ball, point)
                assert ball.rad() < 1e-45


def test_sympy_tiled_equals_the_specification_from_the_mods():
    """Exact rationals in, sympy expressions out: the tiled Y (key blocks of 1 and 2) equals
    the naive attention built by ops.specification from the mods themselves."""
    rng = np.random.default_rng(5)
    n = 3
    q, k, v = (
        np.vectorize(lambda x: sympy.Rational(int(x), 4), otypes=[object])(
            rng.integers(-6, 7, (1, 2, n, 1))
        )
        for _ in range(3)
    )
    scores = (q @ np.swapaxes(k, -1, -2)) * sympy.Rational(1, 2)
    allowed, modified = ops.specification(
        n, n, batch=(1, 2), mask_mod=causal, score_mod=alibi_softcap, scores=scores
    )
    weights = np.where(allowed, np.vectorize(sympy.exp, otypes=[object])(modified), 0)
    want = (weights @ v) / weights.sum(axis=-1, keepdims=True)
    for block_size in (1, 2):
        y = ea.attention(
            q, k, v, scale=sympy.Rational(1, 2), mask=causal, score_mod=alibi_softcap,
            block_size=block_size,
        )  # fmt: skip
        for got, expected in zip(y.flat, want.flat):
            assert abs(sympy.N(got - expected, 60)) < 1e-55


def test_a_mod_independent_of_the_score_gets_no_score_gradient():
    """score_mod = a bias alone: uniform in q and k, so dQ = dK = 0 (and dV is not)."""
    q, k, v, g = _inputs(6)
    kw = dict(score_mod=lambda s, b, h, i, j: 0.5 * (j - i), block_size=3)
    y, stats = ea.attention(q, k, v, return_stats=True, **kw)
    dq, dk, dv = ea.attention_backward(q, k, v, y, stats, g, **kw)
    assert not dq.any() and not dk.any() and dv.any()


def test_a_mask_mod_written_with_numpy_arrays_runs_too():
    """Indexing a NumPy array with the index tensors, then mixing with tensors: the mod is
    evaluated with NumPy int64 indices instead."""
    doc = np.array([[0, 0, 1, 1, 1, 2, 2], [0, 1, 1, 1, 2, 2, 2]])

    def numpy_document(b, h, q_idx, kv_idx):
        return (doc[b, q_idx] == doc[b, kv_idx]) & (kv_idx <= q_idx)

    q, k, v, _ = _inputs(7)
    y = ea.attention(q, k, v, mask=numpy_document, block_size=3)
    allowed = (doc[:, None, :, None] == doc[:, None, None, :]) & np.tril(np.ones((N, N), bool))
    np.testing.assert_allclose(y, _expected(q, k, v, mod=None, allowed=allowed)[0], atol=1e-13)


def test_a_row_the_score_mod_sends_to_minus_infinity_is_an_empty_row():
    """Not an overflow: the mod's −∞ (FlexAttention's masking by score_mod) empties row 0."""
    q, k, v, _ = _inputs(8)

    def mask_first_row(score, b, h, q_idx, kv_idx):
        return ops.where(q_idx == 0, -float("inf"), score)

    with pytest.raises(ValueError, match="query rows with no allowed key"):
        ea.attention(q, k, v, score_mod=mask_first_row)
    y = ea.attention(q, k, v, score_mod=mask_first_row, empty_rows="zero")
    assert not y[..., 0, :].any() and y[..., 1:, :].all()


# --- what a score_mod or mask_mod may not do ------------------------------------------------------
def test_a_torch_function_on_an_exact_backend_is_named():
    def torch_softcap(score, b, h, q_idx, kv_idx):
        return 2 * torch.tanh(score / 2)

    q, k, v, _ = _inputs()
    with pytest.raises(TypeError, match=r"score_mod .*torch_softcap calls torch\.tanh .* "
                       r"mpmath\[prec=53\].*exactattn\.ops\.tanh"):  # fmt: skip
        ea.attention(q, k, v, score_mod=torch_softcap, backend=ea.MpmathContext(53))


def test_a_score_mod_that_changes_the_shape_is_refused():
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match=r"score_mod .*<lambda> returned shape \(2, 2, 3, 7, 7\) .*"
                       r"keep the shape"):  # fmt: skip
        ea.attention(q, k, v, score_mod=lambda s, b, h, i, j: s * np.ones((2, 1, 1, 1, 1)))


def test_a_score_mod_returning_booleans_is_refused():
    q, k, v, _ = _inputs()
    with pytest.raises(TypeError, match="returned booleans"):
        ea.attention(q, k, v, score_mod=lambda s, b, h, i, j: i >= j)


def test_an_index_out_of_range_names_the_mod_and_the_tile():
    short = torch.zeros(5, dtype=torch.int64)  # 5 ids for 7 positions

    def document(b, h, q_idx, kv_idx):
        return short[kv_idx] == 0

    def table_bias(score, b, h, q_idx, kv_idx):
        return score + short[kv_idx]

    q, k, v, _ = _inputs()
    with pytest.raises(IndexError, match=r"mask_mod .*document indexed out of range on the "
                       r"tile rows 0\.\.6 × keys 3\.\.5"):  # fmt: skip
        ea.attention(q, k, v, mask=document, block_size=3)
    with pytest.raises(IndexError, match=r"score_mod .*table_bias indexed out of range"):
        ea.attention(q, k, v, score_mod=table_bias, block_size=3)


def test_a_mask_mod_returning_integers_is_refused():
    q, k, v, _ = _inputs()
    with pytest.raises(TypeError, match=r"mask_mod must return a boolean array; got dtype "
                       r"torch\.int64 from .*<lambda>"):  # fmt: skip
        ea.attention(q, k, v, mask=lambda b, h, i, j: i - j)
