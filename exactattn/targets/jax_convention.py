"""The ``jax`` calling convention: a case's masks as ``jax.nn.dot_product_attention``'s own.

The target is called as ``fn(query, key, value, bias, mask, *, scale, is_causal,
query_seq_lengths, key_value_seq_lengths, local_window_size)``: torch tensors ``(B, H, n,
·)`` (the sdpa layout; the wrapper transposes to JAX's ``BTNH``), K and V with fewer heads
for GQA, and the mask lowered as production code passes it to JAX. Each conjunct of the
mask (:func:`~exactattn.cases.mask_kinds.conjuncts`) becomes, by its kind's entry in
:data:`~exactattn.cases.mask_kinds.MASK_KINDS` (the sources: ``jax/_src/nn/functions.py``,
jax-v0.10.2, line numbers there):

* a causal mask aligned top-left (or any causal mask with ``n_q = n_k``): ``is_causal=True``
  (JAX's ``_get_causal_mask``, l. 868: ``tril``, ``j ≤ i``);
* a window (or a bottom-right causal mask): ``local_window_size=(left, right)``, JAX's
  ``_get_window_mask`` (l. 872): ``i ≤ j + left`` and ``i ≥ j − right``, i.e. ``i − left ≤ j ≤ i +
  right`` with ``i, j`` the positions from 0 whatever ``n_q, n_k`` (top-left alignment). So
  a window ``(L, R)`` aligned with offset ``o`` (``n_k − n_q`` for bottom-right) is ``(L −
  o, R + o)``; an unbounded side is ``max(n_q, n_k)`` (every pair on that side); several
  windows intersect (the smaller size on each side). A side that comes out negative is no
  window size (JAX's docstring: "Window sizes"): that conjunct goes to ``mask``;
* key padding with one length per sequence: ``key_value_seq_lengths`` (int32 ``(B,)``;
  several: the shortest), JAX's ``_get_padding_mask_logits`` (l. 880): ``j < kv_len[b]``;
* query padding (the ``query_padding`` kind) with one length per sequence:
  ``query_seq_lengths`` (int32 ``(B,)``): JAX masks the padded rows' logits
  (``_get_padding_mask_logits``: ``i < q_len[b]``) and multiplies their output by 0
  (``_dot_product_attention_core``, l. 975–976: ``encoded *= mask.astype(encoded.dtype)``,
  from ``_get_padding_mask_encoded``), so a padded row is exactly 0 (or −0) and passes no
  gradient: exactattn's rows with no allowed key (``empty_rows='zero'``), judged as such;
* every other conjunct (a dense table, document ids, a user's mask_mod, a disjunction,
  per-head lengths): JAX's boolean ``mask`` ``(B, H, n_q, n_k)``, their conjunction from the
  definitions.

The bias goes as ``bias`` (in the input dtype, ``(B, H, n_q, n_k)``). JAX ANDs every mask
argument into one and replaces the excluded logits by a finite ``−0.7·finfo.max``
(``_apply_masks``), so a row with no allowed key that is not a padded query row averages
every value: such cases are not taken (:meth:`Jax.unsupported`), nor are dropout and
soft-caps (``dot_product_attention`` has neither).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cases import Case, mask_kinds
from .conventions import (
    Convention,
    autograd,
    dtype_name,
    four_g,
    four_views,
    grads_out,
    lift,
    tensor,
    to_numpy,
)

EMPTY_ROWS = (
    "a row with no allowed key that is not a padded query row averages every value in JAX "
    "(masked logits are -0.7·finfo.max, jax/_src/nn/functions.py _apply_masks)"
)


@dataclass
class Lowered:
    """A case's mask as JAX's arguments (see the module docstring): lengths ``(B,)`` or None,
    ``window`` JAX's ``(left, right)`` or None, ``rest`` the conjuncts given as ``mask``."""

    is_causal: bool = False
    window: tuple[int, int] | None = None
    query_lengths: np.ndarray | None = None
    key_lengths: np.ndarray | None = None
    rest: list[dict[str, Any]] = field(default_factory=list)


def lowered(case: Case) -> Lowered:
    """The case's mask as JAX's arguments (see the module docstring)."""
    n_q, n_k = case.sizes["n_q"], case.sizes["n_k"]
    B, _ = lift(case.batch)
    out = Lowered()
    left, right = math.inf, math.inf
    for part in mask_kinds.conjuncts(case.mask):
        kind = mask_kinds.of(part)
        align = mask_kinds.causal_alignment(part)
        window = mask_kinds.window(part)
        keys = _per_sequence(mask_kinds.key_lengths(part), B)
        queries = _per_sequence(mask_kinds.query_lengths(part), B)
        if kind.every_pair:
            continue
        if align is not None and (align == "top-left" or n_q == n_k):
            out.is_causal = True
        elif window is not None and (sides := _top_left(window, n_q, n_k)) is not None:
            left, right = min(left, sides[0]), min(right, sides[1])
        elif keys is not None:
            out.key_lengths = keys if out.key_lengths is None else np.minimum(out.key_lengths, keys)
        elif queries is not None:
            out.query_lengths = (
                queries if out.query_lengths is None else np.minimum(out.query_lengths, queries)
            )
        else:
            out.rest.append(part)
    if (left, right) != (math.inf, math.inf):
        unbounded = max(n_q, n_k)
        out.window = tuple(int(min(x, unbounded)) for x in (left, right))  # type: ignore[assignment]
    return out


def _top_left(window: mask_kinds.Window, n_q: int, n_k: int) -> tuple[float, float] | None:
    """``(L − o, R + o)`` of a window ``(L, R, align)`` with offset ``o`` (∞: unbounded), or
    None when a side is negative (no window size)."""
    left, right, align = window
    o = n_k - n_q if align == "bottom-right" else 0
    sides = (math.inf if left is None else left - o, math.inf if right is None else right + o)
    return None if min(sides) < 0 else sides


def _per_sequence(lengths: Any, B: int) -> np.ndarray | None:
    """One int32 length per sequence (the first batch axis), or None (no lengths, or per
    head)."""
    if lengths is None:
        return None
    lengths = np.asarray(lengths).reshape(-1)
    return lengths.astype(np.int32) if lengths.shape[0] == B else None


def padded_rows(case: Case, lengths: np.ndarray | None) -> np.ndarray:
    """The query rows JAX zeroes, ``(*batch, n_q)``: ``i ≥ q_len[b]`` (none without lengths)."""
    n_q = case.sizes["n_q"]
    B, H = lift(case.batch)
    if lengths is None:
        return np.zeros((*case.batch, n_q), dtype=bool)
    rows = np.arange(n_q)[None, None, :] >= lengths.reshape(B, 1, 1)
    return np.broadcast_to(rows, (B, H, n_q)).reshape((*case.batch, n_q))


class Jax(Convention):
    """``jax.nn.dot_product_attention``'s own mask arguments (see the module docstring)."""

    name = "jax"
    ragged = True

    def unsupported(self, target, case, device, grads):
        if case.dropout_p:
            return "jax.nn.dot_product_attention has no dropout"
        if case.softcap is not None or case.score_mod is not None:
            return "jax.nn.dot_product_attention takes no soft-cap or score_mod"
        empty = ~case.attended().any(axis=-1)
        if (empty & ~padded_rows(case, lowered(case).query_lengths)).any():
            return EMPTY_ROWS
        return None

    def run(self, target, case, held, device, grads):
        import torch

        fn = target.load()
        B, H = lift(case.batch)
        n = case.sizes
        four, views = four_views(case, held, B, device, grads)
        lowering = lowered(case)
        kwargs: dict[str, Any] = {"scale": case.scale, "is_causal": lowering.is_causal}
        if lowering.window is not None:
            kwargs["local_window_size"] = lowering.window
        for name, lengths in (
            ("query_seq_lengths", lowering.query_lengths),
            ("key_value_seq_lengths", lowering.key_lengths),
        ):
            if lengths is not None:
                kwargs[name] = torch.from_numpy(lengths.copy())  # int32 (B,)
        bias = mask = None
        if "bias" in held:
            bias = tensor(case.lifted_bias(held["bias"]), case.dtype, device, "contiguous", False)
        if lowering.rest:
            table = np.logical_and.reduce(
                [
                    mask_kinds.allowed(part, case.batch, n["n_q"], n["n_k"],
                                       mask_mod_table=case.mask_mod_table)
                    for part in lowering.rest
                ]
            )  # fmt: skip
            mask = torch.from_numpy(table.reshape(B, H, n["n_q"], n["n_k"]).copy()).to(device)
        y = fn(*views, bias, mask, **kwargs)
        out = {"y": to_numpy("y", y, (B, H, n["n_q"], n["v"])), "_dtype": dtype_name(y)}
        if grads:
            grads_out(out, autograd(y, views, four_g(held, B), case.dtype, device), four, held)
        out["y"] = out["y"].reshape(held["g"].shape)
        return out
