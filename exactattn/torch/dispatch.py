"""Which pass runs a call: the Triton kernels on CUDA when they express it, else the generic
:mod:`exactattn.core.algorithm`.

The kernels (:mod:`exactattn.torch.triton_kernels`) take a :class:`~exactattn.core.masks.Band`
(causal or a window, either alignment, per-batch key lengths) and
:class:`~exactattn.core.scores.KernelScores` (a softcap, then a bias tensor) over
``(B, H, n, d)`` float16/bfloat16/float32 inputs with ``d ≤ 256``, without dropout; every
other call takes the generic path.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from ..core.masks import Band, Mask
from ..core.scores import KernelScores, ScoreMod

IMPLS = ("auto", "generic", "triton")


@functools.cache
def triton() -> Any:
    """The Triton kernels module (imported on first use: never on the CPU's auto path)."""
    from . import triton_kernels

    return triton_kernels


def triton_available() -> bool:
    try:
        triton()
    except Exception:  # no triton, or no driver it can use
        return False
    return True


@dataclass(frozen=True)
class Kernel:
    """A call as the fused kernels take it: the mask's band and the score modifications."""

    band: Band
    scores: KernelScores


def kernel_plan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Mask | None,
    band: Band | None,
    *,
    dropout: bool,
    score_mod: ScoreMod | None,
    impl: str,
    enable_gqa: bool,
) -> Kernel | None:
    """The kernels' arguments when this call runs the Triton kernels, else None.

    ``band`` is ``mask`` lowered (by the caller, once per call; None when no band says it).
    """
    if impl == "generic" or (impl == "auto" and q.device.type != "cuda"):
        return None
    reasons = []
    if dropout:
        reasons.append("dropout")
    scores = KernelScores() if score_mod is None else score_mod.lower()
    if scores is None:
        reasons.append("a score modification other than a softcap then a bias tensor")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        reasons.append(f"dtype {q.dtype}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        reasons.append("inputs that are not (B, H, n, d)")
    elif (
        q.shape[0] != k.shape[0]
        or k.shape[:2] != v.shape[:2]
        or (not enable_gqa and q.shape[1] != k.shape[1])
    ):
        reasons.append("broadcast batch or head dims")
    if max(q.shape[-1], v.shape[-1]) > 256:
        reasons.append("head dims above 256")
    if not reasons and band is None:
        reasons.append(f"the mask {type(mask).__name__}")
    if not reasons and not triton_available():
        reasons.append("triton is not importable")
    if reasons and impl == "triton":
        raise ValueError(f"impl='triton' cannot run this call: {', '.join(reasons)}")
    return None if reasons else Kernel(band, scores)
