"""FlexAttention programs for the `program` proof family's tests (loaded by file path)."""


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def document(b, h, q_idx, kv_idx):
    """Two documents per sequence, split after position b (the batch element)."""
    return (q_idx <= b) == (kv_idx <= b)


def alibi(score, b, h, q_idx, kv_idx):
    """A linear bias whose slope depends on the head."""
    return score - (h + 1) * (q_idx - kv_idx) / 4
