"""A user's FlexAttention program for ``exactattn check``: loaded and tried before the search.

``exactattn check flex --mask-mod MODULE:FN [--score-mod MODULE:FN]`` runs every case on the
user's ``mask_mod(b, h, q_idx, kv_idx)`` and ``score_mod(score, b, h, q_idx, kv_idx)``.
:func:`try_program` evaluates both once on the largest index grid the check draws, so that a
reference that names nothing, a mask_mod that does not return booleans, a score_mod that
calls a torch function on the score (the certified reference evaluates it over arb balls,
where the score is no tensor), one that changes the shape, or an index out of range is a
clear error naming the mod, before any case is drawn.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cases import spec
from ..core.scores import keeps_shape, shape_of
from ..infra import loading

GRID = (2, 6)  # the largest (B, H) the strategies draw for a program


def try_program(mask_mod: str | None, score_mod: str | None, max_n: int) -> None:
    """Raise ValueError / TypeError (the message names the mod) unless both mods run on the
    ``(B, H, max_n, max_n)`` grid; see the module docstring."""
    if mask_mod is not None:
        fn = loading.load_callable(mask_mod, "--mask-mod")
        _guarded("--mask-mod", mask_mod, lambda: spec.tabulated(fn, mask_mod, GRID, max_n, max_n))
    if score_mod is not None:
        fn = loading.load_callable(score_mod, "--score-mod")
        _guarded("--score-mod", score_mod, lambda: _try_score_mod(fn, score_mod, max_n))


def _guarded(what: str, reference: str, run: Any) -> None:
    """``run()``, its errors naming the mod (and the grid, for an index out of range)."""
    try:
        run()
    except IndexError as error:
        raise ValueError(
            f"{what} {reference} indexed out of range on the grid (B, H, n_q, n_k) = "
            f"{GRID} × (--max-n)²: {error}"
        ) from error
    except (TypeError, ValueError) as error:
        if reference in str(error):
            raise
        raise type(error)(f"{what} {reference}: {error}") from error


def _try_score_mod(fn: Any, reference: str, n: int) -> None:
    from ..backends import NumpyContext
    from ..core.ops import Dual, TorchFunctionOnScore, grid_indices

    shape = (*GRID, n, n)
    try:
        out = fn(Dual(NumpyContext("float64"), np.zeros(shape), 1.0), *grid_indices(GRID, n, n))
    except TorchFunctionOnScore as error:
        raise TypeError(
            f"--score-mod {reference} calls torch.{error.function} on the score: the certified "
            "reference evaluates the score_mod over arb balls, where the score is no torch "
            f"tensor; write it with exactattn.ops.{error.function} (it dispatches on the "
            "score's type)"
        ) from None
    got = shape_of(out)
    if not keeps_shape(got, shape):
        raise ValueError(
            f"--score-mod {reference} returned shape {got} for scores of shape {shape}; a "
            "score_mod maps each score to one score"
        )
