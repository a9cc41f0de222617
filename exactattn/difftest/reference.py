"""The reference a backend is judged against: certified naive attention (exactattn.certified).

For a case, the reference gets the allowed set as a dense boolean array and the dropout
factors as the keep-bits ``r_ij`` of the counter-based hash with ``ρ = r/(1 − p)``
(``1/(1 − p)`` enclosed, not rounded), so it shares no step with the tiled code it judges.
It runs at ``REF_PREC`` bits; its midpoints come back as double-double ``hi + lo`` (exact
mpf here) and its radii cover both the arb radius and ``mid − (hi + lo)`` (≤ 2^-104
relative), and are added to every tolerance. Float64 magnitudes of ``s, m, p, ρ`` for the
tolerance come from the same formulas evaluated in NumPy.

The reference needs python-flint: a verdict is only as good as its reference, so there is
no uncertified fallback (python-flint ships wheels wherever NumPy does;
``pip install 'exactattn[flint]'``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mpmath
import numpy as np

from ..cases import Case
from ..dropout import make_dropout

REF_PREC = 160
OUTPUTS = ("y", "dq", "dk", "dv")


@dataclass
class Values:
    """The reference for one case: high-precision ``mid``/``rad`` and float64 magnitudes."""

    mid: dict[str, np.ndarray]  # mpf object arrays: y, dq, dk, dv
    rad: dict[str, np.ndarray]  # float64 radii
    y: np.ndarray
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    v: np.ndarray
    g: np.ndarray
    s: np.ndarray
    m: np.ndarray
    p: np.ndarray
    rho: np.ndarray
    allowed: np.ndarray


def arb_mid(e: Any) -> mpmath.mpf:
    """The exact midpoint of an arb ball as an mpf."""
    man, exp = e.mid().man_exp()
    with mpmath.workprec(max(int(man).bit_length(), 2)):  # mpf() rounds to the working prec
        return mpmath.mpf((int(man), int(exp)))


def keep_bits(case: Case) -> np.ndarray | None:
    """The realised keep-bits ``r_ij`` (*batch, n_q, n_k), or ``None`` without dropout."""
    dropout = make_dropout(case.dropout_p, case.seed)
    if dropout is None:
        return None
    n_q, n_k = case.q.shape[-2], case.k.shape[-2]
    batch = case.batch
    index = np.arange(int(np.prod(batch))).reshape((*batch, 1, 1))
    keep = dropout.keep(index, np.arange(n_q)[:, None], np.arange(n_k)[None, :])
    return np.broadcast_to(keep, (*batch, n_q, n_k))


def magnitudes(case: Case, q, k, v, allowed, keep) -> tuple[np.ndarray, ...]:
    """Float64 ``s`` (−∞ off ``A_i``), ``m``, ``p`` and ``ρ``."""
    s = case.c() * (q @ np.swapaxes(k, -1, -2))
    s = np.where(allowed, s, -np.inf)
    with np.errstate(invalid="ignore"):
        m = s.max(axis=-1) if s.shape[-1] else np.full(s.shape[:-1], -np.inf)
        shift = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(s - shift[..., None])
    l = e.sum(axis=-1)
    p = e / np.where(l > 0, l, 1.0)[..., None]
    rho = np.ones_like(p) if keep is None else np.where(keep, 1 / (1 - case.dropout_p), 0.0)
    return s, m, p, rho


def require() -> Any:
    """:func:`exactattn.certified.certified_attention`, or an ImportError that says what to
    install (a command can call this before it starts drawing cases)."""
    try:
        from ..certified import certified_attention
    except ImportError as error:
        raise ImportError(
            "the difftest reference is certified (arb balls) and needs python-flint: "
            "pip install 'exactattn[flint]'"
        ) from error
    return certified_attention


def compute(case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray) -> Values:
    """The reference for ``case`` on the inputs exactly as given (already rounded)."""
    allowed, keep = case.allowed(), keep_bits(case)
    enc = require()(
        q,
        k,
        v,
        g,
        scale=case.scale,
        allowed=allowed,
        keep=keep,
        dropout_p=case.dropout_p,
        prec=REF_PREC,
    )
    mid = {name: enc[name].mpf() for name in OUTPUTS}
    rad = {name: enc[name].rad for name in OUTPUTS}
    as_float = {name: enc[name].hi + enc[name].lo for name in OUTPUTS}
    s, m, p, rho = magnitudes(case, q, k, v, allowed, keep)
    return Values(mid, rad, **as_float, v=v, g=g, s=s, m=m, p=p, rho=rho, allowed=allowed)
