"""The per-head magnitudes the group-sum terms charge (:mod:`exactattn.testing.group_sums`):
read a strip of query rows at a time, they are the same whatever the strip, and they bound
each head's exact gradient, written here from the definition."""

from __future__ import annotations

import numpy as np
import pytest

from exactattn.cases import Case
from exactattn.cases.exact import fast
from exactattn.testing import group_sums
from tests.optional import requires

requires("flint")  # the certified references


def _case(seed: int = 0) -> Case:
    rng = np.random.default_rng(seed)
    q, g = (rng.normal(size=(2, 4, 9, 5)) for _ in "qg")
    k, v = (rng.normal(size=(2, 2, 13, 5)) for _ in "kv")  # GQA: groups of 2 heads
    mask = {"kind": "causal", "align": "bottom-right"}
    return Case(q, k, v, g, 4, mask=mask, empty_rows="zero")


def _per_head_gradients(case: Case) -> dict[str, np.ndarray]:
    """dQ and each query head's dK_h, dV_h of the case, naive attention from the definition."""
    k, v = (np.repeat(x, case.group, axis=-3) for x in (case.k, case.v))
    c = case.c()
    n_q, n_k = case.q.shape[-2], k.shape[-2]
    allowed = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + n_k - n_q
    s = np.where(allowed, c * case.q @ np.swapaxes(k, -1, -2), -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    dp = case.g @ np.swapaxes(v, -1, -2)
    gamma = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    return {
        "dq": c * gamma @ k,
        "dk": c * np.swapaxes(gamma, -1, -2) @ case.q,
        "dv": np.swapaxes(p, -1, -2) @ case.g,
    }


@pytest.mark.parametrize("strip", [1, 13, 1 << 22])  # one row, a few rows, all rows
def test_the_magnitudes_bound_each_head_and_do_not_depend_on_the_strip(monkeypatch, strip):
    case = _case()
    ref = fast(case)
    whole = group_sums.head_magnitudes(case, ref)
    monkeypatch.setattr(group_sums, "STRIP_ELEMENTS", strip)
    stripped = group_sums.head_magnitudes(case, ref)
    exact = _per_head_gradients(case)
    for name in ("dq", "dk", "dv"):
        np.testing.assert_allclose(stripped[name], whole[name], rtol=1e-13)
        assert (np.abs(exact[name]) <= stripped[name]).all(), name
