"""The float64 reference's enclosures contain the arb reference's, across drawn cases.

Cases (``cases.draw``) cover large logits, tiny values, outliers, every mask kind (causal in
both alignments, windows, padding, dense, empty rows), bias with −∞ in four shapes,
softcap, dropout, batch broadcasting, GQA, n_q ≠ n_k, several row blocks with tails, lazy
rows, and the gradients. The same cases judge a copy with every radius halved, which must
be caught: the budget is tight enough somewhere (a single rounded score with n_k = 1 gives
an error within a few u of the radius) that half of it is wrong.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.optional import requires

requires("flint")

from exactattn.certified import certified_attention
from exactattn.fast_reference import fast_attention
from tests.reference_fast.cases import check, draw

FAST_CASES = 120
SLOW_CASES = 3000


def _judge(seeds, halve: bool = False) -> tuple[list[str], float, int]:
    """Failures (as labels), the worst tightness and the number of vacuous outputs."""
    failures, worst, vacuous = [], 0.0, 0
    for seed in seeds:
        case = draw(seed)
        fast = fast_attention(*case.arrays, **case.fast())
        if halve:
            for ball in fast.balls.values():
                ball.rad[...] = ball.rad / 2
        arb = certified_attention(*case.arrays, **case.keywords)
        vacuous += sum(int(np.isinf(b.rad).any()) for b in fast.balls.values())
        result = check(case, fast, arb)
        bad = {name: t for name, t in result.items() if t > 1}
        if bad:
            failures.append(f"seed {seed} ({case.label}): {bad}")
        worst = max(worst, *result.values())
    return failures, worst, vacuous


def test_the_enclosures_contain_arb_on_drawn_cases():
    failures, worst, vacuous = _judge(range(FAST_CASES))
    assert not failures, "\n".join(failures)
    assert vacuous == 0 and worst > 0.05  # cases where the radius is all but used


@pytest.mark.slow
def test_the_enclosures_contain_arb_on_thousands_of_drawn_cases():
    failures, worst, vacuous = _judge(range(1000, 1000 + SLOW_CASES))
    assert not failures, "\n".join(failures[:20])
    print(f"{SLOW_CASES} cases: worst tightness {worst:.3f}, {vacuous} vacuous outputs")


def test_a_copy_with_the_radius_halved_is_caught():
    failures, worst, _ = _judge(range(FAST_CASES), halve=True)
    assert failures, f"no case caught the halved radius (worst tightness {worst:.3f})"
