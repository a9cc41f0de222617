"""The mask cases of the forward and reverse grids: the library's mask beside its definition.

Each :class:`MaskCase` pairs the mask object the library is given with the allowed set the
specification writes down as inequalities (:mod:`exactattn.proofs.engine.symbolic_spec`), for a
problem of size ``n`` (``n_k = n``; ``n_q`` as the case says). The pairing is written here by hand,
from the documented meaning of each mask, and is the only place the two meet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactattn.core import masks

from . import symbolic_spec
from .checks import Problem
from .coverage_matrix import Coverage
from .symbols import C, SymbolicDropout, identity, matrix, tensor


def _lengths(n: int) -> tuple[int, int]:
    return (n, (n + 1) // 2)


@dataclass(frozen=True)
class MaskCase:
    name: str
    kind: str  # a coverage.MASK_KINDS entry
    alignment: str  # "" when the mask has none
    library: Callable[[int], Any]
    allowed: Callable[[int], symbolic_spec.Allowed]
    n_q: Callable[[int], int] = lambda n: n
    batch: int = 0  # 0: no leading dims; 2: a batch of two (per-batch lengths)
    min_n: int = 1

    def sizes(self, n: int) -> str:
        batch = f" batch={self.batch}" if self.batch else ""
        return f"n_q={self.n_q(n)} n_k={n}{batch}"

    def coverage(self, direction: str, n: int, **features: Any) -> Coverage:
        return Coverage(
            direction, self.kind, self.alignment, n, cross=self.n_q(n) != n,
            batch="batch" if self.batch else "", **features,
        )  # fmt: skip

    def whole_and_split(self, direction: str, n: int, **features: Any) -> tuple[Coverage, ...]:
        """The coverage of a run over whole rows and one over rows split into runs."""
        return (
            self.coverage(direction, n, **features),
            self.coverage(direction, n, **features, row_block=True),
        )


CAUSAL = MaskCase(
    "causal", "causal", "top-left", lambda n: masks.causal(), lambda n: symbolic_spec.causal()
)
CASES = [
    CAUSAL,
    MaskCase(
        "causal, n_q = n_k + 1", "causal", "top-left",
        lambda n: masks.causal(), lambda n: symbolic_spec.causal(), n_q=lambda n: n + 1,
    ),
    MaskCase(
        "causal bottom-right, n_q = n_k − 1", "causal", "bottom-right",
        lambda n: masks.causal("bottom-right"), lambda n: symbolic_spec.causal("bottom-right"),
        n_q=lambda n: n - 1, min_n=2,
    ),
    MaskCase(
        "sliding window (left=1)", "window", "top-left",
        lambda n: masks.sliding_window(1), lambda n: symbolic_spec.window(1, 0), min_n=3,
    ),
    MaskCase(
        "sliding window (left=2, right=1) bottom-right, n_q = n_k − 1", "window", "bottom-right",
        lambda n: masks.sliding_window(2, 1, "bottom-right"),
        lambda n: symbolic_spec.window(2, 1, "bottom-right"), n_q=lambda n: n - 1, min_n=3,
    ),
    MaskCase(
        "key padding", "padding", "",
        lambda n: masks.key_padding(np.array(_lengths(n))),
        lambda n: symbolic_spec.padding(_lengths(n)), batch=2, min_n=2,
    ),
    MaskCase(
        "causal ∧ key padding", "and", "top-left",
        lambda n: masks.causal() & masks.key_padding(np.array(_lengths(n))),
        lambda n: symbolic_spec.causal() & symbolic_spec.padding(_lengths(n)), batch=2, min_n=2,
    ),
    MaskCase(
        "window(0, 0) ∨ key padding(1) bottom-right, n_q = n_k − 1", "or", "bottom-right",
        lambda n: masks.sliding_window(0, 0, "bottom-right") | masks.key_padding(np.array(1)),
        lambda n: symbolic_spec.window(0, 0, "bottom-right") | symbolic_spec.padding((1,)),
        n_q=lambda n: n - 1, min_n=2,
    ),
    MaskCase(
        "causal ∨ window(right=2), n_q = n_k − 3", "or", "top-left",
        lambda n: masks.causal() | masks.sliding_window(None, 2),
        lambda n: symbolic_spec.causal() | symbolic_spec.window(None, 2),
        n_q=lambda n: n - 3, min_n=4,
    ),
]  # fmt: skip
EMPTY_ROWS = MaskCase(
    "window(left=1), n_q = n_k + 2 (the last row has no key)", "window", "top-left",
    lambda n: masks.sliding_window(1), lambda n: symbolic_spec.window(1, 0), n_q=lambda n: n + 2,
)  # fmt: skip
BY_NAME = {case.name: case for case in CASES}


def score_problem(case: MaskCase, n: int, v: int = 2, **extra: Any) -> Problem:
    """Scores free (``Q = I``, ``c = 1``): one independent symbol per (batch, i, j)."""
    n_q = case.n_q(n)
    q = identity(n_q)
    if case.batch:
        k = np.stack([tensor(f"s{b}_", n_q, n).T for b in range(case.batch)])
        v_ = tensor("v", case.batch, n, v)
    else:
        k, v_ = tensor("s", n_q, n).T.copy(), tensor("v", n, v)
    return Problem(q, k, v_, 1, case.library(n), case.allowed(n), **extra)


def full_problem(case: MaskCase, n: int, d: int = 2, v: int = 2, **extra: Any) -> Problem:
    """Symbolic ``Q, K, V`` and scale ``c`` (so dQ is a derivative too)."""
    n_q, lead = case.n_q(n), ((case.batch,) if case.batch else ())
    q, k, v_ = tensor("q", *lead, n_q, d), tensor("k", *lead, n, d), tensor("v", *lead, n, v)
    return Problem(q, k, v_, C, case.library(n), case.allowed(n), **extra)


def symbolic_dropout_problem(n: int) -> Problem:
    """Q, K, V symbolic (n × 2), every keep-factor ρ_ij its own symbol, replayed per tile."""
    return Problem(
        matrix("q", n, 2), matrix("k", n, 2), matrix("v", n, 2), C,
        symbolic_rho=SymbolicDropout.of_shape(n, n),
    )  # fmt: skip
