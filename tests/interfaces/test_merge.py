"""Split the keys, compute each part, merge: equals attention over all keys (every backend)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import exactattn
from exactattn.core import masks
from exactattn.core.algorithm import Summary

from .spec import softmax_rows


def _parts(n_k: int, cuts: tuple[int, ...]) -> list[tuple[int, int]]:
    edges = (0, *cuts, n_k)
    return list(itertools.pairwise(edges))


def _spec(q, k, v, allowed):
    out_y, out_lse = np.zeros((*q.shape[:-1], v.shape[-1])), np.zeros(q.shape[:-1])
    for h in range(q.shape[0]):
        s = np.where(allowed, q[h] @ k[h].T / np.sqrt(q.shape[-1]), -np.inf)
        out_y[h], out_lse[h] = softmax_rows(s, v[h])
    return out_y, out_lse


@pytest.mark.parametrize("cuts", [(3,), (1, 2), (4, 5, 9), (0, 6), (11,)])
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_split_compute_merge_equals_the_whole(cuts, block_size):
    rng = np.random.default_rng(len(cuts) * 10 + block_size)
    q, k, v = rng.normal(size=(2, 6, 4)), rng.normal(size=(2, 11, 4)), rng.normal(size=(2, 11, 3))
    mask = masks.causal("bottom-right")
    parts = []
    for part in _parts(11, cuts):
        y, stats = exactattn.attention(
            q, k, v, mask=mask, key_range=part, block_size=block_size, return_stats=True
        )
        parts.append((y, stats.lse))
    y, lse = exactattn.merge_partials(parts)
    i, j = np.arange(6)[:, None] + 5, np.arange(11)[None, :]
    y_ref, lse_ref = _spec(q, k, v, j <= i)
    np.testing.assert_allclose(y, y_ref, atol=1e-14)
    np.testing.assert_allclose(lse, lse_ref, atol=1e-14)


def test_merge_is_independent_of_order_and_bracketing():
    rng = np.random.default_rng(3)
    parts = [(rng.normal(size=(4, 2)), rng.normal(size=4) * 5) for _ in range(4)]
    parts[2] = (np.zeros((4, 2)), np.array([-np.inf, 0.5, -np.inf, 1.0]))  # empty rows
    y_all = np.stack([p[0] for p in parts])
    lse_all = np.stack([p[1] for p in parts])
    w = np.exp(lse_all - lse_all.max(0))
    lse_ref = lse_all.max(0) + np.log(w.sum(0))
    y_ref = (w[..., None] * y_all).sum(0) / w.sum(0)[..., None]
    for order in itertools.permutations(range(4)):
        y, lse = exactattn.merge_partials([parts[t] for t in order])
        np.testing.assert_allclose(y, y_ref, atol=1e-14)
        np.testing.assert_allclose(lse, lse_ref, atol=1e-14)
    left = exactattn.merge_partials([exactattn.merge_partials(parts[:2]), *parts[2:]])
    right = exactattn.merge_partials([parts[0], exactattn.merge_partials(parts[1:])])
    for got in (left, right):
        np.testing.assert_allclose(got[0], y_ref, atol=1e-14)


def test_base_two_lse_is_read_and_returned_in_base_two():
    rng = np.random.default_rng(4)
    parts = [(rng.normal(size=(3, 2)), rng.normal(size=3)) for _ in range(3)]
    y_e, lse_e = exactattn.merge_partials(parts)
    base2 = [(y, lse / np.log(2)) for y, lse in parts]
    y_2, lse_2 = exactattn.merge_partials(base2, lse_base=2)
    np.testing.assert_allclose(y_2, y_e, atol=1e-15)
    np.testing.assert_allclose(lse_2 * np.log(2), lse_e, atol=1e-14)
    y_mixed, _ = exactattn.merge_partials(base2)  # base-2 read as natural: a different answer
    assert np.abs(y_mixed - y_e).max() > 1e-3


def test_summaries_merge_like_pairs():
    rng = np.random.default_rng(5)
    m, l, z = rng.normal(size=3), rng.uniform(1, 2, size=3), rng.normal(size=(3, 2))
    y, lse = exactattn.merge_partials([Summary(m, l, z), (z / l[:, None], m + np.log(l))])
    np.testing.assert_allclose(lse, m + np.log(l) + np.log(2), atol=1e-14)
    np.testing.assert_allclose(y, z / l[:, None], atol=1e-14)


def test_all_empty_parts_give_zero_and_minus_infinity():
    empty = (np.zeros((2, 3)), np.full(2, -np.inf))
    y, lse = exactattn.merge_partials([empty, empty])
    assert (y == 0).all() and np.isneginf(lse).all()


def _objects(rows) -> np.ndarray:
    return np.array(rows, dtype=object)


def test_merge_over_mpmath_and_sympy_is_exact():
    import mpmath
    import sympy

    a, b = sympy.Rational(1, 3), sympy.Rational(-2, 5)
    two, minus_one = sympy.Integer(2), sympy.Integer(-1)
    parts = [(_objects([[two]]), _objects([a])), (_objects([[minus_one]]), _objects([b]))]
    y, lse = exactattn.merge_partials(parts)
    expected = (2 * sympy.exp(a) - sympy.exp(b)) / (sympy.exp(a) + sympy.exp(b))
    assert sympy.simplify(y[0, 0] - expected) == 0
    assert sympy.simplify(sympy.exp(lse[0]) - sympy.exp(a) - sympy.exp(b)) == 0
    with mpmath.workdps(40):
        third, two_fifths = mpmath.mpf(1) / 3, mpmath.mpf(-2) / 5
        mp_parts = [
            (_objects([[mpmath.mpf(2)]]), _objects([third])),
            (_objects([[mpmath.mpf(-1)]]), _objects([two_fifths])),
        ]
        y_mp, _ = exactattn.merge_partials(mp_parts, backend=exactattn.MpmathContext(130))
        assert abs(y_mp[0, 0] - mpmath.mpf(str(sympy.N(expected, 40)))) < mpmath.mpf(10) ** -35
