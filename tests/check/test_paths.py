"""check's case distribution (:mod:`exactattn.cases.paths`) has the shares it states.

Drawn at a seed as check draws them (:func:`exactattn.testing.search.draw`): every calling
path within a few points of its stated share, at least 15% of cases with ``n_k > 3b`` and 10%
with ``n_k mod b ≠ 0`` for the claimed ``b``, the large ones within ``B·H ≤ 2`` and
``d ≤ 64``, ill-conditioned cases labelled and at most 5%. The same assertions refute the
difftest distribution (:func:`exactattn.cases.strategies.draws`), which never aims at a
block. Masks print simplified: ``and(and(none, none), and(none, none))`` is ``none``, and
simplifying never changes the allowed set (checked on the definition).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from exactattn.cases import mask_kinds, paths, strategies
from exactattn.testing.coverage import path_of
from exactattn.testing.search import draw

B = 128
N = 300


def _reach(draws, b):
    large = [d for d in draws if d.n_k > 3 * b]
    return {
        "beyond_3b": len(large) / len(draws),
        "tail": sum(d.n_k % b != 0 and d.n_k > b for d in draws) / len(draws),
        "ill": sum(path_of(d) == "ill-conditioned" for d in draws) / len(draws),
        "large_ok": all(math.prod(d.batch) <= 2 and max(d.d, d.v) <= 64 for d in large),
    }


def _drawn(seed=0):
    strategy = paths.check_draws(blocks=(B,), max_n=2048, dtypes=("float32",), modify=True)
    return draw(strategy, N, seed)


def test_the_stated_shares():
    draws = _drawn()
    reach = _reach(draws, B)
    assert reach["beyond_3b"] >= 0.15 and reach["tail"] >= 0.10, reach
    assert reach["ill"] <= 0.05 and reach["large_ok"], reach
    seen = {name: 0 for name in paths.PATHS}
    for d in draws:
        name = path_of(d)
        if name in seen:
            seen[name] += 1
    total = sum(paths.PATHS.values())
    for name, share in paths.PATHS.items():
        assert abs(seen[name] / N - share / total) < 0.08, (name, seen[name])
    causal = [d for d in draws if d.mask.get("kind") == "causal" and d.mask["align"] == "top-left"]
    assert sum(d.n_q != d.n_k for d in causal) >= 10 and sum(d.n_q == 1 for d in draws) >= 15
    # keys past 1024 that some query reaches (a 32-bit tile offset bug needs them): no mask
    # or a decode against a long KV cache
    far = [d for d in draws if d.n_k > 1024 and path_of(d) in ("none", "decode")]
    assert len(far) >= 0.06 * N, len(far)


def test_the_difftest_distribution_fails_the_same_assertions():
    old = draw(strategies.draws(max_n=32, dtypes=("float32",)), N, 0)
    reach = _reach(old, B)
    assert reach["beyond_3b"] < 0.15 and reach["tail"] < 0.10


def test_without_a_claim_the_common_blocks_are_aimed_at():
    draws = draw(paths.check_draws(max_n=2048, dtypes=("float16",)), 200, 1)
    assert {d.block_size for d in draws} == set(paths.COMMON_BLOCKS)
    edges = {d.n_k for d in draws} & {b + e for b in paths.COMMON_BLOCKS for e in (-1, 0, 1)}
    assert len(edges) >= 6


def test_float64_cases_stay_small_and_the_cap_holds():
    draws = draw(paths.check_draws(blocks=(512,), max_n=700, dtypes=("float64", "float32")), 150, 2)
    assert max(max(d.n_q, d.n_k) for d in draws if d.dtype == "float64") <= paths.FLOAT64_MAX_N
    assert max(max(d.n_q, d.n_k) for d in draws) <= 700
    assert all(math.prod(d.batch) * d.n_q * d.n_k <= 1 << 17 for d in draws)


def test_masks_print_simplified():
    none = {"kind": "none"}
    nested = {"kind": "and", "parts": [{"kind": "and", "parts": [none, none]}] * 2}
    assert mask_kinds.simplified(nested) == none
    causal = {"kind": "causal", "align": "top-left"}
    both = {"kind": "and", "parts": [causal, {"kind": "and", "parts": [none, causal]}]}
    assert mask_kinds.describe(mask_kinds.simplified(both)) == "causal[top-left]"
    assert mask_kinds.simplified({"kind": "or", "parts": [causal, none]}) == none


@pytest.mark.parametrize("seed", range(40))
def test_simplifying_keeps_the_allowed_set(seed):
    from exactattn.cases import Draw, build_case

    template = draw(strategies.masks(), 1, seed)[0]
    case = build_case(Draw((2, 3), 5, 7, 2, 2, 3, mask=template, data_seed=seed))
    kept = mask_kinds.allowed(mask_kinds.simplified(case.mask), case.batch, 5, 7)
    assert np.array_equal(kept, case.allowed())


def test_tiny_values_are_ill_conditioned_in_float16_only():
    """Entries near 1e-6 are subnormal in float16 (its normal range ends at 6.1e-5): the
    gradients underflow, so such cases are labelled and rare there; float32 keeps them
    as ordinary cases."""
    half = draw(paths.check_draws(blocks=(B,), max_n=2048, dtypes=("float16",)), N, 0)
    tiny = [d for d in half if d.distribution == "tiny"]
    assert tiny and all(path_of(d) == "ill-conditioned" for d in tiny)
    assert sum(path_of(d) == "ill-conditioned" for d in half) / N <= 0.05
    single = _drawn()
    plain = [d for d in single if d.distribution == "tiny"]
    assert len(plain) >= 0.04 * N and not any(path_of(d) == "ill-conditioned" for d in plain)
