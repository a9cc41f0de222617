"""Family 9 — score modification (soft-cap, additive bias): forward and reverse exact.

Theorem. For every problem below and every key-block size ``b`` in ``1..n_k+1`` (and with
the query rows split, ``row_block = 2``: every b forward, b = 2 reverse), the library's
tiled forward and reverse with ``softcap=cap`` and/or ``bias=B`` return exactly

    Y_i = Σ_{j∈A_i} e^{s_ij} V_j / Σ_{j∈A_i} e^{s_ij},   s_ij = cap·tanh(c·q_i·k_j / cap) + B_ij,

``lse_i = log Σ_{j∈A_i} e^{s_ij}``, and ``(dQ, dK, dV, dB) = ∂L/∂(Q, K, V, B)`` for
``L = Σ G∘Y``, the derivative taken by sympy of the formula (so ``dB = γ``, summed over the
axes along which ``B`` broadcasts, and 0 at the entries ``B_ij = −∞``, which exclude their
pair). ``Q, K, V``, the scale ``c``, the cap and every finite ``B_ij`` are free symbols (the
cap positive), so the claims hold for all real values; ``A_i`` is the specification's.

Grid: bias alone (cross-attention n_q = n_k + 1, two ``−∞`` entries at fixed positions),
soft-cap alone (causal, symbolic cap), soft-cap then bias under a bottom-right sliding
window with n_q = n_k − 1, a bias per batch element under causal ∧ key padding (batch of
two), a bias broadcast over the query rows (shape (1, n_k)) and a per-head bias with
grouped-query heads (H = 4 over H_kv = 2), n = 3.

The zero test rewrites ``tanh u = (e^{2u} − 1)/(e^{2u} + 1)`` (same value everywhere, the
denominator never 0), see :mod:`proofs.symbolic`. What holds for every n — that the
modification is one elementwise step whose reverse multiplies γ by its derivative — is
Lemma S of the ``general`` family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy

from exactattn.core import masks

from ..engine import symbolic_spec
from ..engine.checks import Problem, check_forward, check_reverse, tiling
from ..engine.coverage_matrix import Coverage
from ..engine.ledger import Obligation
from ..engine.symbols import C, distinct, tensor

FAMILY = "scores"
CAP = sympy.Symbol("cap", positive=True)
N = 3
NEG_INF = -sympy.oo


def free_bias(*shape: int, excluded: tuple[tuple[int, ...], ...] = ()) -> np.ndarray:
    """``B`` of ``shape``, every entry its own real symbol but ``−∞`` at ``excluded``."""
    out = tensor("B", *shape)
    for index in excluded:
        out[index] = NEG_INF
    return out


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], Problem]
    mask: str = "none"  # a coverage.MASK_KINDS entry
    alignment: str = ""
    score: str = "bias"  # "bias", "softcap" or "softcap+bias"
    cross: bool = False
    batch: str = ""
    sizes: str = f"n={N}"
    extra: dict = field(default_factory=dict)

    def coverage(self, direction: str) -> tuple[Coverage, ...]:
        kw = dict(
            mask=self.mask, alignment=self.alignment, n=N, cross=self.cross, batch=self.batch,
            score=self.score,
        )  # fmt: skip
        return (Coverage(direction, **kw), Coverage(direction, row_block=True, **kw))


def _qkv(*lead: int, n_q: int = N, n_k: int = N, d: int = 2, v: int = 2) -> tuple:
    return tensor("q", *lead, n_q, d), tensor("k", *lead, n_k, d), tensor("v", *lead, n_k, v)


def _bias_cross() -> Problem:
    q, k, v = _qkv(n_q=N + 1)
    return Problem(q, k, v, C, bias=free_bias(N + 1, N, excluded=((0, 2), (3, 0))))


def _softcap_causal() -> Problem:
    return Problem(*_qkv(), C, masks.causal(), symbolic_spec.causal(), softcap=CAP)


def _softcap_bias_window() -> Problem:
    align = "bottom-right"
    q, k, v = _qkv(n_q=N - 1)
    return Problem(
        q, k, v, C, masks.sliding_window(1, 0, align), symbolic_spec.window(1, 0, align),
        bias=free_bias(N - 1, N, excluded=((1, 1),)), softcap=CAP,
    )  # fmt: skip


def _lengths() -> tuple[int, int]:
    return (N, 2)


def _bias_per_batch_padding() -> Problem:
    return Problem(
        *_qkv(2, v=1), C, masks.causal() & masks.key_padding(np.array(_lengths())),
        symbolic_spec.causal() & symbolic_spec.padding(_lengths()),
        bias=free_bias(2, N, N, excluded=((0, 2, 1),)),
    )  # fmt: skip


def _bias_over_rows() -> Problem:
    return Problem(
        *_qkv(), C, masks.causal(), symbolic_spec.causal(), bias=free_bias(1, N), softcap=CAP
    )


def _bias_per_head_gqa() -> Problem:
    align = "bottom-right"
    q, k, v = tensor("q", 1, 4, N, 1), tensor("k", 1, 2, N, 1), tensor("v", 1, 2, N, 1)
    return Problem(
        q, k, v, C, masks.causal(align), symbolic_spec.causal(align), enable_gqa=True,
        bias=free_bias(1, 4, N, N, excluded=((0, 1, 2, 0),)),
    )  # fmt: skip


CASES = [
    Case("bias B_ij free, two −∞ entries, n_q = n_k + 1", _bias_cross, cross=True,
         sizes=f"n_q={N + 1} n_k={N}"),
    Case("softcap, symbolic cap, causal", _softcap_causal, "causal", "top-left", "softcap"),
    Case("softcap then bias, window(1, 0) bottom-right, n_q = n_k − 1", _softcap_bias_window,
         "window", "bottom-right", "softcap+bias", cross=True, sizes=f"n_q={N - 1} n_k={N}"),
    Case("bias per batch element, causal ∧ key padding", _bias_per_batch_padding, "and",
         "top-left", batch="batch", sizes=f"n={N} batch=2"),
    Case("softcap then a bias broadcast over the rows (1, n_k), causal", _bias_over_rows,
         "causal", "top-left", "softcap+bias"),
    Case("bias per head, grouped-query heads (H=4 over H_kv=2), causal bottom-right",
         _bias_per_head_gqa, "causal", "bottom-right", batch="GQA", sizes=f"n={N} d=v=1"),
]  # fmt: skip
BY_NAME = {case.name: case for case in CASES}


def _runs(check: Callable[..., Any], pb: Problem, split: tuple[int, ...]) -> str:
    """Every block size with the rows whole; the block sizes ``split`` with row_block 2 (one
    b per distinct tiling of each: :func:`proofs.inputs.distinct`)."""
    whole = distinct(range(1, pb.n_k + 2), lambda b: tiling(pb, b))
    halves = distinct(split, lambda b: tiling(pb, b, 2))
    runs = [(b, None) for b in whole] + [(b, 2) for b in halves]
    for b, row_block in runs:
        check(pb, b, row_block)
    return f"{pb.n_k + 1 + len(split)} runs, {len(runs)} distinct tilings"


def forward(case: Case) -> Obligation:
    return Obligation(
        FAMILY, f"forward: {case.name}", f"{case.sizes} b=1..n_k+1, rows whole and split",
        lambda: _runs(check_forward, case.build(), tuple(range(1, N + 2))),
        coverage=case.coverage("forward"),
    )  # fmt: skip


def reverse(case: Case) -> Obligation:
    what = "dQ, dK, dV" + (", dB" if "bias" in case.score else "")
    return Obligation(
        FAMILY, f"reverse ({what}): {case.name}", f"{case.sizes} b=1..n_k+1; split at b=2",
        lambda: _runs(check_reverse, case.build(), (2,)), coverage=case.coverage("reverse"),
    )  # fmt: skip


def obligations(max_n: int = 4) -> list[Obligation]:
    return [*(forward(case) for case in CASES), *(reverse(case) for case in CASES)]
