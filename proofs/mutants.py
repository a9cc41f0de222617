"""Family 6 — refutations: deliberately broken variants of one step must be REFUTED.

A prover that cannot fail proves nothing. Each mutant replaces *one* step of the
library's algorithm (a module-level function of ``exactattn.algorithm``, which the loops
look up at call time, or the context's ``max``) for the duration of one check, and runs
the *same* obligation checker as families 2, 3 and 5 on it. Theorem (of the test
harness): every mutant below is REFUTED with a concrete numeric counterexample.

1. merge without rescaling the old accumulator (``α = 1``)            → forward family
2. merge with the rescale exponent's sign flipped (``e^{M − m_old}``)  → forward family
3. running max kept from the current block only (stored ``m = m_block``) → forward (lse)
4. running max from the current block only, used as the shift too   → overflow family
   (exact in exact arithmetic, as Lemma B says, but ``e^{m_old − m_block}`` can exceed 1)
5. ``δ = 0``                                                        → reverse family
6. ``c`` missing from dK                                            → reverse family
7. mask ignored in the reverse (the allowed tile dropped in ``tile_scores``, in the
   backward call only)                                              → reverse family
8. self-attention without the dV term (``dX = dQ + dK``)            → reverse family
9. min instead of max (block max and merge)                         → overflow family
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import numpy as np
import sympy

import exactattn
from exactattn import algorithm, masks
from exactattn.algorithm import Summary, safe_shift

from . import forward, overflow, reverse
from .engine import Obligation
from .inputs import C, matrix, row_upstream, score_inputs

FAMILY = "mutants"
ORIGINAL_MERGE = algorithm.merge
ORIGINAL_TILE_SCORES = algorithm.tile_scores


def merge_no_rescale(ctx: Any, a: Summary, b: Summary) -> Summary:
    m = ctx.maximum(a.m, b.m)
    beta = ctx.exp(b.m - safe_shift(ctx, m))
    return Summary(m, a.l + b.l * beta, a.z + b.z * beta[..., None])


def merge_wrong_sign(ctx: Any, a: Summary, b: Summary) -> Summary:
    m = ctx.maximum(a.m, b.m)
    shift = safe_shift(ctx, m)
    alpha = ctx.exp(shift - safe_shift(ctx, a.m))  # e^{M − m_old}: the sign flipped
    beta = ctx.exp(b.m - shift)
    return Summary(m, a.l * alpha + b.l * beta, a.z * alpha[..., None] + b.z * beta[..., None])


def merge_block_max_stored(ctx: Any, a: Summary, b: Summary) -> Summary:
    merged = ORIGINAL_MERGE(ctx, a, b)
    return Summary(b.m, merged.l, merged.z)


def merge_block_max_shift(ctx: Any, a: Summary, b: Summary) -> Summary:
    # A context whose maximum returns the block's m makes the real merge shift by it.
    return ORIGINAL_MERGE(_BlockMax(ctx), a, b)


class _BlockMax:
    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx

    def maximum(self, a: Any, b: Any) -> Any:
        return b

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def delta_zero(ctx: Any, g: Any, y: Any) -> Any:
    return ctx.zeros(g.shape[:-1])


def key_gradient_no_scale(ctx: Any, gamma: Any, q: Any, scale: Any) -> Any:
    return ctx.matmul(ctx.transpose(gamma), q)


def value_gradient_zero(ctx: Any, weights: Any, g: Any) -> Any:
    return ctx.zeros((weights.shape[-1], g.shape[-1]))


def tile_scores_unmasked(
    ctx: Any, q: Any, k: Any, scale: Any, allowed: Any, mod: Any = None
) -> Any:
    return ORIGINAL_TILE_SCORES(ctx, q, k, scale, None, mod)


class MinContext(overflow.RecordingContext):
    """The recording sympy context with ``sympy.Min`` where the max belongs."""

    _max2 = staticmethod(sympy.Min)


@contextlib.contextmanager
def patched(name: str, replacement: Callable) -> Iterator[None]:
    with mock.patch.object(algorithm, name, replacement):
        yield


def _forward_check(patch_name: str, replacement: Callable) -> Callable[[], None]:
    q, k, v = matrix("q", 2, 2), matrix("k", 3, 2), matrix("v", 3, 2)

    def check() -> None:
        with patched(patch_name, replacement):
            forward.check_forward(q, k, v, C, 1)

    return check


def _reverse_check(patch_name: str, replacement: Callable) -> Callable[[], None]:
    q, k, v = matrix("q", 2, 2), matrix("k", 2, 2), matrix("v", 2, 2)

    def check() -> None:
        with patched(patch_name, replacement):
            reverse.check_reverse(q, k, v, C, 1)

    return check


def _mask_ignored_in_reverse() -> None:
    n, b = 2, 2
    q, k, v = score_inputs(n, n, 1)
    mask = masks.causal()
    allowed = np.tril(np.ones((n, n), dtype=bool))
    y, stats = exactattn.attention(
        q, k, v, scale=1, block_size=b, mask=mask, backend="sympy", return_stats=True
    )
    g = row_upstream(n, 1, 0)
    with patched("tile_scores", tile_scores_unmasked):
        _, dk, dv = exactattn.attention_backward(
            q, k, v, y, stats, g, scale=1, block_size=b, mask=mask, backend="sympy"
        )
    spec = reverse._spec_grads(q, k, v, 1, 0, g, allowed, wrt=[k, v])
    reverse.check_equal("row 0: tiled dK vs ∂L/∂K", dk, spec[0])
    reverse.check_equal("row 0: tiled dV vs ∂L/∂V", dv, spec[1])


def _self_without_dv() -> None:
    with patched("value_gradient", value_gradient_zero):
        reverse.check_self(matrix("x", 2, 2), C, 1)


def _overflow_with(patch_name: str | None, replacement: Any, ctx_type: type) -> Callable[[], None]:
    def check() -> None:
        with contextlib.ExitStack() as stack:
            if patch_name is not None:
                stack.enter_context(patched(patch_name, replacement))
            for order in ((0, 1), (1, 0)):
                for b in (1, 2):
                    overflow.check_case(ctx_type, order, b)

    return check


MUTANTS: list[tuple[str, str, Callable[[], None]]] = [
    (
        "merge: old accumulator not rescaled",
        "fwd n_q=2 n_k=3 b=1",
        _forward_check("merge", merge_no_rescale),
    ),
    (
        "merge: rescale exponent sign flipped",
        "fwd n_q=2 n_k=3 b=1",
        _forward_check("merge", merge_wrong_sign),
    ),
    (
        "merge: stored m is the current block's max",
        "fwd n_q=2 n_k=3 b=1",
        _forward_check("merge", merge_block_max_stored),
    ),
    (
        "merge: shift by the current block's max",
        "overflow n=2 b=1,2",
        _overflow_with("merge", merge_block_max_shift, overflow.RecordingContext),
    ),
    ("softmax_delta: δ = 0", "rev n=2 b=1", _reverse_check("softmax_delta", delta_zero)),
    (
        "key_gradient: c missing from dK",
        "rev n=2 b=1",
        _reverse_check("key_gradient", key_gradient_no_scale),
    ),
    ("tile_scores: mask ignored in the reverse", "rev causal n=2 b=2", _mask_ignored_in_reverse),
    ("self-attention without dV (dX = dQ + dK)", "rev self n=2 b=1", _self_without_dv),
    ("ctx: min instead of max", "overflow n=2 b=1,2", _overflow_with(None, None, MinContext)),
]


def obligations(max_n: int = 4) -> list[Obligation]:
    return [
        Obligation(FAMILY, name, sizes, check, expect_refuted=True)
        for name, sizes, check in MUTANTS
    ]
