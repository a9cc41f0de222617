"""How long each certified reference takes at one size (``exactattn sweep --time-reference``).

Arb balls (:mod:`exactattn.oracle.certified`) where affordable and the float64 reference
(:mod:`exactattn.oracle.float64`), on the precision sweep's normal inputs
(:func:`exactattn.cases.inputs.make_inputs`), with wall and CPU seconds and the largest
radius: the numbers that decide which reference serves a long case.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

from ..cases.inputs import make_inputs
from ..oracle.certified import certified_attention, cpu_seconds
from ..oracle.float64 import fast_attention

ARB_AFFORDABLE_N = 4096  # arb forward + backward at n = 4096: ~45 s on 2 cores; beyond, hours
BACKWARD_N = 8192  # timed forward + backward up to this n, the forward alone beyond


def time_reference(
    n: int, d: int, *, seed: int = 0, workers: int | None = None, backward: bool | None = None
) -> list[dict[str, Any]]:
    """Time each reference a sweep or check would use at ``n_q = n_k = n``, head dim ``d``
    (the precision sweep's normal inputs): arb (``workers`` processes) where affordable
    (``n ≤ ARB_AFFORDABLE_N``) and the float64 one (:func:`time_fast_reference`).

    ``backward``: time forward + backward (``None``: for ``n ≤ BACKWARD_N``). One dict per
    reference: ``name``, ``n``, ``d``, ``pass`` (``fwd`` or ``fwd+bwd``), wall ``seconds``
    (radius included), ``cpu_seconds`` (all processes) and the largest ``radius``.
    """
    backward = n <= BACKWARD_N if backward is None else backward
    out = []
    if n <= ARB_AFFORDABLE_N:
        x = make_inputs("normal", n, d, seed)
        workers = workers or min(2, multiprocessing.cpu_count())
        cpu = cpu_seconds()
        g = x["g"] if backward else None
        enc = certified_attention(x["q"], x["k"], x["v"], g, workers=workers)
        out.append(
            {
                "name": "arb",
                "n": n,
                "d": d,
                "pass": "fwd+bwd" if backward else "fwd",
                "seconds": enc.seconds,
                "cpu_seconds": cpu_seconds() - cpu,
                "radius": enc.max_radius,
            }
        )
    out.append(time_fast_reference(n, d, backward=backward, seed=seed))
    return out


def time_fast_reference(n: int, d: int, *, backward: bool, seed: int = 0) -> dict[str, Any]:
    """Time :func:`fast_attention` at ``n_q = n_k = n``, head dim ``d`` on the precision
    sweep's normal inputs: wall and CPU seconds and the largest radius."""
    x = make_inputs("normal", n, d, seed)
    cpu = time.process_time()
    enc = fast_attention(x["q"], x["k"], x["v"], x["g"] if backward else None)
    return {
        "name": "float64",
        "n": n,
        "d": d,
        "pass": "fwd+bwd" if backward else "fwd",
        "seconds": enc.seconds,
        "cpu_seconds": time.process_time() - cpu,
        "radius": enc.max_radius,
    }
