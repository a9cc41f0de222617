"""FlexAttention's documented examples as programs, each with its specification.

The mods are written as the FlexAttention blog and attention-gym write them (index tensors,
torch constants indexed by them, ``and_masks``/``or_masks``), except that the soft-cap calls
``exactattn.core.ops.tanh`` (torch's ``tanh`` on torch tensors, so FlexAttention runs it too) so
that every program also runs on the NumPy, mpmath, flint and sympy backends. The ``allowed``
and ``bias`` of each program are the same definitions written independently, with NumPy
broadcasting over the whole grid (:mod:`.spec`), never by calling the mods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.nn.attention.flex_attention import and_masks, or_masks

from exactattn.core import masks, ops

from . import spec

WINDOW, DILATION, CAP = 4, 2, 2.0


@dataclass(frozen=True)
class Program:
    """One FlexAttention program and its specification."""

    mask_mod: Callable[..., Any] | None  # FlexAttention's, for create_block_mask
    score_mod: Callable[..., Any] | None
    allowed: np.ndarray  # (B, H, n, n) bool: the definition of the mask
    bias: Callable[[torch.Tensor], torch.Tensor] | None = None  # of the table, (B|1, H, n, n)
    softcap: float | None = None
    exact_mask: Any = None  # what exactattn is given when it differs (its own combinators)
    table: torch.Tensor | None = None  # a tensor the score_mod reads (its gradient is checked)

    @property
    def sdpa_expressible(self) -> bool:
        """Mask plus additive bias: torch's SDPA can compute it from the materialised bias."""
        return self.softcap is None


def programs(
    batch: int, heads: int, n: int, seed: int = 0, dtype: torch.dtype = torch.float64
) -> dict[str, Program]:
    """The catalogue for inputs ``(batch, heads, n, ·)``: constants drawn from ``seed``,
    real tensors the score_mods read (ALiBi slopes, the position table) of ``dtype``."""
    rng = np.random.default_rng(seed)
    doc_np = np.sort(rng.integers(0, 3, (batch, n)), axis=-1)
    prefix_np = rng.integers(0, n, batch)
    real = torch.empty((), dtype=dtype).numpy().dtype  # dtype's NumPy twin
    slopes_np = (2.0 ** (-8.0 * (np.arange(heads) + 1) / heads)).astype(real)
    table = torch.from_numpy(rng.standard_normal((heads, 2 * n - 1)).astype(real))
    doc, prefix, slopes = (torch.from_numpy(x) for x in (doc_np, prefix_np, slopes_np))
    b, h, i, j = spec.grid(batch, heads, n, n)
    full = np.ones((batch, heads, n, n), dtype=bool)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def sliding_window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= WINDOW)

    def prefix_lm(b, h, q_idx, kv_idx):
        return kv_idx <= prefix[b]

    def document(b, h, q_idx, kv_idx):
        return doc[b, q_idx] == doc[b, kv_idx]

    def dilated_sliding_window(b, h, q_idx, kv_idx):
        diff = q_idx - kv_idx
        return (diff >= 0) & (diff < WINDOW * DILATION) & (diff % DILATION == 0)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def relative_position(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + n - 1]

    def soft_cap(score, b, h, q_idx, kv_idx):
        return CAP * ops.tanh(score / CAP)

    is_causal = np.broadcast_to(i >= j, full.shape)
    same_doc = np.broadcast_to(doc_np[:, None, :, None] == doc_np[:, None, None, :], full.shape)
    in_prefix = np.broadcast_to(j <= prefix_np[:, None, None, None], full.shape)
    in_window = is_causal & (i - j <= WINDOW)
    dilated = np.broadcast_to(
        (i - j >= 0) & (i - j < WINDOW * DILATION) & ((i - j) % DILATION == 0), full.shape
    )
    return {
        "causal": Program(causal, None, is_causal),
        "sliding-window": Program(sliding_window, None, in_window),
        "prefix-lm (flex or_masks)": Program(
            or_masks(prefix_lm, causal), None, in_prefix | is_causal
        ),
        "document (flex and_masks)": Program(
            and_masks(document, causal), None, same_doc & is_causal
        ),
        "dilated-sliding-window": Program(dilated_sliding_window, None, dilated),
        "alibi, causal": Program(
            causal, alibi, is_causal,
            bias=lambda _: torch.from_numpy(slopes_np[h] * (j - i) + 0.0 * b),
        ),
        "relative-position table": Program(
            None, relative_position, full,
            bias=lambda t: t[torch.from_numpy(h), torch.from_numpy(i - j + n - 1)],
            table=table,
        ),
        "tanh soft-capping, document": Program(document, soft_cap, same_doc, softcap=CAP),
        "exactattn and_masks: window ∧ document": Program(
            and_masks(sliding_window, document), None, in_window & same_doc,
            exact_mask=masks.and_masks(sliding_window, document),
        ),
        "exactattn or_masks: prefix ∨ window": Program(
            or_masks(prefix_lm, sliding_window), None, in_prefix | in_window,
            exact_mask=masks.or_masks(prefix_lm, sliding_window),
        ),
    }  # fmt: skip
