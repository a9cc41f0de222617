"""The float64 reference's enclosures contain the arb reference's, across drawn cases.

Cases (``cases.draw``) cover large logits, tiny values, outliers, every mask kind (causal in
both alignments, windows, padding, dense, empty rows), bias with −∞ in four shapes,
softcap, dropout, batch broadcasting, GQA, n_q ≠ n_k, several row blocks with tails, lazy
rows, and the gradients. No element may be refuted (its ball missing the arb ball), and
elements left undecided (arb's ball as wide as the fast one) may only be of subnormal size,
where arb's own radius is a few spacings of 2^-1074. The same cases refute a copy with every
radius halved: the budget is tight enough somewhere (a single rounded score with n_k = 1
errs within a few u of its radius) that half of it is wrong. No radius may be infinite in
these cases (no vacuous row).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.optional import requires

requires("flint")

from exactattn.certified import certified_attention
from exactattn.fast_reference import fast_attention
from tests.reference_fast.cases import check, draw, judge

FAST_CASES = 120
SLOW_CASES = 3000


def _judge(seeds, halve: bool = False) -> tuple[list[str], float, int, float]:
    """Refutations (as labels), the worst tightness, the undecided elements and their
    largest magnitude (with ``halve``: every fast radius halved, a broken reference)."""
    failures, worst, undecided, scale = [], 0.0, 0, 0.0
    for seed in seeds:
        case = draw(seed)
        fast = fast_attention(*case.arrays, **case.fast())
        if halve:
            for ball in fast.balls.values():
                ball.rad[...] = ball.rad / 2
        arb = certified_attention(*case.arrays, **case.keywords)
        verdicts = check(case, fast, arb)
        bad = {name: x.refuted for name, x in verdicts.items() if x.refuted}
        if bad:
            failures.append(f"seed {seed} ({case.label}): refuted {bad}")
        assert all(np.isfinite(b.rad).all() for b in fast.balls.values()), case.label
        worst = max(worst, *(x.worst for x in verdicts.values()))
        undecided += sum(x.undecided for x in verdicts.values())
        scale = max(scale, *(x.undecided_scale for x in verdicts.values()))
    return failures, worst, undecided, scale


def test_the_enclosures_contain_arb_on_drawn_cases():
    failures, worst, _, scale = _judge(range(FAST_CASES))
    assert not failures, "\n".join(failures)
    assert worst > 0.5  # cases where the radius is all but used
    assert scale < 2.0**-1000  # undecided only at arb's own (subnormal) resolution


@pytest.mark.slow
def test_the_enclosures_contain_arb_on_thousands_of_drawn_cases():
    failures, worst, undecided, scale = _judge(range(1000, 1000 + SLOW_CASES))
    assert not failures, "\n".join(failures[:20])
    assert scale < 2.0**-1000
    print(f"{SLOW_CASES} cases: none refuted, worst tightness {worst:.3f}, {undecided} elements")
    print(f"undecided (arb's own radius as wide, all below {scale:.3g})")


def test_a_copy_with_the_radius_halved_is_caught():
    failures, worst, _, _ = _judge(range(FAST_CASES), halve=True)
    assert failures, f"no case refuted the halved radius (worst tightness {worst:.3f})"


def _rows(table: np.ndarray):
    return lambda start, stop: table[..., start:stop, :]


@pytest.mark.parametrize(
    "n", [pytest.param(160, id="n=160"), pytest.param(600, id="n=600", marks=pytest.mark.slow)]
)
def test_longer_rows_with_every_feature_contain_arb(n):
    """Where n·u terms and cancellation matter: a lazy bottom-right causal mask, a lazy
    bias with −∞ entries, dropout, softcap, 2 heads over 1 key/value head, n_q ≠ n_k and
    row blocks of 48 with a tail."""
    rng = np.random.default_rng(n)
    n_q, n_k = n, n + 37
    q = rng.standard_normal((2, n_q, 16)) * 2
    k = rng.standard_normal((1, n_k, 16)) * 2
    v = rng.standard_normal((1, n_k, 8))
    g = rng.standard_normal((2, n_q, 8))
    allowed = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q)
    bias = rng.standard_normal((n_q, n_k))
    bias[rng.random((n_q, n_k)) < 0.05] = -np.inf
    keep = rng.random((2, n_q, n_k)) >= 0.2
    keywords = dict(allowed=allowed, bias=bias, keep=keep, dropout_p=0.2, softcap=8.0)
    arb = certified_attention(q, k, v, g, enable_gqa=True, **keywords)
    lazy = {"allowed": _rows(allowed), "bias": _rows(bias)}
    fast = fast_attention(q, k, v, g, enable_gqa=True, row_block=48, **dict(keywords, **lazy))
    for name, ball in fast.balls.items():
        verdict = judge(ball, arb[name])
        assert verdict.refuted == verdict.undecided == 0, name
        assert np.isfinite(ball.rad).all() and ball.rad.max() < 1e-10, name
