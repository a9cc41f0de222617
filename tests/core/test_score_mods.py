"""Score modification (bias array, bias function, soft-capping) in the forward and reverse.

The expected side is :mod:`.spec` (formulas only). Sizes give several key blocks, split
query rows, n_q ≠ n_k and a (2, 3) batch, so the per-tile slicing of a bias really runs.
"""

from __future__ import annotations

import numpy as np
import pytest

import exactattn as ea
from exactattn.backends import NumpyContext
from exactattn.core import algorithm, scores

from . import definition as spec

BATCH, N_Q, N_K, D, DV = (2, 3), 7, 11, 4, 3


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*BATCH, N_Q, D))
    k = rng.standard_normal((*BATCH, N_K, D))
    v = rng.standard_normal((*BATCH, N_K, DV))
    g = rng.standard_normal((*BATCH, N_Q, DV))
    return q, k, v, g


def _bias(shape, seed=1, masked=0.2):
    rng = np.random.default_rng(seed)
    b = rng.standard_normal(shape)
    b[rng.random(shape) < masked] = -np.inf
    b[..., 0] = 0.5  # every row keeps a key
    return b


BIAS_SHAPES = [(N_Q, N_K), (BATCH[1], N_Q, N_K), (*BATCH, N_Q, N_K), (BATCH[0], 1, N_Q, 1)]


@pytest.mark.parametrize("shape", BIAS_SHAPES)
@pytest.mark.parametrize("block_size", [1, 4, 64])
def test_bias_array_forward_backward_and_its_gradient(shape, block_size):
    q, k, v, g = _inputs()
    bias = _bias(shape)
    y, stats = ea.attention(q, k, v, bias=bias, block_size=block_size, return_stats=True)
    dq, dk, dv, dbias = ea.attention_backward(
        q, k, v, y, stats, g, bias=bias, block_size=block_size, bias_grad=True
    )
    c = D**-0.5
    y_s, lse_s = spec.attention(q, k, v, c, bias=bias), spec.log_sum_exp(q, k, c, bias=bias)
    dq_s, dk_s, dv_s = spec.gradients(q, k, v, c, g, bias=bias)
    ds_s = spec.score_gradient(q, k, v, c, g, bias=bias)
    np.testing.assert_allclose(y, y_s, atol=1e-13)
    np.testing.assert_allclose(stats.lse, lse_s, atol=1e-13)
    for got, want in ((dq, dq_s), (dk, dk_s), (dv, dv_s)):
        np.testing.assert_allclose(got, want, atol=1e-13)
    assert dbias.shape == bias.shape
    np.testing.assert_allclose(dbias, spec.sum_to(ds_s, bias.shape), atol=1e-13)


@pytest.mark.parametrize("block_size", [2, 5])
def test_softcap_then_bias_forward_and_backward(block_size):
    q, k, v, g = _inputs(3)
    q *= 4  # scores well into tanh's curved part
    bias = _bias((N_Q, N_K), seed=4)
    kw = dict(bias=bias, softcap=2.5, block_size=block_size)
    y, stats = ea.attention(q, k, v, return_stats=True, **kw)
    grads = ea.attention_backward(q, k, v, y, stats, g, bias_grad=True, **kw)
    mods = dict(bias=bias, softcap=2.5)
    y_s = spec.attention(q, k, v, D**-0.5, **mods)
    dq_s, dk_s, dv_s = spec.gradients(q, k, v, D**-0.5, g, **mods)
    ds_s = spec.score_gradient(q, k, v, D**-0.5, g, **mods)
    np.testing.assert_allclose(y, y_s, atol=1e-13)
    wants = (dq_s, dk_s, dv_s, spec.sum_to(ds_s, bias.shape))
    for got, want in zip(grads, wants):
        np.testing.assert_allclose(got, want, atol=1e-12)


def test_softcap_gradient_matches_central_differences_in_mpmath():
    """The derivative 1 − tanh² is checked against the definition, not the spec's formula."""
    import mpmath

    rng = np.random.default_rng(5)
    q, k, v, g = (rng.standard_normal(s) for s in ((3, 2), (4, 2), (4, 2), (3, 2)))
    ctx = ea.MpmathContext(prec=120)
    kw = dict(softcap=0.75, block_size=2, backend=ctx, scale=1.5)
    y, stats = ea.attention(q, k, v, return_stats=True, **kw)
    dq, _, _ = ea.attention_backward(q, k, v, y, stats, g, **kw)
    h = mpmath.mpf(2) ** -40
    with mpmath.workprec(120):
        for index in np.ndindex(q.shape):
            qp, qm = q.astype(object), q.astype(object)
            qp[index] = mpmath.mpf(q[index]) + h
            qm[index] = mpmath.mpf(q[index]) - h
            lp = (ea.attention(qp, k, v, **kw) * g).sum()
            lm = (ea.attention(qm, k, v, **kw) * g).sum()
            assert abs((lp - lm) / (2 * h) - dq[index]) < mpmath.mpf(2) ** -60


def test_alibi_bias_function_is_evaluated_per_tile_and_equals_the_dense_bias():
    q, k, v, g = _inputs(6)
    slopes = np.array([0.5, 0.25, 0.125])

    def alibi(b, h, i, j):
        return -slopes[h] * np.abs(i - j)

    i, j = spec.grid(N_Q, N_K)
    dense = -slopes[:, None, None] * np.abs(i - j)  # (H, n_q, n_k)
    y, stats = ea.attention(q, k, v, bias=alibi, block_size=3, return_stats=True)
    dq, dk, dv = ea.attention_backward(q, k, v, y, stats, g, bias=alibi, block_size=3)
    y_s = spec.attention(q, k, v, D**-0.5, bias=dense)
    dq_s, dk_s, dv_s = spec.gradients(q, k, v, D**-0.5, g, bias=dense)
    for got, want in ((y, y_s), (dq, dq_s), (dk, dk_s), (dv, dv_s)):
        np.testing.assert_allclose(got, want, atol=1e-13)


def test_a_row_excluded_by_the_bias_is_empty_not_an_overflow():
    q, k, v, g = _inputs(7)
    bias = np.zeros((N_Q, N_K))
    bias[2] = -np.inf
    with pytest.raises(ValueError, match="no allowed key"):
        ea.attention(q, k, v, bias=bias)
    y, stats = ea.attention(q, k, v, bias=bias, empty_rows="zero", return_stats=True)
    assert np.all(y[..., 2, :] == 0) and np.all(np.isneginf(stats.lse[..., 2]))
    dq, dk, dv = ea.attention_backward(q, k, v, y, stats, g, bias=bias, empty_rows="zero")
    y_s = spec.attention(q, k, v, D**-0.5, bias=bias)
    dq_s, dk_s, dv_s = spec.gradients(q, k, v, D**-0.5, g, bias=bias)
    for got, want in ((y, y_s), (dq, dq_s), (dk, dk_s), (dv, dv_s)):
        np.testing.assert_allclose(got, want, atol=1e-13)


def test_split_rows_and_blocks_give_the_same_bias_gradient():
    """row_block splits the query rows of every tile; dbias is still the sum over tiles."""
    q, k, v, g = _inputs(8)
    bias = _bias((*BATCH, N_Q, N_K), seed=9)
    ctx = NumpyContext("float64")
    mod = scores.bias(bias)
    kw = dict(scale=ctx.default_scale(D), block_size=3, score_mod=mod)
    out = []
    for row_block in (None, 2):
        y, st = algorithm.forward(ctx, q, k, v, row_block=row_block, **kw)
        grads = {"bias": np.zeros(bias.shape)}
        algorithm.backward(ctx, q, k, v, y, st.m, st.l, g, row_block=row_block, **kw,
                           mod_grads=grads)  # fmt: skip
        out.append(grads["bias"])
    ds_s = spec.score_gradient(q, k, v, D**-0.5, g, bias=bias)
    for got in out:
        np.testing.assert_allclose(got, ds_s, atol=1e-13)


@pytest.mark.parametrize(
    ("keywords", "error", "match"),
    [
        ({"bias": np.full((N_Q, N_K), np.nan)}, ValueError, "bias contains NaN"),
        ({"bias": np.zeros((N_Q + 1, N_K))}, ValueError, "bias has shape"),
        ({"bias": np.zeros((N_Q, N_K), dtype=int)}, TypeError, "floating-point"),
        ({"bias": np.zeros(N_K)}, ValueError, "at least 2 dims"),
        ({"softcap": 0.0}, ValueError, "softcap must be > 0"),
        ({"softcap": -1.0}, ValueError, "softcap must be > 0"),
        ({"softcap": "2"}, TypeError, "softcap must be a real number"),
        ({"softcap": float("inf")}, ValueError, "softcap must be finite"),
    ],
)
def test_bad_score_modifications_are_named(keywords, error, match):
    q, k, v, _ = _inputs()
    with pytest.raises(error, match=match):
        ea.attention(q, k, v, **keywords)


def test_bias_grad_needs_a_bias_array():
    q, k, v, g = _inputs()
    y, stats = ea.attention(q, k, v, return_stats=True)
    with pytest.raises(ValueError, match="bias_grad=True needs bias"):
        ea.attention_backward(q, k, v, y, stats, g, bias_grad=True)
