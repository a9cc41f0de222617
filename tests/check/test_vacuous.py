"""The vacuous share measures ill-conditioning, not exact zeros.

A bound is vacuous when it reaches the largest value the reference tells from zero
(:func:`exactattn.testing.judge.certain`): then a zero output would pass and little
beyond finiteness was checked. Rows with one allowed key have dQ = dK = 0
exactly (p = 1, G·V − δ = 0); their check is absolute and catches a kernel that does not
cancel, so such a case is not vacuous, while large logits still are.
"""

from __future__ import annotations

import numpy as np
import pytest

from exactattn import targets
from exactattn.cases import Case
from exactattn.error.metrics import scale_of
from exactattn.testing.case_check import Options, check_case
from exactattn.testing.judge import certain
from tests.optional import requires

requires("flint")

NO_MASK = {"kind": "none"}
ONE_KEY = {"kind": "window", "left": 0, "right": 0, "align": "top-left"}


def test_the_scale_is_the_largest_value_told_from_zero():
    near = np.array([3.0e-48, -2.0, 0.5, -np.inf])
    rad = np.array([3.2e-47, 0.5, 0.1, 0.0])
    assert scale_of(certain(near, rad)) == 2.0
    assert scale_of(certain(near[:1], rad[:1])) == 0.0


def _case(logit: float, mask=NO_MASK, n=3, d=8) -> Case:
    rng = np.random.default_rng(7)
    q, k, v, g = (rng.standard_normal((1, 2, n, d)) for _ in range(4))
    return Case(q * logit, k * logit, v, g, 2, mask=mask, dtype="float32")


def _attention(broken: bool):
    """Naive attention in torch's float32 autograd, SDPA's convention; ``broken`` detaches
    ℓ, so dQ = cΣ p (G·V_j) k_j lacks −δ and a row with one key does not cancel."""
    import torch

    def attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
        c = scale if scale is not None else q.shape[-1] ** -0.5
        s = c * q @ k.transpose(-1, -2)
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf"))
        e = torch.exp(s - s.amax(-1, keepdim=True).detach())
        ell = e.sum(-1, keepdim=True)
        return (e / (ell.detach() if broken else ell)) @ v

    return attention


def _finding(case: Case, broken: bool):
    target = targets.from_callable(_attention(broken), name=f"naive-{broken}")
    (found,) = check_case(case, [targets.Variant(target, "float32")], Options(sampled=False))
    return found


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_rows_with_one_key_are_checked_absolutely_not_vacuous():
    requires("torch")
    case = _case(1.0, ONE_KEY)
    correct = _finding(case, broken=False)
    assert correct.status == "ok" and not correct.vacuous, correct.detail
    assert np.isnan(correct.errors["dq"]) and np.isnan(correct.errors["dk"])  # no scale
    assert _finding(case, broken=True).detail.startswith(("dq[", "dk["))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_large_logits_are_still_vacuous():
    requires("torch")
    found = _finding(_case(30.0), broken=False)
    assert found.status == "ok" and found.vacuous
