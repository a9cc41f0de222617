"""Shared helpers for the core tests: random inputs and every mask kind."""

from __future__ import annotations

import numpy as np

from exactattn.core import masks
from exactattn.core.masks import Geometry


def inputs(rng, batch, n_q, n_k, d, v, dtype=np.float64):
    """Standard-normal q (*batch, n_q, d), k (*batch, n_k, d), v (*batch, n_k, v)."""
    return (
        rng.standard_normal((*batch, n_q, d)).astype(dtype),
        rng.standard_normal((*batch, n_k, d)).astype(dtype),
        rng.standard_normal((*batch, n_k, v)).astype(dtype),
    )


def dense_of(mask, batch, n_q, n_k):
    """The mask evaluated on the whole (n_q, n_k) grid (tests only), broadcast to batch."""
    if mask is None:
        return np.ones((*batch, n_q, n_k), dtype=bool)
    mask = masks.as_mask(mask)
    return masks.create_mask(mask, Geometry(n_q, n_k, tuple(batch)))


def every_mask(rng, batch, n_q, n_k):
    """One instance of each mask kind, keeping those that leave every row a nonempty A_i."""
    dense = rng.random((*batch, n_q, n_k)) < 0.5
    dense[..., 0] = True
    lengths = rng.integers(1, n_k + 1, size=batch[:1])
    candidates = {
        "none": None,
        "causal": masks.causal(),
        "causal-bottom-right": masks.causal("bottom-right"),
        "window": masks.sliding_window(left=2, right=1),
        "window-bottom-right": masks.sliding_window(left=1, right=0, alignment="bottom-right"),
        "padding": masks.key_padding(lengths),
        "dense": dense,
        "predicate": masks.predicate(lambda i, j: (i + j) % 3 != 1),
        "and": masks.and_masks(masks.key_padding(lengths), masks.causal()),
        "or": masks.or_masks(masks.sliding_window(0, 0), masks.predicate(lambda i, j: j == 0)),
    }
    return {
        name: mask
        for name, mask in candidates.items()
        if dense_of(mask, batch, n_q, n_k).any(axis=-1).all()
    }
