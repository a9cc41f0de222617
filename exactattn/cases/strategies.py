"""Hypothesis strategies for :class:`~exactattn.cases.Draw`: what a case may be.

Sizes include 1 and non-powers of two, ``n_q ≠ n_k`` (cross attention) and ``v ≠ d``; the
block size ranges from 1 to beyond ``n_k``; masks are every leaf kind (causal and sliding
windows in both alignments, key padding, dense tables, document ids) and their and/or
compositions up to depth 2 (:func:`masks`); rows with no allowed key exercise the opt-in
``empty_rows='zero'``. Every input distribution (normal, outliers, logits up to 1e4, tiny
values, small integers for the exact sympy run), dropout with a seed, an explicit scale,
grouped heads (GQA), and for ``exactattn check`` the dtype and memory layout. About half
the cases modify the scores (:func:`scores`): ALiBi in both forms and alignments, T5 buckets,
a dense bias with ``−∞`` entries (full, per head or shared; sometimes a row of them), a
soft-cap alone or before a bias. With a user's program (``program=(mask_mod, score_mod)``)
every case runs it instead of a drawn mask and score modification. Hypothesis shrinks the
sizes, the kinds and the data seed towards the simplest case.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from .case import CHECK_DISTRIBUTIONS, Draw
from .spec import ALIBI_FORMS, ALIGNMENTS

BATCHES = ((), (1,), (2,), (1, 1), (2, 3), (1, 2), (2, 4), (1, 4), (1, 6))


@st.composite
def leaves(draw: st.DrawFn) -> dict[str, Any]:
    """One leaf mask template (random parts filled by :func:`~exactattn.cases.build_case`)."""
    kind = draw(st.sampled_from(("none", "causal", "window", "padding", "dense", "document")))
    align = draw(st.sampled_from(ALIGNMENTS))
    if kind == "causal":
        return {"kind": "causal", "align": align}
    if kind == "window":
        left = draw(st.one_of(st.none(), st.integers(0, 4)))
        right = draw(st.one_of(st.none(), st.integers(0, 3)))
        return {"kind": "window", "left": left, "right": right, "align": align}
    if kind == "dense":
        return {"kind": "dense", "density": 0.6, "empty_row": draw(st.booleans())}
    if kind == "document":
        return {"kind": "document", "docs": draw(st.integers(1, 3))}
    return {"kind": kind}


@st.composite
def masks(draw: st.DrawFn, depth: int = 2) -> dict[str, Any]:
    """A leaf, or an and/or of 2–3 parts each a mask of depth ``depth − 1`` (compositions up
    to depth 2: the ``or_masks`` row-span bug of issue 11 lives there)."""
    if depth == 0 or draw(st.integers(0, 2)) > 0:
        return draw(leaves())
    kind = draw(st.sampled_from(("and", "or")))
    parts = draw(st.lists(masks(depth - 1), min_size=2, max_size=3))
    return {"kind": kind, "parts": parts}


CAPS = (0.5, 2.0, 20.0, 50.0)


@st.composite
def scores(draw: st.DrawFn) -> tuple[dict[str, Any], float | None]:
    """A score-modification template (random parts filled by :func:`~exactattn.cases.build_case`)
    and a soft-cap (None: none); ``none`` first, so hypothesis shrinks towards it."""
    kind = draw(st.sampled_from(("none", "none", "alibi", "t5", "dense", "softcap")))
    if kind == "none":
        return {"kind": "none"}, None
    if kind == "softcap":  # alone, or before a bias
        cap = draw(st.sampled_from(CAPS))
        template, _ = draw(scores()) if draw(st.booleans()) else ({"kind": "none"}, None)
        return template, cap
    if kind == "alibi":
        form = draw(st.sampled_from(ALIBI_FORMS))
        return {"kind": "alibi", "form": form, "align": draw(st.sampled_from(ALIGNMENTS))}, None
    if kind == "t5":
        return {"kind": "t5", "buckets": draw(st.sampled_from((4, 8))), "max_distance": 16}, None
    shape = draw(st.sampled_from(("full", "per_head", "shared")))
    return {"kind": "dense", "shape": shape, "neg_inf": 0.2, "empty_row": draw(st.booleans())}, None


@st.composite
def draws(
    draw: st.DrawFn,
    max_n: int = 12,
    max_d: int = 8,
    dtypes: tuple[str, ...] | None = None,
    layouts: tuple[str, ...] = ("contiguous",),
    batches: tuple[tuple[int, ...], ...] = BATCHES,
    exact_share: int = 10,
    dropout: bool = True,
    program: tuple[str | None, str | None] | None = None,
    modify: bool = True,
) -> Draw:
    """A case description; one in ``exact_share`` is a tiny integer case (0: never);
    ``dropout=False`` when no unit under test replays exactattn's keep-bits; ``modify=False``
    when none takes a bias or a soft-cap (no score modification is drawn); ``program``: a
    user's ``(mask_mod, score_mod)`` references that every case runs (batch dims ≤ 2)."""
    if exact_share and draw(st.integers(0, exact_share - 1)) == 0 and program is None:
        return draw(exact_draws())
    if program is not None:
        batches = tuple(b for b in batches if len(b) <= 2)
    batch = draw(st.sampled_from(batches))
    n_q = draw(st.integers(1, max_n))
    n_k = draw(st.integers(1, max_n))
    distribution = draw(st.sampled_from(CHECK_DISTRIBUTIONS))
    logit = (
        draw(st.sampled_from([10.0, 100.0, 1e3, 1e4])) if distribution == "large_logits" else 0.0
    )
    dropout_p = draw(st.sampled_from([0.0, 0.0, 0.1, 0.5])) if dropout else 0.0
    heads = batch[-1] if len(batch) == 2 else 1
    groups = [g for g in range(1, heads + 1) if heads % g == 0]  # GQA: g query heads per k/v head
    return Draw(
        batch=batch,
        n_q=n_q,
        n_k=n_k,
        d=draw(st.integers(1, max_d)),
        v=draw(st.integers(1, max_d)),
        block_size=draw(st.integers(1, n_k + 2)),
        distribution=distribution,
        logit=logit,
        explicit_scale=draw(st.booleans()),
        mask=draw(masks()) if program is None else _program_mask(program[0]),
        dropout_p=dropout_p,
        seed=draw(st.integers(0, 2**64 - 1)) if dropout_p else 0,
        data_seed=draw(st.integers(0, 2**32 - 1)),
        group=draw(st.sampled_from(groups)),
        dtype=draw(st.sampled_from(dtypes)) if dtypes else None,
        layout=draw(st.sampled_from(layouts)),
        **_score_keywords(draw, program, modify),
    )


def _score_keywords(draw: st.DrawFn, program: Any, modify: bool) -> dict[str, Any]:
    if program is not None:
        return {"score_mod": program[1]}
    return _modification(draw(scores())) if modify else {}


def _program_mask(reference: str | None) -> dict[str, Any]:
    return {"kind": "none"} if reference is None else {"kind": "mask_mod", "fn": reference}


def _modification(drawn: tuple[dict[str, Any], float | None]) -> dict[str, Any]:
    return {"score": drawn[0], "softcap": drawn[1]}


@st.composite
def exact_draws(draw: st.DrawFn) -> Draw:
    """Tiny integer cases: sympy can run them exactly, in closed form."""
    n_k = draw(st.integers(1, 3))
    return Draw(
        batch=draw(st.sampled_from([(), (1,)])),
        n_q=draw(st.integers(1, 3)),
        n_k=n_k,
        d=draw(st.integers(1, 2)),
        v=draw(st.integers(1, 2)),
        block_size=draw(st.integers(1, n_k + 1)),
        distribution="uniform_int",
        mask=draw(leaves()),
        data_seed=draw(st.integers(0, 2**32 - 1)),
        **_modification(draw(scores())),
    )
