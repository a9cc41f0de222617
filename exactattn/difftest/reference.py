"""The reference a backend is judged against: naive attention in a certified or high precision.

With python-flint the reference is :func:`exactattn.naive_attention` (and its exact VJP)
over arb balls: the ball encloses the exact answer and its radius is added to the
tolerance. Without flint it is the same naive computation over mpmath at ``REF_PREC`` bits,
whose own error (``≲ (n + d)·2^-REF_PREC`` relative) is far below any configuration tested.
The naive path materialises ``P`` and forms ``δ`` as ``rowsum(P∘dP)``, so it shares no
step with the tiled pass being tested. Float64 magnitudes of ``s, m, p, ρ`` for the
tolerance come from the same formulas evaluated in NumPy.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import mpmath
import numpy as np

from .. import api
from ..dropout import make_dropout
from .cases import Case

REF_PREC = 160


def reference_context() -> tuple[str, Any]:
    """``("flint", ctx)`` when the ball backend is importable, else ``("mpmath", ctx)``."""
    try:
        module = importlib.import_module("exactattn.backends.flint_backend")
        return "flint", module.FlintContext(REF_PREC)
    except Exception:
        from ..backends import MpmathContext

        return "mpmath", MpmathContext(REF_PREC)


@dataclass
class Values:
    """The reference for one case: high-precision ``mid``/``rad`` and float64 magnitudes."""

    mid: dict[str, np.ndarray]  # mpf object arrays: y, dq, dk, dv
    rad: dict[str, np.ndarray]  # float64 radii (0 for mpmath)
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


def _split(ctx_kind: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mpf midpoints, float64 radii) of a reference output."""
    if ctx_kind == "flint":
        mid = np.frompyfunc(arb_mid, 1, 1)(x)
        rad = np.frompyfunc(lambda e: float(e.rad()), 1, 1)(x).astype(np.float64)
        return mid.astype(object), rad * (1 + 2.0**-40) + 2.0**-190 * np.abs(mid.astype(float))
    return np.asarray(x, dtype=object), np.zeros(x.shape)


def arb_mid(e: Any) -> mpmath.mpf:
    """The exact midpoint of an arb ball as an mpf."""
    man, exp = e.mid().man_exp()
    with mpmath.workprec(max(int(man).bit_length(), 2)):  # mpf() rounds to the working prec
        return mpmath.mpf((int(man), int(exp)))


def magnitudes(case: Case, q, k, v) -> tuple[np.ndarray, ...]:
    """Float64 ``s`` (−∞ off ``A_i``), ``m``, ``p``, ``ρ`` and the allowed set."""
    allowed = case.allowed()
    s = case.c() * (q @ np.swapaxes(k, -1, -2))
    s = np.where(allowed, s, -np.inf)
    with np.errstate(invalid="ignore"):
        m = s.max(axis=-1) if s.shape[-1] else np.full(s.shape[:-1], -np.inf)
        shift = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(s - shift[..., None])
    l = e.sum(axis=-1)
    p = e / np.where(l > 0, l, 1.0)[..., None]
    rho = np.ones_like(p)
    dropout = make_dropout(case.dropout_p, case.seed)
    if dropout is not None:
        n_q, n_k = p.shape[-2:]
        batch = p.shape[:-2]
        index = np.arange(int(np.prod(batch))).reshape((*batch, 1, 1))
        keep = dropout.keep(index, np.arange(n_q)[:, None], np.arange(n_k)[None, :])
        rho = np.where(keep, 1 / (1 - case.dropout_p), 0.0) * np.ones_like(p)
    return s, m, p, rho, allowed


def compute(case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray) -> Values:
    """The reference for ``case`` on the inputs exactly as given (already rounded)."""
    kind, ctx = reference_context()
    keywords = case.keywords()
    keywords.pop("block_size")
    mask = case.mask_object()
    y, stats = api.naive_attention(q, k, v, mask=mask, backend=ctx, return_stats=True, **keywords)
    grads = api.naive_attention_backward(q, k, v, y, stats, g, mask=mask, backend=ctx, **keywords)
    mid, rad = {}, {}
    for name, x in zip(("y", "dq", "dk", "dv"), (y, *grads)):
        mid[name], rad[name] = _split(kind, np.asarray(x, dtype=object))
    as_float = {name: mid[name].astype(np.float64) for name in mid}
    s, m, p, rho, allowed = magnitudes(case, q, k, v)
    return Values(mid, rad, **as_float, v=v, g=g, s=s, m=m, p=p, rho=rho, allowed=allowed)
