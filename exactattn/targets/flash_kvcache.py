"""flash-attn's KV-cache decode call as production makes it: ``flash_attn_with_kvcache``.

The convention takes a case (dense ``q, k, v`` over ``(B, H)``, sequence ``b`` with ``ℓ_b``
keys: :func:`~.interface_conventions.sequences`) and its ``kvcache`` field
(:func:`exactattn.cases.interface_fields.resolve_kvcache`) and calls::

    flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
        rotary_cos=, rotary_sin=, cache_seqlens=, cache_batch_idx=, cache_leftpad=,
        block_table=, softmax_scale=, causal=, window_size=, softcap=,
        rotary_interleaved=, alibi_slopes=, num_splits=, return_softmax_lse=)

* the first ``ℓ_b − a`` keys and values of each sequence are already in the cache, the last
  ``a`` (the field's ``append``) are passed as ``k_new, v_new`` ``(B, a, H_kv, ·)``:
  ``cache_seqlens[b] = λ_b + ℓ_b − a``, and the kernel writes them into the cache;
* the cache is the case's ``pages`` (``block_table``) or a contiguous ``(rows, length,
  H_kv, ·)`` cache, sequence ``b`` in row ``cache_batch_idx[b]`` from position ``λ_b =
  cache_leftpad[b]``; every position the call must not read (past ``cache_seqlens``, before
  ``λ_b``, rows and pages of no sequence) holds NaN, so a kernel that reads one shows it;
* with ``rotary``, the kernel rotates the queries and the new keys (flash-attn's rule: the
  new key ``r`` at position ``cache_seqlens[b] + r``, the query ``i`` at
  ``cache_seqlens[b] + i`` when causal or local, else every query at ``cache_seqlens[b]``),
  so the convention passes them turned back by the inverse rotation. Its tables are
  quarter turns (:func:`~exactattn.cases.interface_fields.quarter_turns`, ``cos, sin ∈ {0,
  ±1}``): both rotations are exact in every format, the kernel attends exactly the case's
  keys and the certified reference judges it unchanged. The kernel's rounding of a general
  rotation is not judged (a case with real angles would need the rotation in its bound);
* causal and window masks aligned bottom-right at each sequence's ``ℓ_b`` (a varlen batch's
  per-sequence mask, every sequence with the case's ``n_q`` queries).

After the call the caches must hold the case's keys and values, the appended ones at their
positions (rotated, so the case's own), and NaN everywhere else, bit for bit: an append at
the wrong place or a write past it fails the case. Forward only (flash-attn's function has
no backward).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cases import Case, interface_fields
from .conventions import TargetError, dtype_name, lift, tensor, to_numpy
from .interface_conventions import (
    FlashBase,
    InterfaceDraw,
    Sequences,
    flash_alibi,
    flash_kwargs,
    sequences,
    to_bnhd,
)

NO_APPEND = {"append": 0, "paged": True, "rotary": None, "num_splits": 0}  # a case without


class FlashKvcache(FlashBase):
    name = "flash-kvcache"
    kvcache = True
    reads = ("seqlens", "pages", "kvcache")

    def unsupported(self, target, case, device, grads):
        B, _ = lift(case.batch)
        layout = sequences(case, B)
        if isinstance(layout, str):
            return layout
        if (layout.q != case.sizes["n_q"]).any():
            return (
                "flash_attn_with_kvcache takes n_q queries for every sequence (a dense q): a "
                "ragged batch of queries is a varlen call"
            )
        if case.bias is not None:
            if case.seqlens is not None or (layout.k != case.sizes["n_k"]).any():
                return (
                    "flash-attn aligns ALiBi to each sequence's own key length; the padded "
                    "case aligns it to n_k"
                )
            return flash_alibi(case)
        return None

    def run(self, target, case, held, device, grads):
        import torch

        fn = target.load()
        B, H = lift(case.batch)
        n = case.sizes
        bnhd = to_bnhd(held, B)  # (B, n, H, ·)
        layout = sequences(case, B)
        assert isinstance(layout, Sequences)  # unsupported() said so
        field = case.kvcache or NO_APPEND
        call = CacheCall(case, field, layout, B)
        before = {x: call.cache(bnhd[x], written=False) for x in "kv"}

        def plain(x: np.ndarray) -> Any:  # a contiguous tensor of the case's dtype
            return tensor(x, case.dtype, device, "contiguous", False)

        caches = {x: plain(before[x]) for x in "kv"}
        new = {x: call.new(bnhd[x]) for x in "kv"}
        q = bnhd["q"]
        kwargs = flash_kwargs(case, device, layout.window)
        rotary = field["rotary"]
        if rotary is not None:
            cos, sin = call.tables(rotary)
            back = -1  # the inverse turn: the kernel's rotation brings the case's keys back
            turn = interface_fields.rotated
            new["k"] = turn(new["k"], cos, sin, call.key_positions(), rotary["interleaved"], back)
            q = turn(q, cos, sin, call.query_positions(kwargs), rotary["interleaved"], back)
            kwargs.update(
                rotary_cos=plain(cos),
                rotary_sin=plain(sin),
                rotary_interleaved=rotary["interleaved"],
            )
        if call.append:
            kwargs.update({x: plain(new[x]) for x in "kv"})
        want_lse = target.caps.lse is True
        as_int = lambda x: torch.tensor(np.asarray(x), dtype=torch.int32, device=device)  # noqa: E731
        result = fn(
            tensor(q, case.dtype, device, case.layout, False),
            caches["k"],
            caches["v"],
            cache_seqlens=as_int(call.cache_seqlens),
            return_softmax_lse=want_lse,
            num_splits=field["num_splits"],
            **call.placement(as_int),
            **kwargs,
        )
        for x in "kv":
            expected = call.cache(bnhd[x], written=True)
            _same_cache(x + "_cache", to_numpy(x + "_cache", caches[x], expected.shape), expected)
        y = result[0] if isinstance(result, (tuple, list)) else result
        dense_y = to_numpy("y", y, (B, n["n_q"], H, n["v"])).transpose(0, 2, 1, 3)
        out = {"y": dense_y.reshape(held["g"].shape), "_dtype": dtype_name(y)}
        if want_lse:
            lse = to_numpy("lse", result[1], (B, H, n["n_q"]))
            out["lse"] = lse.reshape(held["g"].shape[:-1])
        return out


class CacheCall:
    """Where a kvcache call holds each sequence's keys: ``ℓ_b`` keys of sequence ``b``, the
    last ``a`` appended, sequence ``b`` from position ``λ_b`` of its cache row (contiguous)
    or in its pages (paged)."""

    def __init__(self, case: Case, field: dict[str, Any], layout: Sequences, B: int):
        self.case, self.field, self.B = case, field, B
        self.lengths = [int(x) for x in layout.k]
        self.append = int(field["append"])
        self.paged = bool(field["paged"])
        if self.paged:
            self.pages = InterfaceDraw.pages(case, B)
            self.leftpad = [0] * B
            self.capacity = len(self.pages["table"][0]) * self.pages["size"]
        else:
            self.leftpad = list(field.get("leftpad") or [0] * B)
            self.rows = field["batch_idx"] or list(range(B))
            self.capacity = int(field["length"])
        self.cache_seqlens = [s + n - self.append for s, n in zip(self.leftpad, self.lengths)]

    def cache(self, x: np.ndarray, written: bool) -> np.ndarray:
        """The cache of ``x (B, n_k, H_kv, ·)`` before the call (``written`` False: the last
        ``a`` keys not there yet) or after it: NaN wherever no key of a sequence is."""
        H, width = x.shape[2:]
        if self.paged:
            size, table = self.pages["size"], np.asarray(self.pages["table"])
            out = np.full((self.pages["pool"], size, H, width), np.nan)
        else:
            out = np.full((self.field["rows"], self.capacity, H, width), np.nan)
        for b, n in enumerate(self.lengths):
            for t in range(n if written else n - self.append):
                if self.paged:
                    out[table[b, t // size], t % size] = x[b, t]
                else:
                    out[self.rows[b], self.leftpad[b] + t] = x[b, t]
        return out

    def new(self, x: np.ndarray) -> np.ndarray:
        """The appended keys (or values) ``(B, a, H_kv, ·)``: each sequence's last ``a``."""
        return np.stack([x[b, n - self.append : n] for b, n in enumerate(self.lengths)])

    def placement(self, as_int: Any) -> dict[str, Any]:
        """``block_table``, or ``cache_batch_idx`` and ``cache_leftpad`` where drawn."""
        if self.paged:
            return {"block_table": as_int(self.pages["table"])}
        out = {}
        if self.field.get("batch_idx") is not None:
            out["cache_batch_idx"] = as_int(self.rows)
        if self.field.get("leftpad") is not None:
            out["cache_leftpad"] = as_int(self.leftpad)
        return out

    def key_positions(self) -> np.ndarray:
        """``(B, a)``: the rotary position of each new key, ``cache_seqlens[b] + r``."""
        return np.asarray(self.cache_seqlens)[:, None] + np.arange(self.append)

    def query_positions(self, kwargs: dict[str, Any]) -> np.ndarray:
        """``(B, n_q)``: ``cache_seqlens[b] + i`` when the call is causal or local (a window
        that reaches past the cache is none, as flash-attn reads it), else
        ``cache_seqlens[b]`` for every query."""
        left, right = (x if 0 <= x < self.capacity else -1 for x in kwargs["window_size"])
        per_row = kwargs["causal"] or (left, right) != (-1, -1)
        n_q = self.case.sizes["n_q"]
        step = np.arange(n_q) if per_row else np.zeros(n_q, dtype=int)
        return np.asarray(self.cache_seqlens)[:, None] + step

    def tables(self, rotary: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """``rotary_cos, rotary_sin`` over every position the cache and the call reach."""
        n_q = self.case.sizes["n_q"]
        reach = max(self.cache_seqlens, default=0) + max(self.append, n_q)
        positions = max(self.capacity, reach)
        return interface_fields.quarter_turns(rotary["seed"], positions, rotary["dim"] // 2)


def _same_cache(name: str, got: np.ndarray, expected: np.ndarray) -> None:
    """After the call a cache holds the case's keys at their positions and NaN elsewhere,
    bit for bit (the kernel copies; it computes nothing there)."""
    same = (got == expected) | (np.isnan(got) & np.isnan(expected))
    if not same.all():
        at = tuple(int(i) for i in np.argwhere(~same)[0])
        raise TargetError(
            f"{name} after the call: entry {at} (cache row or page, position, kv head, column) "
            f"is {float(got[at])!r}, expected {float(expected[at])!r} (the case's key there, "
            "NaN where the call writes nothing)"
        )
