"""Check profiles: how many cases, how large, within what budget (``--profile``).

Budgets are for 2 idle cores and a CPU target (torch's SDPA), gradients on:

=========  ========  ======  =============  ==========================================
profile    examples  max n   B·H·n_q·n_k    budget and aim
=========  ========  ======  =============  ==========================================
smoke      30        64      2^12           ≤ 20 s: CI; small head dims (≤ 8)
default    200       2048    2^17           ≤ 2 min; ≥ 15% of cases n_k > 3b, ≥ 10%
                                            n_k mod b ≠ 0 (b the claimed block size)
deep       200       4096    2^24           ≤ 20 min; ≥ 30% cross ≥ 2 block boundaries;
                                            dQ, dK, dV judged up to n_q = n_k = 4096
long       12        131072  B·H = 1        ≤ 1 h a case, an ETA printed; the forward on
                                            strips of rows (:mod:`.long`)
=========  ========  ======  =============  ==========================================

``--max-n`` overrides a profile's size cap, ``--examples`` its count. The case distribution
itself is :mod:`exactattn.cases.paths`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    examples: int
    max_n: int
    budget: int  # the largest B·H·n_q·n_k of a case
    max_d: int | None = None  # None: the field's head dims
    seconds: float = 0.0  # the budget on 2 idle cores (documented, tested slow)


PROFILES = {
    p.name: p
    for p in (
        Profile("smoke", 30, 64, 1 << 12, max_d=8, seconds=20),
        Profile("default", 200, 2048, 1 << 17, seconds=120),
        Profile("deep", 200, 4096, 1 << 24, seconds=1200),  # 4096² square, gradients too
        Profile("long", 12, 131072, 131072**2, max_d=64, seconds=3600),  # seconds: a case
    )
}
