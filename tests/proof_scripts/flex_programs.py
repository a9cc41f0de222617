"""FlexAttention's example mask_mods (its documentation and attention-gym), written as
FlexAttention users write them, for the `program` family's all-n proofs (loaded by path)."""

import torch

WINDOW = 3
PREFIX = 2
DOCUMENT = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2])  # document id per position (nondecreasing)
EMPTY, PARTIAL, FULL = 0, 1, 2


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= WINDOW)


def prefix_lm(b, h, q_idx, kv_idx):
    return (kv_idx < PREFIX) | (q_idx >= kv_idx)


def document(b, h, q_idx, kv_idx):
    return (DOCUMENT[q_idx] == DOCUMENT[kv_idx]) & (q_idx >= kv_idx)


def dilated(b, h, q_idx, kv_idx):
    return ((q_idx - kv_idx) % 2 == 0) & (q_idx >= kv_idx)


def causal_blocks(b, h, q_block, kv_block):
    """What create_block_mask builds for a causal mask with square blocks: blocks below the
    diagonal FULL, on it PARTIAL, above EMPTY."""
    return torch.where(kv_block < q_block, FULL, torch.where(kv_block == q_block, PARTIAL, EMPTY))


def causal_blocks_diagonal_full(b, h, q_block, kv_block):
    """A wrong hand-built structure: the diagonal (partial) blocks marked FULL."""
    return torch.where(kv_block <= q_block, FULL, EMPTY)


def near_in_floats(b, h, q_idx, kv_idx):
    """Runs on index tensors, but goes through floats: not traced for all n."""
    return (q_idx - kv_idx).float().abs() <= 1.5
