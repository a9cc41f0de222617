"""The specification side of every check: masks and dropout written from their definitions.

Nothing here calls :mod:`exactattn.masks` or :mod:`exactattn.dropout`: a reference built from
these functions cannot inherit a bug of the code it judges (issue 11 §2).

**Mask specs.** A mask is data, a JSON-able dict with a ``kind``:

* ``{"kind": "none"}``: every key allowed;
* ``{"kind": "causal", "align": A}``: ``j ≤ i + o``;
* ``{"kind": "window", "left": L, "right": R, "align": A}``: ``i + o − L ≤ j ≤ i + o + R``
  (``None``: that side unbounded);
* ``{"kind": "padding", "lengths": ℓ}``: ``j < ℓ[b]``, one length per element of the first
  batch axis (a scalar for no batch axis);
* ``{"kind": "dense", "allowed": M}``: the boolean table ``M`` broadcast to
  ``(*batch, n_q, n_k)``;
* ``{"kind": "document", "q_doc": D_q, "k_doc": D_k}``: ``D_q[b, i] = D_k[b, j]`` (document
  ids of shape ``(B, n)`` per element of the first batch axis, or ``(n,)``: a
  batch-dependent kind);
* ``{"kind": "and" | "or", "parts": [...]}``: conjunction / disjunction of the parts.

The alignment offset ``o`` is ``0`` for ``"top-left"`` (torch SDPA's ``is_causal``) and
``n_k − n_q`` for ``"bottom-right"`` (flash-attn's), so that there the last query sees the
last key.

**Dropout.** Keep-bits ``r(seed, β, i, j)`` (``β`` the flat batch·head index) are the
documented counter-based hash: ``h`` = Wellons' lowbias32,
``key = h(h(h(seed mod 2^32) ^ ⌊seed / 2^32⌋) ^ β)``, ``r = [⌊h(h(key ^ i) ^ h(j)) / 2^8⌋ ≥
round(p·2^24)]``, evaluated here directly in unsigned 64-bit integers (the library splits
each product to stay inside int64). The factors are ``ρ = r / (1 − p)`` by formula.
"""

from __future__ import annotations

import math
from functools import reduce
from typing import Any

import numpy as np

ALIGNMENTS = ("top-left", "bottom-right")
LEAF_KINDS = ("none", "causal", "window", "padding", "dense", "document")
COMBINATORS = ("and", "or")
KINDS = LEAF_KINDS + COMBINATORS


# --- masks -------------------------------------------------------------------------------
def offset(spec: dict[str, Any], n_q: int, n_k: int) -> int:
    """The alignment offset ``o`` of a causal or window spec."""
    align = spec.get("align", "top-left")
    if align not in ALIGNMENTS:
        raise ValueError(f"align must be one of {ALIGNMENTS}; got {align!r}")
    return 0 if align == "top-left" else n_k - n_q


def allowed(spec: dict[str, Any], batch: tuple[int, ...], n_q: int, n_k: int) -> np.ndarray:
    """The allowed set ``A`` as a dense boolean array of shape ``(*batch, n_q, n_k)``."""
    return np.broadcast_to(_allowed(spec, batch, n_q, n_k), (*batch, n_q, n_k))


def _allowed(spec: dict[str, Any], batch: tuple[int, ...], n_q: int, n_k: int) -> np.ndarray:
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    kind = spec["kind"]
    if kind == "none":
        return np.ones((n_q, n_k), dtype=bool)
    if kind == "causal":
        return j <= i + offset(spec, n_q, n_k)
    if kind == "window":
        o = offset(spec, n_q, n_k)
        left, right = spec.get("left"), spec.get("right")
        lower = np.ones((n_q, n_k), dtype=bool) if left is None else j >= i + o - left
        return lower if right is None else lower & (j <= i + o + right)
    if kind == "padding":
        lengths = np.asarray(spec["lengths"], dtype=np.int64)
        trailing = (1,) * (len(batch) - lengths.ndim)
        return j < lengths.reshape((*lengths.shape, *trailing, 1, 1))
    if kind == "dense":
        return np.asarray(spec["allowed"], dtype=bool)
    if kind == "document":
        q_doc, k_doc = np.asarray(spec["q_doc"]), np.asarray(spec["k_doc"])
        trailing = (1,) * (len(batch) - q_doc.ndim + 1)
        q_doc = q_doc.reshape((*q_doc.shape[:-1], *trailing, n_q, 1))
        k_doc = k_doc.reshape((*k_doc.shape[:-1], *trailing, 1, n_k))
        return q_doc == k_doc
    if kind in COMBINATORS:
        parts = [allowed(part, batch, n_q, n_k) for part in spec["parts"]]
        return reduce(np.logical_and if kind == "and" else np.logical_or, parts)
    raise ValueError(f"unknown mask kind {kind!r}; use one of {KINDS}")


def leaves(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The leaf specs of a (possibly composed) mask, left to right."""
    if spec["kind"] in COMBINATORS:
        return [leaf for part in spec["parts"] for leaf in leaves(part)]
    return [spec]


def describe(spec: dict[str, Any]) -> str:
    """A one-line human description, e.g. ``and(causal[bottom-right], window(2, 0))``."""
    kind = spec["kind"]
    if kind in COMBINATORS:
        return f"{kind}({', '.join(describe(part) for part in spec['parts'])})"
    if kind == "causal":
        return f"causal[{spec.get('align', 'top-left')}]"
    if kind == "window":
        return f"window({spec.get('left')}, {spec.get('right')})[{spec.get('align', 'top-left')}]"
    if kind == "padding":
        return f"padding(lengths={np.asarray(spec['lengths']).tolist()})"
    if kind == "dense":
        table = np.asarray(spec["allowed"], dtype=bool)
        return f"dense({table.shape}, {int(table.sum())} allowed)"
    if kind == "document":
        return f"document(q_doc={np.asarray(spec['q_doc']).tolist()}, k_doc=…)"
    return kind


# --- dropout -------------------------------------------------------------------------------
M32 = np.uint64(0xFFFFFFFF)
KEEP_BITS = 24


def _h(x: np.ndarray) -> np.ndarray:
    """Wellons' lowbias32 on uint64 values below 2^32 (products stay below 2^64)."""
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & M32
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & M32
    return x ^ (x >> np.uint64(16))


def keep(p: float, seed: int, batch: tuple[int, ...], n_q: int, n_k: int) -> np.ndarray:
    """Keep-bits ``r`` as booleans of shape ``(*batch, n_q, n_k)``."""
    beta = np.arange(math.prod(batch), dtype=np.uint64).reshape((*batch, 1, 1))
    i = np.arange(n_q, dtype=np.uint64)[:, None]
    j = np.arange(n_k, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        key = _h(_h(np.uint64(seed & 0xFFFFFFFF)) ^ np.uint64(seed >> 32))
        key = _h(key ^ beta)
        bits = _h(_h(key ^ i) ^ _h(j)) >> np.uint64(32 - KEEP_BITS)
    return bits >= round(p * (1 << KEEP_BITS))


def rho(p: float, seed: int | None, batch: tuple[int, ...], n_q: int, n_k: int) -> np.ndarray:
    """Dropout factors ``ρ = r / (1 − p)`` (float64; all ones for ``p = 0``)."""
    if not p:
        return np.ones((*batch, n_q, n_k))
    if seed is None:
        raise ValueError("dropout_p > 0 needs a seed: the keep-bits are a function of it")
    return np.where(keep(p, seed, batch, n_q, n_k), 1.0 / (1.0 - p), 0.0)
