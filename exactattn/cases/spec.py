"""The specification side of every check: masks and dropout written from their definitions.

Nothing here calls :mod:`exactattn.core.masks` or :mod:`exactattn.core.dropout`: a reference built
from these functions cannot inherit a bug of the code it judges (issue 11 §2).

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
* ``{"kind": "mask_mod", "fn": "module:function"}``: a user's FlexAttention
  ``mask_mod(b, h, q_idx, kv_idx)`` evaluated once on the whole index grid (int64 torch
  tensors, :func:`exactattn.core.ops.grid_indices`; batch dims lifted to ``(B, H)`` as
  :func:`lift` says): the user's program is its own definition;
* ``{"kind": "and" | "or", "parts": [...]}``: conjunction / disjunction of the parts.

The alignment offset ``o`` is ``0`` for ``"top-left"`` (torch SDPA's ``is_causal``) and
``n_k − n_q`` for ``"bottom-right"`` (flash-attn's), so that there the last query sees the
last key.

**Score modification specs.** An additive bias ``B`` (float64, broadcastable to
``(*batch, n_q, n_k)``; ``−∞`` excludes a pair) is data too, ``{"kind": K, ...}``:

* ``"none"``: no bias;
* ``"alibi"`` with ``slopes`` (one per head, the last of two batch axes; one slope
  otherwise): ``B_hij = −slope_h·|i + o − j|`` (``form: "abs"``, flash-attn's) or
  ``−slope_h·(i + o − j)`` (``form: "causal"``, the original ALiBi under a causal mask), ``o``
  the alignment offset as for masks;
* ``"t5"`` with a ``table`` ``(H, buckets)`` and ``max_distance``: ``B_hij =
  table[h, bucket(j − i)]``, T5's bidirectional relative-position bucket (:func:`t5_bucket`);
* ``"dense"`` with ``values``: the table itself.

Soft-capping ``cap·tanh(s/cap)`` is a number beside the spec; the order is the core's,
``s = c·q·k`` → soft-cap → ``+ B`` → mask.

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
LEAF_KINDS = ("none", "causal", "window", "padding", "dense", "document", "mask_mod")
COMBINATORS = ("and", "or")
KINDS = LEAF_KINDS + COMBINATORS


# --- masks -------------------------------------------------------------------------------
def offset(spec: dict[str, Any], n_q: int, n_k: int) -> int:
    """The alignment offset ``o`` of a causal or window spec."""
    align = spec.get("align", "top-left")
    if align not in ALIGNMENTS:
        raise ValueError(f"align must be one of {ALIGNMENTS}; got {align!r}")
    return 0 if align == "top-left" else n_k - n_q


Rows = tuple[int, int]  # a strip of query rows [start, stop)


def allowed(
    spec: dict[str, Any], batch: tuple[int, ...], n_q: int, n_k: int, rows: Rows | None = None
) -> np.ndarray:
    """The allowed set ``A`` as a dense boolean array of shape ``(*batch, n_q, n_k)``; with
    ``rows = (start, stop)`` only that strip of query rows, ``(*batch, stop − start, n_k)``
    (a long case is read one strip at a time, never as an ``n_q × n_k`` table)."""
    start, stop = (0, n_q) if rows is None else rows
    return np.broadcast_to(
        _allowed(spec, batch, n_q, n_k, start, stop), (*batch, stop - start, n_k)
    )


def _strip(table: Any, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of a table whose query axis (−2) is full or broadcast (1)."""
    table = np.asarray(table)
    return table if table.shape[-2] == 1 else table[..., start:stop, :]


def _allowed(
    spec: dict[str, Any], batch: tuple[int, ...], n_q: int, n_k: int, start: int, stop: int
) -> np.ndarray:
    i = np.arange(start, stop)[:, None]
    j = np.arange(n_k)[None, :]
    r = stop - start
    kind = spec["kind"]
    if kind == "none":
        return np.ones((r, n_k), dtype=bool)
    if kind == "causal":
        return j <= i + offset(spec, n_q, n_k)
    if kind == "window":
        o = offset(spec, n_q, n_k)
        left, right = spec.get("left"), spec.get("right")
        lower = np.ones((r, n_k), dtype=bool) if left is None else j >= i + o - left
        return lower if right is None else lower & (j <= i + o + right)
    if kind == "padding":
        lengths = np.asarray(spec["lengths"], dtype=np.int64)
        trailing = (1,) * (len(batch) - lengths.ndim)
        return j < lengths.reshape((*lengths.shape, *trailing, 1, 1))
    if kind == "dense":
        return _strip(np.asarray(spec["allowed"], dtype=bool), start, stop)
    if kind == "document":
        q_doc, k_doc = np.asarray(spec["q_doc"])[..., start:stop], np.asarray(spec["k_doc"])
        trailing = (1,) * (len(batch) - q_doc.ndim + 1)
        q_doc = q_doc.reshape((*q_doc.shape[:-1], *trailing, r, 1))
        k_doc = k_doc.reshape((*k_doc.shape[:-1], *trailing, 1, n_k))
        return q_doc == k_doc
    if kind == "mask_mod":
        return mask_mod_table(spec["fn"], batch, n_q, n_k)[..., start:stop, :]
    if kind in COMBINATORS:
        parts = [allowed(part, batch, n_q, n_k, (start, stop)) for part in spec["parts"]]
        return reduce(np.logical_and if kind == "and" else np.logical_or, parts)
    raise ValueError(f"unknown mask kind {kind!r}; use one of {KINDS}")


def lift(batch: tuple[int, ...]) -> tuple[int, int]:
    """The ``(B, H)`` FlexAttention's ``b, h`` index: ``()`` → ``(1, 1)``, ``(B,)`` →
    ``(B, 1)``, ``(B, H)`` itself."""
    if len(batch) > 2:
        raise ValueError(f"a FlexAttention program takes at most 2 batch dims (B, H); got {batch}")
    return (*batch, 1, 1)[:2]  # type: ignore[return-value]


def mask_mod_table(reference: str, batch: tuple[int, ...], n_q: int, n_k: int) -> np.ndarray:
    """A user's ``mask_mod`` (``module:function``) on the whole grid, shaped
    ``(*batch, n_q, n_k)``; an error names the mod when it does not give booleans."""
    from ..core.ops import grid_indices
    from ..infra import loading

    fn = loading.load_callable(reference, "--mask-mod")
    lifted = lift(batch)
    out = fn(*grid_indices(lifted, n_q, n_k))
    out = out.detach().cpu().numpy() if hasattr(out, "detach") else np.asarray(out)
    if out.dtype != bool:
        raise TypeError(f"mask_mod {reference} must return booleans; got dtype {out.dtype}")
    return np.broadcast_to(out, (*lifted, n_q, n_k)).reshape((*batch, n_q, n_k))


def leaves(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The leaf specs of a (possibly composed) mask, left to right."""
    if spec["kind"] in COMBINATORS:
        return [leaf for part in spec["parts"] for leaf in leaves(part)]
    return [spec]


def simplified(spec: dict[str, Any]) -> dict[str, Any]:
    """The same allowed set with the composition written shortest: ``none`` (every pair) is
    the identity of ``and`` and absorbs an ``or``, a nested ``and`` in an ``and`` (``or`` in
    ``or``) is flattened, repeated parts kept once, a single part stands alone
    (``and(and(none, none), and(none, none))`` is ``none``)."""
    kind = spec["kind"]
    if kind not in COMBINATORS:
        return spec
    parts: list[dict[str, Any]] = []
    for part in (simplified(p) for p in spec["parts"]):
        for leaf in part["parts"] if part["kind"] == kind else [part]:
            if leaf not in parts:
                parts.append(leaf)
    if any(p["kind"] == "none" for p in parts):
        if kind == "or":
            return {"kind": "none"}
        parts = [p for p in parts if p["kind"] != "none"]
    if not parts:
        return {"kind": "none"}
    return parts[0] if len(parts) == 1 else {"kind": kind, "parts": parts}


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
    if kind == "mask_mod":
        return f"mask_mod {spec['fn']}"
    return kind


# --- score modification --------------------------------------------------------------------
SCORE_KINDS = ("none", "alibi", "t5", "dense")
ALIBI_FORMS = ("abs", "causal")


def heads(batch: tuple[int, ...]) -> int:
    """The number of heads a per-head bias has: the last of two batch axes, else 1."""
    return batch[-1] if len(batch) == 2 else 1


def bias(
    spec: dict[str, Any], batch: tuple[int, ...], n_q: int, n_k: int, rows: Rows | None = None
) -> np.ndarray | None:
    """The bias ``B`` of a score spec (float64, broadcastable to ``(*batch, n_q, n_k)``);
    None for ``none``; with ``rows = (start, stop)`` only that strip of query rows."""
    kind = spec["kind"]
    start, stop = (0, n_q) if rows is None else rows
    i = np.arange(start, stop)[:, None]
    j = np.arange(n_k)[None, :]
    if kind == "none":
        return None
    if kind == "alibi":
        form = spec.get("form", "abs")
        if form not in ALIBI_FORMS:
            raise ValueError(f"alibi form must be one of {ALIBI_FORMS}; got {form!r}")
        distance = i + offset(spec, n_q, n_k) - j
        distance = np.abs(distance) if form == "abs" else distance
        slopes = np.asarray(spec["slopes"], dtype=np.float64)
        return _per_head(-slopes[:, None, None] * distance, batch)
    if kind == "t5":
        table = np.asarray(spec["table"], dtype=np.float64)
        bucket = t5_bucket(j - i, table.shape[-1], spec["max_distance"])
        return _per_head(table[:, bucket], batch)
    if kind == "dense":
        return _strip(np.asarray(spec["values"], dtype=np.float64), start, stop)
    raise ValueError(f"unknown score kind {kind!r}; use one of {SCORE_KINDS}")


def _per_head(table: np.ndarray, batch: tuple[int, ...]) -> np.ndarray:
    """``(H, n_q, n_k)`` per-head values as a bias broadcasting over ``batch``."""
    return table if len(batch) == 2 else table[0]


def t5_bucket(relative: np.ndarray, buckets: int, max_distance: int) -> np.ndarray:
    """T5's bidirectional bucket of ``relative = j − i`` (Raffel et al. 2020, Mesh
    TensorFlow's ``_relative_position_bucket``): half the buckets per sign; distances below
    a quarter of the buckets get one bucket each, longer ones log-spaced up to
    ``max_distance`` (and beyond it the last bucket)."""
    half = buckets // 2
    exact = half // 2
    sign = np.where(relative > 0, half, 0)
    distance = np.abs(relative)
    with np.errstate(divide="ignore"):
        far = np.log(np.maximum(distance, 1) / exact) / math.log(max_distance / exact)
    far = np.minimum(exact + (far * (half - exact)).astype(np.int64), half - 1)
    return sign + np.where(distance < exact, distance, far)


def describe_score(spec: dict[str, Any], softcap: float | None = None) -> str:
    """One line, e.g. ``alibi[abs, top-left] + softcap 20``."""
    kind = spec["kind"]
    parts = []
    if softcap is not None:
        parts.append(f"softcap {softcap:g}")
    if kind == "alibi":
        slopes = np.asarray(spec["slopes"]).tolist()
        parts.append(f"alibi[{spec.get('form', 'abs')}, {spec.get('align', 'top-left')}]{slopes}")
    elif kind == "t5":
        parts.append(f"t5 buckets {np.shape(spec['table'])}")
    elif kind == "dense":
        parts.append(f"dense bias ({spec.get('shape', 'full')})")
    return " + ".join(parts)


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
