"""FlexAttention programs for the tests of ``exactattn check --mask-mod/--score-mod``.

Written as a Flex user writes them (torch tensors indexed by the index tensors); the
non-additive one uses :mod:`exactattn.core.ops` so that it also runs over arb balls.
"""

import torch

from exactattn.core import ops

DOC = torch.arange(64) // 5  # documents of five positions each
SLOPES = torch.tensor([2.0 ** -(h + 1) for h in range(8)])


def document_mask(b, h, q_idx, kv_idx):
    """Causal attention inside each document."""
    return (DOC[q_idx] == DOC[kv_idx]) & (kv_idx <= q_idx)


def alibi(score, b, h, q_idx, kv_idx):
    """ALiBi: ``s − slope_h·(i − j)``."""
    return score - SLOPES[h] * (q_idx - kv_idx)


def capped(score, b, h, q_idx, kv_idx):
    """Soft-capping with exactattn.core.ops: runs on every backend and over arb balls."""
    return 3 * ops.tanh(score / 3)


def torch_only(score, b, h, q_idx, kv_idx):
    """Soft-capping with torch.tanh: runs on torch tensors only."""
    return torch.tanh(score)


not_callable = 3
