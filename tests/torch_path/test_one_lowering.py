"""A call lowers its mask once: the kernels' choice, the key-block size ``b`` and the split
into pieces all read the one :class:`~exactattn.core.masks.Band`, and the operator reads its band
off its own arguments (they are the lowered mask) instead of lowering a rebuilt mask again.

Counted with a spy on every mask class's ``lower`` (:func:`.helpers.count_lowerings`: a
lowering inside another, such as an AND lowering its parts, is part of the outer one), over
a whole forward and backward, at sizes where the call runs as several pieces (which read the
band) and several key blocks, with the caller's ``b`` and with the chosen one (which reads
the band too). On the code before the one preparation these calls lowered 2 to 5 times.
"""

from __future__ import annotations

import pytest

from tests.optional import requires

torch = requires("torch")

import exactattn.torch as et
from exactattn.core import masks
from exactattn.torch import passes

from .helpers import count_lowerings, qkv, randn


@pytest.fixture
def lowerings(monkeypatch):
    """Lowerings counted from here on, at sizes where every splittable call runs as pieces."""
    monkeypatch.setattr(passes, "PIECE_WORK", 0)
    monkeypatch.setattr(passes, "PIECE_TILE", 64)
    return count_lowerings(monkeypatch)


def _forward_and_backward(fn, q_shape=(2, 3, 12, 4), k_shape=(2, 3, 12, 4)):
    q, k, v = qkv(q_shape, k_shape, seed=2, grad=True)
    y = fn(q, k, v)
    y.backward(randn(*y.shape, seed=3))
    return q.grad


CALLS = {  # name -> (the call, how many masks it is given that need lowering)
    "window through the operator": (
        lambda q, k, v: et.attention(q, k, v, mask=masks.sliding_window(3, 1), block_size=4),
        1,
    ),
    "causal and key padding through the operator": (
        lambda q, k, v: et.attention(
            q, k, v, mask=masks.key_padding(torch.tensor([12, 7])), is_causal=True, block_size=4
        ),
        1,
    ),
    "causal with the chosen b, through the operator": (
        lambda q, k, v: et.attention(q, k, v, is_causal=True, alignment="bottom-right"),
        1,
    ),
    "predicate through the Function": (
        lambda q, k, v: et.attention(
            q, k, v, mask=masks.predicate(lambda i, j: (i + j) % 3 != 0), block_size=4
        ),
        1,
    ),
    "bias function and causal through the Function": (
        lambda q, k, v: et.attention(
            q, k, v, bias=lambda b, h, i, j: (i - j) * 0.125, is_causal=True, block_size=4
        ),
        1,
    ),
    "flex_attention with a window": (
        lambda q, k, v: et.flex_attention(q, k, v, block_mask=masks.sliding_window(2, 2)),
        1,
    ),
    "SDPA causal (the band is spelled, no mask to lower)": (
        lambda q, k, v: et.scaled_dot_product_attention(q, k, v, is_causal=True),
        0,
    ),
    "no mask": (lambda q, k, v: et.attention(q, k, v, block_size=4), 0),
}


@pytest.mark.parametrize("name", CALLS)
def test_a_call_lowers_its_mask_once(name, lowerings):
    fn, masks_given = CALLS[name]
    _forward_and_backward(fn)
    assert lowerings[0] == masks_given, f"{name}: {lowerings[0]} lowerings in one call"


def test_the_spy_counts_every_lowering(lowerings):
    """The spy's own check: two calls of ``lower`` are two, an AND's parts are not extra."""
    geometry = masks.Geometry(4, 4, (1, 2))
    both = masks.causal() & masks.sliding_window(2, 2)
    assert both.lower(geometry) == masks.Band("top-left", 2, 0)
    assert lowerings[0] == 1
    masks.causal().lower(geometry)
    assert lowerings[0] == 2
