"""The specification side: masks and dropout from their definitions agree with the library.

:mod:`exactattn.cases.spec` writes each mask kind as inequalities on ``i, j``, offsets and
lengths, and the keep-bits as the documented hash in unsigned 64-bit arithmetic, without
calling :mod:`exactattn.core.masks` or :mod:`exactattn.core.dropout`. These tests hold the two
independent implementations against each other, over every kind and and/or composition
(depth 2), both alignments, ``n_q ≠ n_k`` and batch shapes; and show the cross-check fails
when one side is wrong.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactattn.cases import Draw, build_case, mask_kinds, spec
from exactattn.cases.strategies import BATCHES
from exactattn.cases.strategies import masks as mask_templates
from exactattn.cases.strategies import scores as score_templates
from exactattn.core import masks
from exactattn.core.dropout import Dropout


def _library_allowed(case) -> np.ndarray:
    n = case.sizes
    geometry = masks.Geometry(n["n_q"], n["n_k"], case.batch)
    return np.broadcast_to(
        masks.create_mask(case.mask_object(), geometry), (*case.batch, n["n_q"], n["n_k"])
    )


@settings(max_examples=150, deadline=None)
@given(
    template=mask_templates(),
    batch=st.sampled_from(BATCHES),
    n_q=st.integers(1, 9),
    n_k=st.integers(1, 9),
    seed=st.integers(0, 2**16),
)
def test_every_mask_and_composition_matches_the_library(template, batch, n_q, n_k, seed):
    case = build_case(Draw(batch, n_q, n_k, 2, 2, 2, mask=template, data_seed=seed))
    assert np.array_equal(mask_kinds.allowed(case.mask, batch, n_q, n_k), _library_allowed(case))


def test_the_cross_check_fails_when_the_definition_is_wrong(monkeypatch):
    """An alignment offset of the wrong sign is caught by the comparison above."""
    case = build_case(Draw((2,), 3, 5, 2, 2, 2, mask={"kind": "causal", "align": "bottom-right"}))
    good = mask_kinds.allowed(case.mask, case.batch, 3, 5)
    assert np.array_equal(good, _library_allowed(case))
    monkeypatch.setattr(spec, "offset", lambda s, n_q, n_k, batch=(): n_q - n_k)
    wrong = mask_kinds.allowed(case.mask, case.batch, 3, 5)
    assert not np.array_equal(wrong, _library_allowed(case))


def _strips(n_q: int, cuts: list[int]) -> list[tuple[int, int]]:
    edges = sorted({0, n_q, *(c % (n_q + 1) for c in cuts)})
    return list(itertools.pairwise(edges))


@settings(max_examples=150, deadline=None)
@given(
    template=mask_templates(),
    score=score_templates(),
    batch=st.sampled_from(BATCHES),
    n_q=st.integers(1, 9),
    n_k=st.integers(1, 9),
    seed=st.integers(0, 2**16),
    cuts=st.lists(st.integers(0, 9), max_size=3),
)
def test_row_strips_are_the_table_read_in_pieces(template, score, batch, n_q, n_k, seed, cuts):
    """A long case reads its allowed set and bias one strip of query rows at a time: the
    strips, stacked, are the whole table of the definition, for every mask and score kind."""
    spec_, cap = score
    draw = Draw(batch, n_q, n_k, 2, 2, 2, mask=template, data_seed=seed, score=spec_, softcap=cap)
    case = build_case(draw)
    strips = _strips(n_q, cuts)
    allowed = np.concatenate([case.allowed_rows(a, b) for a, b in strips], axis=-2)
    assert np.array_equal(allowed, case.allowed())
    if case.bias is not None:
        full = np.broadcast_to(case.bias, (*batch, n_q, n_k))
        parts = [np.broadcast_to(case.bias_rows(a, b), (*batch, b - a, n_k)) for a, b in strips]
        assert np.array_equal(np.concatenate(parts, axis=-2), full)
        if case.score["kind"] in ("alibi", "t5"):  # evaluated from the spec, strip by strip
            strip = spec.bias(case.score, batch, n_q, n_k, (n_q - 1, n_q))
            assert np.array_equal(
                np.broadcast_to(strip, full[..., -1:, :].shape), full[..., -1:, :]
            )


def test_a_strip_read_from_the_wrong_rows_is_caught():
    """The check above can fail: strips whose rows are counted from 0 (not from their start)
    differ from the table under a causal mask."""
    case = build_case(Draw((), 6, 6, 2, 2, 2, mask={"kind": "causal"}))
    honest = np.concatenate([case.allowed_rows(0, 3), case.allowed_rows(3, 6)], axis=-2)
    assert np.array_equal(honest, case.allowed())
    wrong = np.concatenate([case.allowed_rows(0, 3), case.allowed_rows(0, 3)], axis=-2)
    assert not np.array_equal(wrong, case.allowed())


def test_definitions_by_hand():
    """A few entries written out: bottom-right causal, a window, padding, documents."""
    causal = mask_kinds.allowed({"kind": "causal", "align": "bottom-right"}, (), 2, 4)
    assert causal.tolist() == [[True, True, True, False], [True, True, True, True]]
    window = mask_kinds.allowed({"kind": "window", "left": 1, "right": 0}, (), 3, 3)
    assert window.tolist() == [[True, False, False], [True, True, False], [False, True, True]]
    padding = mask_kinds.allowed({"kind": "padding", "lengths": [1, 3]}, (2, 5), 1, 3)
    assert padding[0].all(axis=(0, 1)).tolist() == [True, False, False]
    assert padding[1].all(axis=(0, 1)).tolist() == [True, True, True]
    docs = mask_kinds.allowed({"kind": "document", "q_doc": [0, 1], "k_doc": [0, 0, 1]}, (), 2, 3)
    assert docs.tolist() == [[True, True, False], [False, False, True]]


@pytest.mark.parametrize("seed", [0, 1, 2**32 + 7, 2**63 + 12345, 2**64 - 1])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_bits_match_the_library(seed, p):
    batch, n_q, n_k = (2, 3), 7, 9
    index = np.arange(math.prod(batch)).reshape((*batch, 1, 1))
    library = Dropout(p, seed).keep(index, np.arange(n_q)[:, None], np.arange(n_k)[None, :])
    assert np.array_equal(
        spec.keep(p, seed, batch, n_q, n_k), np.broadcast_to(library, (*batch, n_q, n_k))
    )


def test_keep_rate_and_factors():
    """1 − p of the bits are kept (within 5 sigma) and ρ = r/(1 − p) exactly."""
    for p in (0.1, 0.5, 0.9):
        bits = spec.keep(p, 12345, (4,), 128, 128)
        sigma = math.sqrt(p * (1 - p) / bits.size)
        assert abs(bits.mean() - (1 - p)) < 5 * sigma
        rho = spec.rho(p, 12345, (4,), 128, 128)
        assert set(np.unique(rho)) <= {0.0, 1 / (1 - p)}
        assert np.array_equal(rho != 0, bits)
    assert np.array_equal(spec.rho(0.0, None, (2,), 3, 4), np.ones((2, 3, 4)))


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=5),
    template=st.sampled_from(
        [
            {"kind": "none"},
            {"kind": "causal", "align": "top-left"},
            {"kind": "window", "left": 1, "right": 0},
            {"kind": "window", "left": None, "right": 2},
            {"kind": "window", "left": 0, "right": None},
        ]
    ),
)
def test_a_varlen_batch_is_each_sequence_aligned_bottom_right(lengths, template):
    """The varlen batch's mask (:func:`mask_kinds.per_sequence`) on the padded ``(B, n_q,
    n_k)`` grid is, per sequence, the library's packed mask
    (:class:`~exactattn.core.masks.PackedSequences`, flash-attn's alignment ``o_b = ℓ^k_b −
    ℓ^q_b``) in its top-left ``ℓ^q_b × ℓ^k_b`` corner and empty elsewhere, whatever the
    template's alignment."""
    q_lengths, k_lengths = (list(x) for x in zip(*lengths, strict=True))
    n_q, n_k = max(q_lengths) + 1, max(k_lengths) + 1  # padding on both sides
    mask = mask_kinds.per_sequence(template, q_lengths, k_lengths, n_q)
    table = mask_kinds.allowed(mask, (len(lengths),), n_q, n_k)
    window = mask_kinds.window(template)
    left, right = (None, None) if window is None else window[:2]
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(x)]) for x in (q_lengths, k_lengths))
    packed = masks.PackedSequences(cu_q, cu_k, left, right)
    geometry = masks.Geometry(int(cu_q[-1]), int(cu_k[-1]))
    i, j = np.arange(cu_q[-1])[:, None], np.arange(cu_k[-1])[None, :]
    library = np.broadcast_to(packed.tile(i, j, geometry), (len(i), j.shape[1]))
    for b, (lq, lk) in enumerate(lengths):
        corner = library[cu_q[b] : cu_q[b + 1], cu_k[b] : cu_k[b + 1]]
        assert np.array_equal(table[b, :lq, :lk], corner), (b, lq, lk)
        assert table[b].sum() == corner.sum()  # nothing outside the corner
