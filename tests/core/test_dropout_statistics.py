"""Dropout statistics: the keep-bits have the stated rate, and dropout is unbiased.

The references are the definitions: a keep-bit r is 1 with probability 1 − p, and the
inverted-dropout factor is ρ = r/(1 − p), so E[ρ] = 1 and E[Y_dropout] = Y. Thresholds are
5 standard errors, two-sided: a truly random source fails one with probability 6·10⁻⁷, and
every seed is fixed, so the tests are deterministic. A factor of 1/(1 + p) instead of
1/(1 − p) shifts E[Y] by the factor (1 − p)/(1 + p), many standard errors away.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import exactattn as ea
from exactattn.backends import NumpyContext
from exactattn.core.dropout import Dropout

HEADS, N = 4, 256


def _grid():
    return np.arange(HEADS).reshape(HEADS, 1, 1), np.arange(N)[:, None], np.arange(N)[None, :]


@pytest.mark.parametrize("p", [0.1, 0.25, 0.5, 0.9])
@pytest.mark.parametrize("seed", [3, 2**40 + 1])
def test_keep_bits_have_the_keep_rate_one_minus_p(p, seed):
    keep = Dropout(p, seed).keep(*_grid())
    draws = HEADS * N * N
    assert keep.shape == (HEADS, N, N)
    assert abs(keep.mean() - (1 - p)) <= 5 * math.sqrt(p * (1 - p) / draws)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_factors_are_the_keep_bit_over_one_minus_p(p):
    dropout = Dropout(p, 11)
    rho = dropout.factors(NumpyContext(), *_grid())
    want = np.where(dropout.keep(*_grid()), 1.0 / (1.0 - p), 0.0)
    np.testing.assert_allclose(rho, want, rtol=1e-15, atol=0)
    draws = HEADS * N * N  # mean of ρ: 1 within 5 standard errors sqrt(p/(1 − p)/N)
    assert abs(rho.mean() - 1) <= 5 * math.sqrt(p / (1 - p) / draws)


def test_dropout_is_unbiased_in_expectation():
    """The mean of Y over 400 seeds is Y without dropout, within 5 standard errors per entry.

    V's first column is all ones, so Y's first column is exactly 1 without dropout and the
    dropped-out mean must be 1 too (1/(1+p) would give (1 − p)/(1 + p) = 0.54 at p = 0.3).
    """
    rng = np.random.default_rng(5)
    q, k = rng.standard_normal((4, 3)), rng.standard_normal((6, 3))
    v = np.concatenate([np.ones((6, 1)), rng.standard_normal((6, 2))], axis=1)
    plain = ea.attention(q, k, v)
    samples = np.stack([ea.attention(q, k, v, dropout_p=0.3, seed=s) for s in range(400)])
    mean, se = samples.mean(axis=0), samples.std(axis=0, ddof=1) / math.sqrt(len(samples))
    assert np.all(np.abs(mean - plain) <= 5 * se + 1e-12)
    assert np.all(np.abs(mean[:, 0] - 1) <= 5 * se[:, 0])


def test_dropout_output_is_the_formula_with_the_realised_keep_bits():
    """Y_i = Σ_j e^{s_ij} (r_ij/(1 − p)) V_j / Σ_j e^{s_ij} with r the realised keep-bits."""
    rng = np.random.default_rng(6)
    q, k, v = (
        rng.standard_normal((2, 5, 3)),
        rng.standard_normal((2, 7, 3)),
        rng.standard_normal((2, 7, 2)),
    )
    p, seed = 0.25, 9
    y = ea.attention(q, k, v, dropout_p=p, seed=seed, block_size=3, scale=0.5)
    r = Dropout(p, seed).keep(
        np.arange(2).reshape(2, 1, 1), np.arange(5)[:, None], np.arange(7)[None, :]
    )
    e = np.exp(0.5 * q @ np.swapaxes(k, -1, -2))
    want = (e * r / (1 - p)) @ v / e.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(y, want, rtol=1e-13, atol=1e-14)
