"""Bugs at block boundaries and on real calling paths, caught with only --claim/--supports.

A FlashAttention-2-style tiled kernel in torch (:mod:`.kernels`, key blocks of ``b``) with
one bug each of :data:`kernels.REACH_BUGS` — ``is_causal`` aligned bottom-right, the
diagonal dropped in blocks after the first, keys beyond 1024 ignored, the partial tail
block one key short, ``acc`` not rescaled between blocks — must fail
:func:`exactattn.testing.assert_attention_close` given only the kernel's claim (its block
size) and ``--supports dropout=no``; its correct twin must pass the same check. The
distribution (:mod:`exactattn.cases.paths`) finds them by itself: it calls ``is_causal``
with ``n_q ≠ n_k``, sizes ``n_k`` at ``b ± 1``, ``k·b ± 1`` and beyond 1024 when the cap
allows.
"""

from __future__ import annotations

import pytest

from exactattn.testing import assert_attention_close
from tests.optional import requires

requires("torch")

from . import kernels

FAST = {  # bug -> (block sizes, examples, max_n): the default suite
    "causal-bottom-right": ((16,), 60, 80),
    "diagonal-dropped-after-first": ((16,), 60, 80),
    "tail-block-short": ((16,), 60, 80),
    "rescale-acc-only-l": ((16,), 60, 80),
}
SLOW = {  # every bug at two more block sizes, the default profile's sizes
    bug: ((32, 128), 200, 2048) for bug in kernels.REACH_BUGS
}
# Measured (/tmp script, every case judged until the first failure, as `exactattn check`
# with only --claim/--supports): all five bugs caught at b in {16, 32, 64, 128} and seeds
# 0-4 (100 of 100), the twin passes all 20 runs; keys-beyond-1024-ignored is caught within
# the first 51 cases (decode against a long KV cache, n_k up to 2048).


def _check(bug, block, examples, max_n, seed=0):
    return assert_attention_close(
        kernels.sdpa(bug, block),
        convention="sdpa",
        claim=f"scores=fp32,stats=fp32,acc=fp32,block={block}",
        supports="dropout=no",
        examples=examples,
        dtypes=("float32",),
        max_n=max_n,
        seed=seed,
        dropout_probe=False,
    )


def test_every_reach_bug_is_tested():
    assert set(SLOW) == set(kernels.REACH_BUGS) and set(FAST) <= set(SLOW)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("bug", list(FAST))
def test_a_reach_bug_is_caught(bug):
    blocks, examples, max_n = FAST[bug]
    for block in blocks:
        with pytest.raises(AssertionError, match=r"^FAIL "):
            _check(bug, block, examples, max_n)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_correct_twin_passes():
    result = _check(None, 16, 60, 80)
    assert sum(c["ok"] for c in result.report.counts.values()) > 30


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("bug", list(SLOW))
@pytest.mark.parametrize("seed", [1])
def test_a_reach_bug_is_caught_at_several_block_sizes(bug, seed):
    blocks, examples, max_n = SLOW[bug]
    for block in blocks:
        with pytest.raises(AssertionError, match=r"^FAIL "):
            _check(bug, block, examples, max_n, seed)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("block", [32, 128])
def test_the_correct_twin_passes_at_several_block_sizes(block):
    _check(None, block, 200, 2048)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_twin_passes_where_its_dk_is_float32_subnormal(seed):
    """Found by the default check of the twin (b = 32, 64; seeds 0, 1, 4): autograd through
    ``s = c·(q·k)`` rounds ``c·γ_ij`` before the dK products, so their underflows are μ each
    in the scaled sum — the bound had charged ``c·μ`` (failed on every seed here before
    :func:`exactattn.error.bounds._key_side` stopped shrinking them by ``|c| = 1/8``)."""
    import numpy as np

    from exactattn import targets
    from exactattn.cases import Case
    from exactattn.testing.case_check import Options, check_case

    claim = targets.Claim.parse(kernels.CLAIM.replace(f"block={kernels.BLOCK}", "block=16"))
    supports = targets.Capabilities.parse("dropout=no", targets.user_capabilities("sdpa"))
    fn = kernels.sdpa(None, 16)
    target = targets.from_callable(fn, convention="sdpa", claim=claim, supports=supports)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 1, 1, 64)) * 2.0**-140  # dK_j = c·Σ γ q: fp32 subnormals
    k, v, g = (rng.standard_normal(shape) for shape in ((1, 1, 40, 64),) * 2 + ((1, 1, 1, 64),))
    case = Case(q, k, v, g, 16, dtype="float32")
    (found,) = check_case(case, [targets.Variant(target, "float32")], Options(fast_reference=True))
    assert found.status == "ok", found.detail
