"""Family "reach" (not in the default run) — the forward at n = 16.

Theorem. The library's tiled forward equals softmax attention (as in family 2) for
self-attention with fully symbolic X (d = v = 2) and a symbolic scale c at n = 16, and for
a causal mask on free scores at n_q = n_k = 16, for every block size b = 1..17. Run it with
``exactattn prove reach`` (about 30 s each on this machine's 2 cores).
"""

from __future__ import annotations

from ..engine.ledger import Obligation
from ..engine.mask_grid import CAUSAL
from . import forward

REACH_N = 16


def obligations(max_n: int = 4) -> list[Obligation]:
    return [forward.self_attention(REACH_N), forward.structured(CAUSAL, REACH_N)]
