"""The torch path splits query rows into runs (``row_block``): checked where the split happens.

``exactattn.torch`` sizes its row runs from ``TILE_ELEMENTS`` (``passes.row_block_size``); here the
budget is shrunk so that runs of 2 and of ``MIN_ROW_BLOCK`` rows split small masked problems,
and one slow test runs the real budget at n = 2048. The reference is the definition
(``tests/core/definition.py``: inequalities, the materialised softmax), not exactattn.
"""

from __future__ import annotations

import pytest

from tests.optional import requires

torch = requires("torch")

import exactattn.torch as et
from exactattn.core import algorithm, masks
from exactattn.torch import passes

from ..core import definition as spec
from .helpers import qkv, randn, value_and_grads

CASES = {
    "causal": (masks.causal(), lambda nq, nk: spec.causal(nq, nk)),
    "causal bottom-right": (
        masks.causal("bottom-right"),
        lambda nq, nk: spec.causal(nq, nk, "bottom-right"),
    ),
    "window(3, 1)": (masks.sliding_window(3, 1), lambda nq, nk: spec.window(nq, nk, 3, 1)),
}


def _check(name, n_q, n_k, block_size, rows_per_run):
    mask, allowed = CASES[name]
    q, k, v = qkv((2, 2, n_q, 3), (2, 2, n_k, 3), (2, 2, n_k, 2), seed=3)
    g = randn(2, 2, n_q, 2, seed=4)
    geometry = algorithm.geometry_of(q, k, v)
    assert passes.row_block_size(passes.TorchContext(q.dtype), geometry, block_size) == rows_per_run
    assert rows_per_run < n_q  # the split takes effect
    got = value_and_grads(
        lambda q, k, v: et.attention(q, k, v, mask=mask, block_size=block_size, scale=0.5),
        q, k, v, g,
    )  # fmt: skip
    a = allowed(n_q, n_k)
    arrays = [x.numpy() for x in (q, k, v, g)]
    want = (
        spec.attention(*arrays[:3], 0.5, a),
        *spec.gradients(*arrays[:3], 0.5, arrays[3], a),
    )
    for label, x, ref in zip(("y", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(x, torch.from_numpy(ref), rtol=1e-12, atol=1e-12, msg=label)


@pytest.mark.parametrize("name", sorted(CASES))
def test_runs_of_two_rows_match_the_definition(name, monkeypatch):
    monkeypatch.setattr(passes, "MIN_ROW_BLOCK", 2)
    monkeypatch.setitem(passes.TILE_ELEMENTS, "cpu", 1)
    _check(name, n_q=9, n_k=11, block_size=3, rows_per_run=2)


@pytest.mark.parametrize("name", sorted(CASES))
def test_runs_of_min_row_block_rows_match_the_definition(name, monkeypatch):
    monkeypatch.setitem(passes.TILE_ELEMENTS, "cpu", 64)  # 64 // (4 heads · 8 keys) < 16
    _check(name, n_q=40, n_k=44, block_size=8, rows_per_run=passes.MIN_ROW_BLOCK)


@pytest.mark.slow
def test_the_real_row_budget_at_n_2048_matches_the_definition():
    _check("causal", n_q=2048, n_k=2048, block_size=512, rows_per_run=256)
