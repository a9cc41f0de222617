"""The bound against real runs (ratio ≤ 1), its broken twins (ratio > 1), and its API."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from exactattn.error import bounds as B
from tests.optional import requires

from .runs import TARGETS, Case, measure

FAST = [name for name, t in TARGETS.items() if not t.slow and not name.startswith("torch")]
TORCH = [name for name in TARGETS if name.startswith("torch")]


@st.composite
def cases(draw, max_n: int = 20) -> Case:
    gqa = draw(st.booleans())
    return Case(
        n_q=draw(st.integers(1, max_n)),
        n_k=draw(st.integers(1, max_n)),
        d=draw(st.integers(1, 8)),
        dv=draw(st.integers(1, 6)),
        heads=4 if gqa else 1,
        kv_heads=2 if gqa else 1,
        dist=draw(st.sampled_from(("normal", "outliers", "large"))),
        mask=draw(st.sampled_from(("none", "causal", "window", "padding", "random"))),
        dropout=draw(st.sampled_from((0.0, 0.0, 0.3))),
        bias=draw(st.booleans()),
        softcap=draw(st.sampled_from((None, None, 3.0, 30.0))),
        offset=draw(st.sampled_from((0.0, 0.0, 40.0))),
        bias_rows=draw(st.booleans()),
        block=draw(st.integers(1, max_n + 4)),
        seed=draw(st.integers(0, 2**16)),
    )


def _holds(target: str, case: Case) -> None:
    m = measure(TARGETS[target], case)
    assert max(m.ratios.values()) <= 1, f"{target} {case}: {m.ratios}"


@given(cases(), st.sampled_from(FAST))
def test_numpy_runs_stay_within_the_bound(case, target):
    _holds(target, case)


def test_torch_runs_stay_within_the_bound():
    requires("torch")  # before hypothesis draws from TORCH, which is empty without torch
    _torch_runs()


@given(cases(), st.sampled_from(TORCH or ("no torch",)))
def _torch_runs(case, target):
    assume(TARGETS[target].supports(case))
    _holds(target, case)


@given(cases(max_n=6), st.sampled_from(("mp8", "mp11")))
def test_mpmath_emulations_stay_within_the_bound(case, target):
    _holds(target, case)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["np-fa2-fp16", "np-fp16", "naive-np-fp32", "torch-path-bf16"])
def test_runs_at_n_256_stay_within_the_bound(target):
    requires("torch")
    for case in (
        Case(256, 256, 64, 64, mask="causal", block=64, seed=1),
        Case(256, 200, 64, 32, dist="outliers", mask="window", block=100, seed=2),
    ):
        _holds(target, case)


@pytest.mark.slow
@given(cases(max_n=12), st.sampled_from(("mp16", "mp24")))
def test_longer_mpmath_emulations_stay_within_the_bound(case, target):
    _holds(target, case)


# --- the broken twins: one term dropped, and a case that shows it is needed -----------------
def _drop_score_error(mp):
    scores = B._scores

    def broken(*a):
        s = scores(*a)
        return dataclasses.replace(s, E=0 * s.E)

    mp.setattr(B, "_scores", broken)


def _drop_slope_error(mp):
    scores = B._scores

    def broken(*a):
        s = scores(*a)
        return dataclasses.replace(s, dslope=None if s.dslope is None else 0 * s.dslope)

    mp.setattr(B, "_scores", broken)


def _drop_spread(mp):
    mp.setattr(B, "_spread", lambda w, rho, v, y: np.zeros_like(y))


def _drop_output_cast(mp):
    mp.setattr(B, "_cast_out", lambda un, bound, exact: bound)


def _units(**changes):
    def patch(mp):
        of = B.Units.of
        mp.setattr(B.Units, "of", staticmethod(lambda *a: dataclasses.replace(of(*a), **changes)))

    return patch


def _drop_y_error_in_delta(mp):
    reverse = B._reverse

    def broken(prob, units, fw, *a):
        return reverse(prob, units, dataclasses.replace(fw, dy=0 * fw.dy), *a)

    mp.setattr(B, "_reverse", broken)


OFFSET = Case(16, 32, 8, 8, offset=60.0, block=32, seed=11)  # |s| ≈ 60, s − m small
FA2 = Case(32, 32, 16, 8, block=8, seed=2)
LONG_BLOCK = Case(32, 64, 16, 8, dist="outliers", block=64, seed=3)
MUTANTS = {
    "score error": (_drop_score_error, "np-fp16", OFFSET),
    "spread": (_drop_spread, "np-fp16", OFFSET),
    "accumulator": (_units(ua=0.0), "np-fp32", LONG_BLOCK),
    "output cast": (_drop_output_cast, "np-fa2-fp16", FA2),
    "p cast": (_units(up=0.0), "np-fa2-fp16", FA2),
    "Y's error in δ": (_drop_y_error_in_delta, "np-fa2-fp16", FA2),
    "soft-cap slope": (_drop_slope_error, "np-fp16", Case(16, 16, 8, 8, dist="large", softcap=2.0)),
}


@pytest.mark.parametrize("term", list(MUTANTS))
def test_a_bound_without_one_term_is_exceeded(term, monkeypatch):
    """Each term is needed: the intact bound holds on the case, the broken one does not."""
    drop, target, case = MUTANTS[term]
    cache: dict = {}
    assert max(measure(TARGETS[target], case, cache=cache).ratios.values()) <= 1
    drop(monkeypatch)
    assert max(measure(TARGETS[target], case, cache=cache).ratios.values()) > 1


def test_subnormal_weights_amplified_downstream_stay_within_the_bound(monkeypatch):
    """float64 weights below 2^-1022 err by an absolute μ each; γ carries that error, times
    c = 1497, into dK. The replayed case (logits 1e4 apart) holds; with float64's μ evaluated
    as it is (2^-1075, which is 0 in float64) dK exceeds the bound by ~1000 subnormal units."""
    requires("flint")  # the certified reference
    import json
    from pathlib import Path

    import exactattn
    from exactattn.oracle.certified import certified_attention

    path = Path(__file__).parents[1] / "regressions" / "difftest_subnormal_weights_amplified.json"
    data = json.loads(path.read_text())
    q, k, v, g = (np.array(data[x], dtype=np.float64) for x in "qkvg")
    scale, block = data["scale"], data["block_size"]
    ctx = exactattn.NumpyContext("float64")
    y, stats = exactattn.attention(q, k, v, block_size=block, scale=scale, return_stats=True)
    grads = exactattn.attention_backward(q, k, v, y, stats, g, block_size=block, scale=scale)
    enc = certified_attention(q, k, v, g, scale=scale)
    errors = {name: enc[name].distance(x) for name, x in zip(("dq", "dk", "dv"), grads)}
    arith = B.Arith.of_context(ctx, block=block)

    def worst() -> float:
        b = B.bounds(arith, q, k, v, g, scale=scale, row_block=q.shape[-2])
        return max(B.ratio(errors[name], b[name]) for name in errors)

    assert worst() <= 1
    monkeypatch.setattr(B, "MU_FLOOR", 0.0)
    assert worst() > 1


@pytest.mark.parametrize("delta", ["gy", "rowsum"])
def test_a_claimed_dp_format_widens_only_what_dp_reaches(delta):
    """``Arith.dp`` (JAX's backward rounds dP = G·Vᵀ to the input dtype): dQ and dK grow,
    Y and dV (which never read dP) do not; the claim's ``dp=input`` resolves to the dtype."""
    from exactattn.targets import Claim

    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((5, 4)).astype(np.float32) for _ in range(4))
    base = B.Arith.ieee("bfloat16", "float32", p="bfloat16", grad_cast="bfloat16", block=5)
    plain, rounded = (
        B.bounds(a, q, k, v, g, delta=delta)
        for a in (base, dataclasses.replace(base, dp=B.number_format("bfloat16")))
    )
    assert (rounded["dq"] > plain["dq"]).all() and (rounded["dk"] > plain["dk"]).all()
    assert (rounded["y"] == plain["y"]).all() and (rounded["dv"] == plain["dv"]).all()
    claim = Claim.parse("scores=fp32,stats=fp32,dp=input")
    assert claim.resolve("bfloat16").arith(5).dp.name == "bfloat16"
    assert Claim.parse(claim.as_text()) == claim
    assert Claim().resolve("bfloat16").arith(5).dp is None
