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

import functools
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from tests.optional import requires

requires("flint")

from exactattn.oracle.certified import certified_attention
from exactattn.oracle.float64 import fast_attention
from tests.reference_fast.cases import check, draw, judge

FAST_CASES = 120
SLOW_CASES = 3000


@dataclass
class Run:
    """What the drawn cases showed: refutations (as labels) of the reference and of its copy
    with every radius halved, the worst tightness, and the undecided elements."""

    failures: list[str] = field(default_factory=list)
    halved_failures: list[str] = field(default_factory=list)
    worst: float = 0.0
    undecided: int = 0
    undecided_scale: float = 0.0


def _halved(enclosure):
    """The broken reference: the same midpoints with every radius halved."""
    balls = {n: replace(b, rad=b.rad / 2) for n, b in enclosure.balls.items()}
    return replace(enclosure, balls=balls)


@functools.cache
def _run(first: int, count: int) -> Run:
    run = Run()
    for seed in range(first, first + count):
        case = draw(seed)
        fast = fast_attention(*case.arrays, **case.fast())
        assert all(np.isfinite(b.rad).all() for b in fast.balls.values()), case.label
        arb = certified_attention(*case.arrays, **case.keywords)
        for enclosure, failures in ((fast, run.failures), (_halved(fast), run.halved_failures)):
            verdicts = check(case, enclosure, arb)
            bad = {name: x.refuted for name, x in verdicts.items() if x.refuted}
            if bad:
                failures.append(f"seed {seed} ({case.label}): refuted {bad}")
        verdicts = check(case, fast, arb).values()
        run.worst = max(run.worst, *(x.worst for x in verdicts))
        run.undecided += sum(x.undecided for x in verdicts)
        run.undecided_scale = max(run.undecided_scale, *(x.undecided_scale for x in verdicts))
    return run


def test_the_enclosures_contain_arb_on_drawn_cases():
    run = _run(0, FAST_CASES)
    assert not run.failures, "\n".join(run.failures)
    assert run.worst > 0.5  # cases where the radius is all but used
    assert run.undecided_scale < 2.0**-1000  # undecided only at arb's (subnormal) resolution


@pytest.mark.slow
def test_the_enclosures_contain_arb_on_thousands_of_drawn_cases():
    run = _run(1000, SLOW_CASES)
    assert not run.failures, "\n".join(run.failures[:20])
    assert run.undecided_scale < 2.0**-1000
    assert run.halved_failures
    print(
        f"{SLOW_CASES} cases: none refuted, worst tightness {run.worst:.3f}, "
        f"{run.undecided} elements undecided (arb's own radius as wide, all below "
        f"{run.undecided_scale:.3g}); the halved copy refuted in "
        f"{len(run.halved_failures)} cases"
    )


def test_a_copy_with_the_radius_halved_is_caught():
    run = _run(0, FAST_CASES)
    assert run.halved_failures, f"no case refuted the halved radius (worst {run.worst:.3f})"


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
