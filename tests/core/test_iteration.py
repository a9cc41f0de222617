"""Every parameter that changes the iteration, at sizes where it changes it, against the definition.

Query rows split into runs (``row_block``, as the torch path splits them), batch
broadcasting and grouped-query heads, both alignments, ``n_q ≠ n_k``, partially-masked
tiles — forward *and* all three gradients (dQ under every mask), compared with
:mod:`.definition` (inequalities and the materialised softmax, no exactattn code).
"""

from __future__ import annotations

import numpy as np
import pytest

import exactattn as ea
from exactattn.backends import NumpyContext
from exactattn.core import algorithm, masks

from . import definition as spec

N_Q, N_K, D, V = 11, 13, 3, 2
BATCH = (2, 3)
LENGTHS = np.array([N_K, 6])
TOL = dict(rtol=1e-12, atol=1e-13)


def _cases():
    """(name, library mask, allowed (broadcastable to (*BATCH, N_Q, N_K)) from inequalities)."""
    return [
        ("none", None, None),
        ("causal", masks.causal(), spec.causal(N_Q, N_K)),
        (
            "causal bottom-right",
            masks.causal("bottom-right"),
            spec.causal(N_Q, N_K, "bottom-right"),
        ),
        (
            "window(2, 1) bottom-right",
            masks.sliding_window(2, 1, "bottom-right"),
            spec.window(N_Q, N_K, 2, 1, "bottom-right"),
        ),
        ("window(None, 3)", masks.sliding_window(None, 3), spec.window(N_Q, N_K, None, 3)),
        ("padding", masks.key_padding(LENGTHS), spec.padding(N_Q, N_K, LENGTHS)),
        (
            "causal ∧ padding",
            masks.causal() & masks.key_padding(LENGTHS),
            spec.causal(N_Q, N_K) & spec.padding(N_Q, N_K, LENGTHS),
        ),
        (
            "window(1, 0) ∨ window(None, 0) bottom-right",
            masks.sliding_window(1, 0) | masks.causal("bottom-right"),
            spec.window(N_Q, N_K, 1, 0) | spec.causal(N_Q, N_K, "bottom-right"),
        ),
    ]


CASES = _cases()


def _problem(seed=0, q_batch=BATCH, kv_batch=BATCH):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*q_batch, N_Q, D))
    k = rng.standard_normal((*kv_batch, N_K, D))
    v = rng.standard_normal((*kv_batch, N_K, V))
    g = rng.standard_normal((*np.broadcast_shapes(q_batch, kv_batch), N_Q, V))
    return q, k, v, g


def _run(q, k, v, g, mask, b, row_block, c=0.7):
    ctx = NumpyContext()
    y, state = algorithm.forward(
        ctx, q, k, v, scale=c, block_size=b, mask=mask, row_block=row_block
    )
    grads = algorithm.backward(
        ctx, q, k, v, y, state.m, state.l, g, scale=c, block_size=b, mask=mask,
        row_block=row_block,
    )  # fmt: skip
    return y, grads


@pytest.mark.parametrize("name, mask, allowed", CASES, ids=[c[0] for c in CASES])
def test_split_rows_and_partial_tiles_match_the_definition_forward_and_every_gradient(
    name, mask, allowed
):
    """row_block 1, 3, 5 split the 11 query rows; b = 4 leaves partial tiles; dQ included."""
    q, k, v, g = _problem()
    want_y = spec.attention(q, k, v, 0.7, allowed)
    want = spec.gradients(q, k, v, 0.7, g, allowed)
    for b in (1, 4, N_K):
        for row_block in (None, 1, 3, 5):
            y, grads = _run(q, k, v, g, mask, b, row_block)
            where = f"{name} b={b} row_block={row_block}"
            np.testing.assert_allclose(y, want_y, **TOL, err_msg=where)
            for label, got, ref in zip(("dQ", "dK", "dV"), grads, want):
                np.testing.assert_allclose(got, ref, **TOL, err_msg=f"{label} {where}")


def test_the_row_runs_really_split_the_masked_rows():
    geometry = masks.Geometry(N_Q, N_K, BATCH)
    runs = [t.rows for t in algorithm.tiles(NumpyContext(), masks.causal(), geometry, 4, 3)]
    first_block = [r for r in runs if r.start < 4]
    assert len(runs) > len(range(0, N_K, 4)) and len(first_block) > 1


@pytest.mark.parametrize("row_block", [None, 2])
def test_grouped_query_heads_sum_dk_dv_over_the_group(row_block):
    """q (H_kv=2, g=3, ·) against k, v (2, 1, ·): GQA as the generic code runs it."""
    q, k, v, g = _problem(1, q_batch=(2, 3), kv_batch=(2, 1))
    allowed = spec.causal(N_Q, N_K, "bottom-right")
    y, grads = _run(q, k, v, g, masks.causal("bottom-right"), 4, row_block)
    np.testing.assert_allclose(y, spec.attention(q, k, v, 0.7, allowed), **TOL)
    for got, want in zip(grads, spec.gradients(q, k, v, 0.7, g, allowed)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, **TOL)


def test_batch_broadcasting_both_ways_through_the_public_api():
    """q (2, 1, ·) against k, v (1, 3, ·): dQ sums over the heads, dK and dV over the batch."""
    q, k, v, g = _problem(2, q_batch=(2, 1), kv_batch=(1, 3))
    mask = masks.sliding_window(2, 1, "bottom-right")
    allowed = spec.window(N_Q, N_K, 2, 1, "bottom-right")
    y, stats = ea.attention(q, k, v, block_size=3, scale=0.7, mask=mask, return_stats=True)
    grads = ea.attention_backward(q, k, v, y, stats, g, block_size=3, scale=0.7, mask=mask)
    np.testing.assert_allclose(y, spec.attention(q, k, v, 0.7, allowed), **TOL)
    for got, want in zip(grads, spec.gradients(q, k, v, 0.7, g, allowed)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, **TOL)
