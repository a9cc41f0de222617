"""The float64 reference's interface: lazy rows, errors that name the argument, memory that
never holds an n_q × n_k table, vacuous rows instead of wrong radii."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from tests.optional import requires

requires("flint")

from exactattn.oracle.certified import certified_attention
from exactattn.oracle.float64 import NeedsArb, fast_attention
from tests.reference_fast.cases import judge


def _inputs(seed, batch, n_q, n_k, d, dv):
    rng = np.random.default_rng(seed)
    return tuple(
        rng.standard_normal((*batch, n, w)) for n, w in ((n_q, d), (n_k, d), (n_k, dv), (n_q, dv))
    )


def test_lazy_rows_give_the_dense_result():
    """Causal (bottom-right, from j ≤ i + n_k − n_q), a bias and keep-bits as row callables
    over 4 row blocks with a tail (11 rows by 3) give the dense arrays' result exactly."""
    n_q, n_k = 11, 14
    q, k, v, g = _inputs(0, (2,), n_q, n_k, 5, 3)
    rng = np.random.default_rng(1)
    allowed = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q)
    bias = rng.standard_normal((2, n_q, n_k))
    keep = rng.random((2, n_q, n_k)) < 0.8
    calls = []

    def allowed_rows(start, stop):
        calls.append((start, stop))
        return np.arange(n_k)[None, :] <= np.arange(start, stop)[:, None] + (n_k - n_q)

    dense = fast_attention(
        q, k, v, g, allowed=allowed, bias=bias, keep=keep, dropout_p=0.2, row_block=3
    )
    lazy = fast_attention(
        q,
        k,
        v,
        g,
        allowed=allowed_rows,
        bias=lambda a, b: bias[:, a:b],
        keep=lambda a, b: keep[:, a:b],
        dropout_p=0.2,
        row_block=3,
    )
    assert sorted(set(calls)) == [(0, 3), (3, 6), (6, 9), (9, 11)]
    for name in ("y", "lse", "dq", "dk", "dv"):
        assert np.array_equal(dense[name].hi, lazy[name].hi), name
        assert np.array_equal(dense[name].rad, lazy[name].rad), name
    assert "dbias" in dense.balls and "dbias" not in lazy.balls


def test_empty_rows_are_exact_zeros():
    q, k, v, g = _inputs(2, (), 4, 5, 3, 2)
    allowed = np.ones((4, 5), dtype=bool)
    allowed[1] = False
    enc = fast_attention(q, k, v, g, allowed=allowed)
    assert enc.empty_rows.tolist() == [False, True, False, False]
    assert enc["lse"].hi[1] == -np.inf and enc["lse"].rad[1] == 0
    assert np.all(enc["y"].hi[1] == 0) and np.all(enc["y"].rad[1] == 0)
    assert np.all(enc["dq"].hi[1] == 0)


def test_scores_near_the_float64_range_get_an_infinite_radius_not_a_wrong_one():
    """u·|s| beyond the budget's range (scores ~1e14): the rows are vacuous (the caller
    needs arb); scores that overflow are an error naming the cure."""
    q, k, v, g = _inputs(3, (), 3, 4, 2, 2)
    enc = fast_attention(q * 1e7, k * 1e7, v, g)
    assert np.isinf(enc["y"].rad).all() and np.isinf(enc["dk"].rad).all()
    with pytest.raises(ValueError, match="overflows float64"):
        fast_attention(q * 1e160, k * 1e160, v)


def test_large_but_covered_logits_stay_finite_and_contain_arb():
    q, k, v, g = _inputs(4, (), 3, 6, 2, 2)
    fast = fast_attention(q * 30, k * 30, v, g)
    arb = certified_attention(q * 30, k * 30, v, g)
    for name, ball in arb.balls.items():
        assert np.isfinite(fast[name].rad).all()
        verdict = judge(fast[name], ball)
        assert verdict.refuted == verdict.undecided == 0 and verdict.worst <= 1, name


def test_bad_inputs_name_the_argument():
    q, k, v, _ = _inputs(5, (2,), 4, 5, 3, 2)
    with pytest.raises(ValueError, match=r"allowed\(0, 4\) returned shape \(3, 5\)"):
        fast_attention(q, k, v, allowed=lambda a, b: np.ones((3, 5), dtype=bool))
    with pytest.raises(TypeError, match=r"bias\(0, 4\) must return floats; got dtype int64"):
        fast_attention(q, k, v, bias=lambda a, b: np.zeros((b - a, 5), dtype=np.int64))
    with pytest.raises(ValueError, match=r"bias\(0, 4\) contains NaN or \+inf"):
        fast_attention(q, k, v, bias=lambda a, b: np.full((b - a, 5), np.inf))
    with pytest.raises(TypeError, match=r"allowed\(0, 4\) must return booleans"):
        fast_attention(q, k, v, allowed=lambda a, b: np.ones((b - a, 5)))
    with pytest.raises(ValueError, match="row_block must be an integer >= 1"):
        fast_attention(q, k, v, row_block=0)
    with pytest.raises(ValueError, match="q contains NaN"):
        fast_attention(np.full_like(q, np.nan), k, v)
    with pytest.raises(ValueError, match="dropout_p > 0 needs keep"):
        fast_attention(q, k, v, dropout_p=0.5)
    with pytest.raises(NeedsArb, match="score_mod needs the arb reference"):
        fast_attention(q, k, v, score_mod=lambda s, b, h, i, j: s)
    if np.finfo(np.longdouble).nmant > 52:
        with pytest.raises(NeedsArb, match="not float64 numbers"):
            fast_attention(q.astype(np.longdouble), k, v)


def _peak_bytes(n: int, row_block: int, backward: bool = True) -> int:
    q, k, v, g = _inputs(6, (), n, n, 4, 4)
    causal = lambda a, b: np.arange(n)[None, :] <= np.arange(a, b)[:, None]  # noqa: E731
    tracemalloc.start()
    try:
        fast_attention(q, k, v, g if backward else None, allowed=causal, row_block=row_block)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_never_holds_an_n_by_n_table():
    """n = 2048 forward + backward with a lazy causal mask in blocks of 32 rows peaks far
    below one (n_q, n_k) float64 table (32 MiB; measured ~5); the same check sees a
    block of all rows."""
    n, d, rows = 2048, 4, 32
    table = n * n * 8
    peak = _peak_bytes(n, rows)
    # O(r·n_k + n·d): a few tiles of r × n_k and a few dozen arrays of n × d (inputs,
    # gradient sums, every output's midpoint, radius and magnitudes)
    assert peak < 8 * rows * n * 8 + 48 * n * d * 8 and peak < table / 4
    assert _peak_bytes(n, n, backward=False) > table  # the check fails on a whole-table block
