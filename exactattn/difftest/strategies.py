"""Hypothesis strategies for :class:`~exactattn.difftest.cases.Spec`: what a case may be.

Sizes include 1 and non-powers of two; the block size ranges from 1 to beyond ``n_k``;
every mask kind (dense masks with nonempty rows, and with an empty row to exercise the
opt-in ``empty_rows='zero'``), every input distribution (normal, outliers, logits up to
1e4, tiny values, small integers for the exact sympy run), dropout with a seed, an explicit
scale. Hypothesis shrinks the sizes, the kinds and the data seed towards the simplest case.
"""

from __future__ import annotations

from hypothesis import strategies as st

from .cases import DISTRIBUTIONS, MASK_KINDS, Spec


@st.composite
def specs(draw: st.DrawFn, max_n: int = 12, max_d: int = 8) -> Spec:
    if draw(st.integers(0, 9)) == 0:
        return draw(exact_specs())
    batch = draw(st.sampled_from([(), (1,), (2,), (2, 3), (1, 2)]))
    n_q = draw(st.integers(1, max_n))
    n_k = draw(st.integers(1, max_n))
    d = draw(st.integers(1, max_d))
    v = draw(st.integers(1, max_d))
    block_size = draw(st.integers(1, n_k + 2))
    distribution = draw(st.sampled_from(DISTRIBUTIONS))
    logit = (
        draw(st.sampled_from([10.0, 100.0, 1e3, 1e4])) if distribution == "large_logits" else 0.0
    )
    mask = draw(st.sampled_from(MASK_KINDS))
    window = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    dropout_p = draw(st.sampled_from([0.0, 0.0, 0.1, 0.5]))
    return Spec(
        batch=batch,
        n_q=n_q,
        n_k=n_k,
        d=d,
        v=v,
        block_size=block_size,
        distribution=distribution,
        logit=logit,
        explicit_scale=draw(st.booleans()),
        mask=mask,
        window=window,
        dropout_p=dropout_p,
        seed=draw(st.integers(0, 2**64 - 1)) if dropout_p else 0,
        data_seed=draw(st.integers(0, 2**32 - 1)),
    )


@st.composite
def exact_specs(draw: st.DrawFn) -> Spec:
    """Tiny integer cases (one in ten): sympy can run them exactly, in closed form."""
    n_k = draw(st.integers(1, 3))
    return Spec(
        batch=draw(st.sampled_from([(), (1,)])),
        n_q=draw(st.integers(1, 3)),
        n_k=n_k,
        d=draw(st.integers(1, 2)),
        v=draw(st.integers(1, 2)),
        block_size=draw(st.integers(1, n_k + 1)),
        distribution="uniform_int",
        mask=draw(st.sampled_from(MASK_KINDS)),
        window=(draw(st.integers(0, 2)), 0),
        data_seed=draw(st.integers(0, 2**32 - 1)),
    )
