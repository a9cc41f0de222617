"""The sweep's view of the certified reference (:func:`exactattn.certified.certified_attention`).

One problem's inputs ``{"q", "k", "v", "g"}`` and its allowed set go in; the midpoints of
``Y`` (and ``dQ, dK, dV``) come out as double-double pairs ``(hi, lo)``, so even float64
runs are measured against a reference far more accurate than themselves, with the
precision the reference used and its largest radius (a certificate: the exact values are
within ``rad`` of ``hi + lo``, elementwise; ``radius`` is the largest).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..certified import certified_attention

OUTPUTS = ("y", "dq", "dk", "dv")


@dataclass
class Reference:
    """Midpoints ``hi + lo`` and radii ``rad`` per output, the largest radius, the precision
    and the time."""

    hi: dict[str, np.ndarray]
    lo: dict[str, np.ndarray]
    rad: dict[str, np.ndarray]
    radius: float
    seconds: float
    prec: int


def certified_reference(
    inputs: dict[str, np.ndarray],
    *,
    scale: float,
    allowed: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    softcap: float | None = None,
    prec: int | None = None,
    grads: bool = True,
    workers: int = 1,
) -> Reference:
    """Enclosures of ``Y`` (and of ``dQ, dK, dV`` at upstream ``G`` when ``grads``).

    ``allowed``: the (n_q, n_k) allowed set, written from the mask's definition by the
    caller; ``bias`` (``−∞`` excludes a pair) and ``softcap``: the score modification, also
    from its definition; ``prec=None`` lets :mod:`exactattn.certified` choose the precision
    (the lowest of its ladder that certifies every output to 2^-70 of its summands);
    ``workers`` processes share the blocks of rows.
    """
    enc = certified_attention(
        inputs["q"],
        inputs["k"],
        inputs["v"],
        inputs["g"] if grads else None,
        scale=scale,
        allowed=allowed,
        bias=bias,
        softcap=softcap,
        prec=prec,
        workers=workers,
    )
    names = [name for name in OUTPUTS if name in enc.balls]
    return Reference(
        hi={name: enc[name].hi for name in names},
        lo={name: enc[name].lo for name in names},
        rad={name: enc[name].rad for name in names},
        radius=max(enc[name].max_radius for name in names),
        seconds=enc.seconds,
        prec=enc.prec,
    )
