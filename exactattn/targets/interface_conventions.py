"""Calling conventions of today's kernel interfaces: varlen, KV caches, split-KV merges.

Each takes an ordinary case (dense ``q, k, v`` over ``(B, H)``) and calls the target through
the interface, so the case's certified reference judges the result unchanged:

* ``flash-varlen``: ``flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k,
  max_seqlen_q, max_seqlen_k, ...)``: the ``B`` batch elements packed as sequences; a
  key-padding mask becomes unequal key lengths (only the real keys are packed: their
  ``dK``, ``dV`` come back in place, the padded keys' are 0); causal and windows aligned
  bottom-right as ``flash``.
* ``flash-kvcache``: ``flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=,
  block_table=, ...)``: the keys placed in the case's paged cache (its ``pages``: the
  block table of shuffled pages) (key padding: ``cache_seqlens``); forward only
  (flash-attn's function has no backward).
* ``fa4-combine``, ``xformers-merge``, ``flashinfer-merge``: the target is a *merge*: the
  keys are split into the case's number of parts, each part's partial ``(y_t, lse_t)`` is
  computed in float64 by :func:`exactattn.attention` (``key_range``) and rounded to the case
  dtype, and the target merges them: FA4's ``flash_attn_combine(out_partial (S, B, n, H,
  v), lse_partial (S, B, n, H))``, xformers' ``merge_attentions(attn_split (S, B, n, H, v),
  lse_split (S, B, H, n))``, FlashInfer's ``merge_state(v_a, s_a, v_b, s_b)`` (``(n, H, v)``,
  ``(n, H)``, lse in base 2, folded over the parts in the case's dtype). Forward only.
* ``flashinfer-prefill``, ``flashinfer-decode``, ``flashinfer-paged``: FlashInfer's
  ``single_prefill_with_kv_cache`` per batch element, ``single_decode_with_kv_cache`` per
  query row (the decode steps of a cache) and ``BatchPrefillWithPagedKVCacheWrapper`` on
  the case's paged cache (its ``pages``, as ``flash-kvcache``); causal and ``window_left``
  bottom-right, lse in base 2 (:class:`_Flashinfer`). Forward only.
* ``onnx-kvcache``: ONNX ``Attention`` with ``past_key`` / ``past_value``
  (:class:`OnnxKvcache`): the keys split into a past and the new part (at a causal mask's
  offset, else at the last split-KV boundary, ``splits``); the present caches must come back
  as their concatenation, exactly. Forward only.
* ``ort-gqa``: ``com.microsoft.GroupQueryAttention`` (:class:`OrtGqa`): ``(B, S, H·d)``
  inputs, a right-padded past cache, ``seqlens_k``, ``local_window_size``. Forward only.
* ``exactattn-sinks``: a sink-capable attention returning ``(y, lse)``
  (:class:`Sinks`: the sink given and taken out again). Forward only.

Each reads the case's interface fields (:mod:`exactattn.cases.interface_fields`: ``seqlens``,
``splits``, ``pages``, ``sinks``), which ``exactattn check`` draws whenever a target runs
through one of these conventions. A case without them (drawn for another convention, or
replayed from an older file) gets a layout derived from its contents,
:meth:`InterfaceDraw.of`, so a replay gets the same one.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cases import Case, interface_fields, mask_kinds
from .conventions import (
    Convention,
    TargetError,
    autograd,
    dtype_name,
    flash_alibi,
    flash_window,
    four_g,
    lift,
    lifted_allowed,
    tensor,
    to_numpy,
    torch_dtype,
)

LOG2_E = 1 / math.log(2)


@dataclass(frozen=True)
class InterfaceDraw:
    """The layout of a case without interface fields: ``splits`` equal parts of the keys,
    pages of ``page_size`` (of the drawn distribution,
    :data:`~exactattn.cases.interface_fields.PAGE_SIZES`) in the order ``seed`` draws; all
    read from a hash of the keys."""

    splits: int
    page_size: int
    seed: int

    @classmethod
    def of(cls, case: Case) -> InterfaceDraw:
        digest = hashlib.sha256(np.ascontiguousarray(case.k).tobytes()).digest()
        seed = int.from_bytes(digest[:4], "little")
        u = int.from_bytes(digest[4:8], "little") / 2**32
        n_k = case.sizes["n_k"]
        return cls(
            splits=max(1, min(n_k, 2 + seed % 3)),
            page_size=interface_fields.page_size(u, case.block_size, n_k),
            seed=seed,
        )

    @staticmethod
    def edges(case: Case) -> list[int]:
        """The split-KV key boundaries: the case's ``splits``, else equal parts."""
        if case.splits is not None:
            return list(case.splits)
        splits = InterfaceDraw.of(case).splits
        return np.linspace(0, case.sizes["n_k"], splits + 1).round().astype(int).tolist()

    @staticmethod
    def pages(case: Case, B: int) -> dict[str, Any]:
        """The paged cache's block table: the case's ``pages``, else unshared pages."""
        if case.pages is not None:
            return case.pages
        derived = InterfaceDraw.of(case)
        return interface_fields.fill_pages(derived.page_size, 0, derived.seed, B, case.sizes["n_k"])


def _key_lengths(case: Case, B: int) -> tuple[np.ndarray, str | None]:
    """Per-sequence key lengths: the case's ``seqlens`` (its mask is their key padding), the
    mask's for a mask of key lengths (:func:`exactattn.cases.mask_kinds.key_lengths`), else
    n_k."""
    n_k = case.sizes["n_k"]
    if case.seqlens is not None:
        return np.asarray(case.seqlens, dtype=np.int64), None
    lengths = mask_kinds.key_lengths(case.mask)
    if lengths is None:
        return np.full(B, n_k), None
    lengths = np.asarray(lengths).reshape(-1)
    if lengths.shape[0] != B:
        return lengths, "padding lengths per head are not sequence lengths"
    return lengths.astype(np.int64), None


def _window_of(case: Case) -> tuple[int, int] | str:
    """A mask of key lengths is the lengths (no window); else the flash convention's."""
    if mask_kinds.key_lengths(case.mask) is not None:
        return (-1, -1)
    return flash_window(case)


def _flash_kwargs(case: Case, device: str) -> dict[str, Any]:
    left, right = _window_of(case)  # type: ignore[misc]
    kwargs: dict[str, Any] = {
        "softmax_scale": case.c(),
        "causal": right == 0 and left == -1,
        "window_size": (left, right),
    }
    if case.softcap is not None:
        kwargs["softcap"] = case.softcap
    if case.bias is not None:
        import torch

        slopes = np.asarray(case.score["slopes"], dtype=np.float32)
        kwargs["alibi_slopes"] = torch.from_numpy(slopes).to(device)
    return kwargs


def _bnhd(held: dict[str, np.ndarray], B: int) -> dict[str, np.ndarray]:
    return {x: held[x].reshape((B, -1, *held[x].shape[-2:])).transpose(0, 2, 1, 3) for x in "qkv"}


class _Flash(Convention):
    """What flash-attn's packed conventions share: the masks they express."""

    def unsupported(self, target, case, device, grads):
        window = _window_of(case)
        if isinstance(window, str):
            return window
        B, _ = lift(case.batch)
        reason = _key_lengths(case, B)[1]
        if reason is None and case.bias is not None:
            if mask_kinds.key_lengths(case.mask) is not None:
                return (
                    "flash-attn aligns ALiBi to each sequence's own key length; the padded "
                    "case aligns it to n_k"
                )
            return flash_alibi(case)
        return reason


class FlashVarlen(_Flash):
    name = "flash-varlen"

    def run(self, target, case, held, device, grads):
        import torch

        fn = target.load()
        B, H = lift(case.batch)
        n = case.sizes
        bnhd = _bnhd(held, B)
        lengths, _ = _key_lengths(case, B)
        packed = {"q": bnhd["q"].reshape((-1, *bnhd["q"].shape[2:]))}
        for x in "kv":
            packed[x] = np.concatenate([bnhd[x][b, : lengths[b]] for b in range(B)])
        views = [tensor(packed[x], case.dtype, device, case.layout, grads) for x in "qkv"]
        cu_q = torch.arange(B + 1, dtype=torch.int32, device=device) * n["n_q"]
        cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
        want_lse = target.caps.lse is True
        result = fn(
            *views,
            cu_q,
            cu_k.to(device),
            n["n_q"],
            int(lengths.max(initial=0)),
            return_attn_probs=want_lse,
            **_flash_kwargs(case, device),
        )
        y = result[0] if isinstance(result, (tuple, list)) else result
        dense_y = to_numpy("y", y, (B * n["n_q"], H, n["v"])).reshape(B, n["n_q"], H, n["v"])
        out = {"y": dense_y.transpose(0, 2, 1, 3).reshape(held["g"].shape), "_dtype": dtype_name(y)}
        if want_lse:
            lse = to_numpy("lse", result[1], (H, B * n["n_q"])).reshape(H, B, n["n_q"])
            out["lse"] = lse.transpose(1, 0, 2).reshape(held["g"].shape[:-1])
        if grads:
            g = four_g(held, B).transpose(0, 2, 1, 3).reshape((-1, H, n["v"])).copy()
            dq, dk, dv = autograd(y, views, g, case.dtype, device)
            dense = {"dq": (dq, "q"), "dk": (dk, "k"), "dv": (dv, "v")}
            for name, (grad, x) in dense.items():
                flat = to_numpy(name, grad, packed[x].shape)
                back = np.zeros(bnhd[x].shape)
                if x == "q":
                    back[:] = flat.reshape(back.shape)
                else:
                    offsets = np.concatenate([[0], np.cumsum(lengths)])
                    for b in range(B):
                        back[b, : lengths[b]] = flat[offsets[b] : offsets[b + 1]]
                out[name] = back.transpose(0, 2, 1, 3).reshape(held[x].shape)
        return out


class FlashKvcache(_Flash):
    name = "flash-kvcache"

    def run(self, target, case, held, device, grads):
        import torch

        fn = target.load()
        B, H = lift(case.batch)
        n = case.sizes
        bnhd = _bnhd(held, B)
        lengths, _ = _key_lengths(case, B)
        pages = InterfaceDraw.pages(case, B)
        table = np.asarray(pages["table"])
        caches = _paged_caches(case, bnhd, pages, device)
        q = tensor(bnhd["q"], case.dtype, device, case.layout, False)
        want_lse = target.caps.lse is True
        result = fn(
            q,
            caches["k"],
            caches["v"],
            cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=device),
            block_table=torch.tensor(table, dtype=torch.int32, device=device),
            return_softmax_lse=want_lse,
            **_flash_kwargs(case, device),
        )
        y = result[0] if isinstance(result, (tuple, list)) else result
        dense_y = to_numpy("y", y, (B, n["n_q"], H, n["v"])).transpose(0, 2, 1, 3)
        out = {"y": dense_y.reshape(held["g"].shape), "_dtype": dtype_name(y)}
        if want_lse:
            lse = to_numpy("lse", result[1], (B, H, n["n_q"]))
            out["lse"] = lse.reshape(held["g"].shape[:-1])
        return out


class _Flashinfer(_Flash):
    """What FlashInfer's attention conventions share (``flashinfer/prefill.py``,
    ``decode.py``): NHD tensors ``q (n_q, H, d)``, ``k, v (n_k, H_kv, ·)`` per request,
    ``causal`` aligned bottom-right, a left window ``window_left`` (key ``j`` of row ``i``
    allowed iff ``j + n_q + window_left ≥ n_k + i``, ``attention/variants.cuh``
    ``DefaultAttention``), ``sm_scale``, ``logits_soft_cap`` (``cap·tanh(c·s/cap)``), no
    bias; the lse in base 2, ``lse₂ = m₂ + log₂ ℓ`` over the scores ``c·s·log₂e``
    (``prefill.py`` ``_finish_lse``: "Kernels write base-2 LSE"), so ``lse = lse₂ / log₂e``."""

    def unsupported(self, target, case, device, grads):
        if case.bias is not None:
            return "FlashInfer takes no bias (its ALiBi is pos_encoding_mode's own slopes)"
        reason = super().unsupported(target, case, device, grads)
        if reason is None and _window_of(case)[1] > 0:  # type: ignore[index]
            return "FlashInfer bounds a window on the left only (window_left; right: causal)"
        return reason

    @staticmethod
    def keywords(case: Case) -> dict[str, Any]:
        left, right = _window_of(case)  # type: ignore[misc]
        kwargs: dict[str, Any] = {"causal": right == 0, "window_left": left, "sm_scale": case.c()}
        if case.softcap is not None:
            kwargs["logits_soft_cap"] = case.softcap
        return kwargs

    @staticmethod
    def outputs(held, y: np.ndarray, lse: np.ndarray | None, dtype: str) -> dict[str, Any]:
        """``y (B, n_q, H, v)`` and the base-2 ``lse (B, n_q, H)`` in the case's layout."""
        out = {"y": y.transpose(0, 2, 1, 3).reshape(held["g"].shape), "_dtype": dtype}
        if lse is not None:
            out["lse"] = (lse.transpose(0, 2, 1) / LOG2_E).reshape(held["g"].shape[:-1])
        return out


class FlashinferPrefill(_Flashinfer):
    """``single_prefill_with_kv_cache(q, k, v, causal=, window_left=, sm_scale=,
    logits_soft_cap=, return_lse=)`` once per batch element, on its real keys only (key
    padding: ``k[:ℓ_b]``); any other mask the same for every head as its ``custom_mask``
    ``(n_q, n_k)`` (True = attend)."""

    name = "flashinfer-prefill"

    def unsupported(self, target, case, device, grads):
        reason = super().unsupported(target, case, device, grads)
        if reason is None or case.bias is not None or not self._custom(case):
            return reason
        allowed = lifted_allowed(case)
        if not (allowed == allowed[:, :1]).all():
            return f"{reason}; custom_mask is one (n_q, n_k) mask for every head"
        return None

    @staticmethod
    def _custom(case: Case) -> bool:
        """Whether the mask goes as ``custom_mask`` (not causal / window / key lengths)."""
        window = _window_of(case)
        return isinstance(window, str) or window[1] > 0

    def run(self, target, case, held, device, grads):
        fn = target.load()
        B, H = lift(case.batch)
        n = case.sizes
        bnhd = _bnhd(held, B)
        lengths, _ = _key_lengths(case, B)
        want_lse = target.caps.lse is True
        if self._custom(case):
            import torch

            allowed = torch.from_numpy(lifted_allowed(case)[:, 0].copy()).to(device)
            keywords = {"sm_scale": case.c(), "logits_soft_cap": case.softcap}
            masks = [{"custom_mask": allowed[b], **keywords} for b in range(B)]
        else:
            masks = [self.keywords(case)] * B
        ys, lses = [], []
        for b in range(B):
            q, k, v = (bnhd["q"][b], bnhd["k"][b, : lengths[b]], bnhd["v"][b, : lengths[b]])
            views = [tensor(x, case.dtype, device, case.layout, False) for x in (q, k, v)]
            result = fn(*views, return_lse=want_lse, **masks[b])
            y = result[0] if want_lse else result
            ys.append(to_numpy("y", y, (n["n_q"], H, n["v"])))
            if want_lse:
                lses.append(to_numpy("lse", result[1], (n["n_q"], H)))
        return self.outputs(held, np.stack(ys), np.stack(lses) if want_lse else None, dtype_name(y))


class FlashinferDecode(_Flashinfer):
    """``single_decode_with_kv_cache(q (H, d), k, v, window_left=, sm_scale=,
    logits_soft_cap=, return_lse=)`` once per query row, as the decode steps of a KV cache:
    row ``i`` of a causal case is the step whose cache holds keys ``0..i + n_k − n_q`` (the
    query sits at the last key, as decode's window counts back from it); without causal
    every row reads all ``ℓ_b`` real keys. A window without causal is no decode step."""

    name = "flashinfer-decode"

    def unsupported(self, target, case, device, grads):
        reason = super().unsupported(target, case, device, grads)
        if reason is None:
            left, right = _window_of(case)  # type: ignore[misc]
            if left >= 0 and right != 0:
                return "a decode step's window counts back from its last key: causal only"
        return reason

    def run(self, target, case, held, device, grads):
        fn = target.load()
        B, H = lift(case.batch)
        n = case.sizes
        bnhd = _bnhd(held, B)
        lengths, _ = _key_lengths(case, B)
        keywords = self.keywords(case)
        causal = keywords.pop("causal")
        want_lse = target.caps.lse is True
        y_rows = np.zeros((B, n["n_q"], H, n["v"]))
        lse_rows = np.zeros((B, n["n_q"], H))
        for b, i in itertools.product(range(B), range(n["n_q"])):
            stop = min(lengths[b], i + n["n_k"] - n["n_q"] + 1) if causal else lengths[b]
            q, k, v = (bnhd["q"][b, i], bnhd["k"][b, :stop], bnhd["v"][b, :stop])
            views = [tensor(x, case.dtype, device, case.layout, False) for x in (q, k, v)]
            result = fn(*views, return_lse=want_lse, **keywords)
            y = result[0] if want_lse else result
            y_rows[b, i] = to_numpy("y", y, (H, n["v"]))
            if want_lse:
                lse_rows[b, i] = to_numpy("lse", result[1], (H,))
        return self.outputs(held, y_rows, lse_rows if want_lse else None, dtype_name(y))


WORKSPACE_BYTES = 128 << 20  # the float workspace FlashInfer's wrappers recommend (128 MB)


class FlashinferPaged(_Flashinfer):
    """``BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")``, ``.plan(qo_indptr,
    paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, H, H_kv, d, P,
    head_dim_vo=, causal=, ...)``, ``.run(q, (k_cache, v_cache), return_lse=)``: the keys
    in the case's paged cache (its ``pages``, as ``flash-kvcache``), sequence ``b`` on the
    first ``⌈ℓ_b/P⌉`` pages of its block table, its last page holding ``ℓ_b − (⌈ℓ_b/P⌉−1)·P``
    keys; the queries packed ``(B·n_q, H, d)``."""

    name = "flashinfer-paged"

    def run(self, target, case, held, device, grads):
        import torch

        wrapper_class = target.load()
        B, H = lift(case.batch)
        n = case.sizes
        bnhd = _bnhd(held, B)
        lengths, _ = _key_lengths(case, B)
        pages = InterfaceDraw.pages(case, B)
        size, table = pages["size"], np.asarray(pages["table"])
        caches = _paged_caches(case, bnhd, pages, device)
        counts = -(-lengths // size)
        indices = np.concatenate([table[b, : counts[b]] for b in range(B)])
        as_int = lambda x: torch.tensor(np.asarray(x), dtype=torch.int32, device=device)  # noqa: E731
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        wrapper = wrapper_class(workspace, "NHD")
        wrapper.plan(
            as_int(np.arange(B + 1) * n["n_q"]),
            as_int(np.concatenate([[0], np.cumsum(counts)])),
            as_int(indices),
            as_int(lengths - (counts - 1) * size),
            H,
            bnhd["k"].shape[2],
            n["d"],
            size,
            head_dim_vo=n["v"],
            q_data_type=torch_dtype(case.dtype),
            kv_data_type=torch_dtype(case.dtype),
            **self.keywords(case),
        )
        q = tensor(bnhd["q"].reshape((-1, H, n["d"])), case.dtype, device, case.layout, False)
        want_lse = target.caps.lse is True
        result = wrapper.run(q, (caches["k"], caches["v"]), return_lse=want_lse)
        y = result[0] if want_lse else result
        dense_y = to_numpy("y", y, (B * n["n_q"], H, n["v"])).reshape(B, n["n_q"], H, n["v"])
        lse = None
        if want_lse:
            lse = to_numpy("lse", result[1], (B * n["n_q"], H)).reshape(B, n["n_q"], H)
        return self.outputs(held, dense_y, lse, dtype_name(y))


def _paged_caches(case: Case, bnhd: dict[str, np.ndarray], pages: dict[str, Any], device: str):
    """The keys and values in the case's paged cache ``(pool, P, H_kv, ·)`` (NHD): key ``t``
    of sequence ``b`` at row ``t mod P`` of page ``table[b][t // P]``."""
    size, table = pages["size"], np.asarray(pages["table"])
    caches = {}
    for x in "kv":
        cache = np.zeros((pages["pool"], size, *bnhd[x].shape[2:]))
        for b in range(table.shape[0]):  # a shared page is written by each sequence alike
            for t in range(bnhd[x].shape[1]):
                cache[table[b, t // size], t % size] = bnhd[x][b, t]
        caches[x] = tensor(cache, case.dtype, device, "contiguous", False)
    return caches


def partials(case: Case, held: dict[str, np.ndarray], edges: list[int]) -> list[tuple[Any, Any]]:
    """The case's keys in the contiguous parts between ``edges``, each part's ``(y_t,
    lse_t)`` in float64 (``(*batch, n_q, v)``, ``(*batch, n_q)``): rows with no key in a part
    (an empty part included) are ``(0, −∞)``."""
    from .. import api

    out = []
    for start, stop in itertools.pairwise(edges):
        y, stats = api.attention(
            held["q"],
            held["k"],
            held["v"],
            scale=case.c(),
            mask=case.allowed(),
            bias=held.get("bias"),
            softcap=case.softcap,
            enable_gqa=case.group > 1,
            key_range=(int(start), int(stop)),
            check_finite=False,
            return_stats=True,
        )
        out.append((y, stats.lse))
    return out


class _Merge(Convention):
    """A merge of split-KV partials; subclasses lay them out and call the target."""

    def unsupported(self, target, case, device, grads):
        if case.dropout_p:
            return "a merge of partials has no dropout of its own"
        if case.score_mod is not None:
            return "the partials are computed with the library's masks and bias only"
        return None

    def run(self, target, case, held, device, grads):
        import torch

        B, H = lift(case.batch)
        n = case.sizes
        parts = partials(case, held, InterfaceDraw.edges(case))
        ys = np.stack([y.reshape(B, H, n["n_q"], n["v"]) for y, _ in parts])
        lses = np.stack([lse.reshape(B, H, n["n_q"]) for _, lse in parts])
        dtype = getattr(torch, case.dtype)
        y, lse = self.merge(
            target.load(),
            torch.from_numpy(ys).to(dtype).to(device),
            torch.from_numpy(lses).float().to(device),
        )
        out = {"y": to_numpy("y", y, (B, H, n["n_q"], n["v"])), "_dtype": dtype_name(y)}
        out["y"] = out["y"].reshape(held["g"].shape)
        if target.caps.lse is True:
            out["lse"] = to_numpy("lse", lse, (B, H, n["n_q"])).reshape(held["g"].shape[:-1])
        return out

    def merge(self, fn, ys, lses):
        """``(y (B, H, n, v), lse (B, H, n))`` of ``ys (S, B, H, n, v)``, ``lses (S, B, H, n)``."""
        raise NotImplementedError


class Fa4Combine(_Merge):
    name = "fa4-combine"

    def merge(self, fn, ys, lses):
        y, lse = fn(ys.permute(0, 1, 3, 2, 4), lses.permute(0, 1, 3, 2))
        return y.permute(0, 2, 1, 3), lse.permute(0, 2, 1)


class XformersMerge(_Merge):
    name = "xformers-merge"

    def merge(self, fn, ys, lses):
        y, lse = fn(ys.permute(0, 1, 3, 2, 4), lses)
        return y.permute(0, 2, 1, 3), lse


class FlashinferMerge(_Merge):
    """FlashInfer's ``merge_state``: ``(n, H, v)`` and base-2 ``(n, H)``, one batch element and
    two states per call, folded over the parts; each tensor contiguous and ``v`` in the case's
    dtype, as the kernel takes them (``csrc/cascade.cu`` ``merge_state``: ``CHECK_INPUT``,
    float16/bfloat16 only by ``DISPATCH_DLPACK_DTYPE_TO_CTYPE_FP16``).

    Each merged ``v`` comes back in that dtype, so a fold over more than two parts with keys
    rounds every intermediate to it, which the bound does not charge (found as 2 of 145
    float16 cases over it, ``docs/interfaces.md``): such float16/bfloat16 cases are skipped.
    A part with no key is the state ``(0, −∞)``, whose merge is exact."""

    name = "flashinfer-merge"

    def unsupported(self, target, case, device, grads):
        parts = sum(stop > start for start, stop in itertools.pairwise(InterfaceDraw.edges(case)))
        if parts > 2 and case.dtype in ("float16", "bfloat16"):
            return (
                f"{parts} parts with keys: a fold of merge_state rounds each intermediate "
                f"state to {case.dtype} (the kernel's output dtype), beyond the bound"
            )
        return super().unsupported(target, case, device, grads)

    def merge(self, fn, ys, lses):
        import torch

        S, B = ys.shape[:2]
        y_out, lse_out = [], []
        for b in range(B):
            states = [
                (ys[t, b].transpose(0, 1).contiguous(), (lses[t, b] * LOG2_E).T.contiguous())
                for t in range(S)
            ]
            v, s = states[0]
            for v_t, s_t in states[1:]:
                v, s = fn(v, s, v_t, s_t)
            y_out.append(v.transpose(0, 1))
            lse_out.append(s.transpose(0, 1) / LOG2_E)
        return torch.stack(y_out), torch.stack(lse_out)


class Sinks(Convention):
    """A sink-capable attention ``fn(q, k, v, *, sinks, scale, mask, bias, softcap,
    enable_gqa, empty_rows) -> (y, lse)`` on ``(B, H, n, ·)`` tensors, as
    :func:`exactattn.torch.attention_with_lse` (FA4's ``learnable_sink``, gpt-oss).

    The case's maths has no sink, so the convention gives the target one and takes it out
    again: ``σ_h = δ_h + min_{b,i} lse_{b,h,i}`` with the case's sink offset ``δ_h``
    (:mod:`exactattn.cases.interface_fields`; −2 for a case without the field) and the lse of a
    float64 run; the target's ``(y, lse)`` give the case's as
    ``y·(1 + e^{σ−lse₆₄})`` (``lse₆₄`` from that float64 run: the target's rounded lse would
    move the factor by ``u·|lse|``) and ``lse + log(1 − e^{σ−lse})`` with the target's lse.
    A sink in the numerator, a sink missing from the lse or the wrong head's sink leave an
    error of order ``p_σ``.

    The case's bound has no sink term, so the sink's own rounding is charged as a radius on
    each output (the judge adds it to the bound): :func:`exactattn.error.bounds.sink_bounds` in the
    claim's statistics format, with the float64 run's ``(y, lse)`` and row maxima ``m``, and
    the sink carried through the claimed number of key blocks (one key per block when the
    claim states none), carried to the case's scale: both outputs' errors are multiplied by
    ``1 + e^{σ−lse}`` (``y`` by the rescale; ``lse`` by ``1/(1 − p_σ)``, ``p_σ = e^{σ−lse_σ}``
    the sink's weight in the target's row, which is that factor). To first order the
    target's own sink-free error comes back unchanged (the rescale undoes the sink's
    damping).
    """

    name = "exactattn-sinks"

    def unsupported(self, target, case, device, grads):
        if case.dropout_p or case.score_mod is not None:
            return "the sink convention runs without dropout and user score_mods"
        return None

    def run(self, target, case, held, device, grads):
        import torch

        from .. import api

        fn = target.load()
        B, H = lift(case.batch)
        n = case.sizes
        four = {x: held[x].reshape((B, -1, *held[x].shape[-2:])) for x in "qkv"}
        allowed = case.allowed().reshape((*lift(case.batch), n["n_q"], n["n_k"]))
        bias4 = case.lifted_bias(held["bias"]) if "bias" in held else None
        keywords = dict(
            scale=case.c(),
            mask=allowed,
            bias=bias4,
            softcap=case.softcap,
            enable_gqa=case.group > 1,
            empty_rows="zero",
        )
        y64, stats = api.attention(
            *four.values(), return_stats=True, check_finite=False, **keywords
        )
        finite = np.where(np.isneginf(stats.lse), np.inf, stats.lse)
        offsets = np.full(H, -2.0) if case.sinks is None else np.asarray(case.sinks, np.float64)
        sigma = np.nan_to_num(finite.min(axis=(0, 2)), posinf=0.0) + offsets  # (H,)
        sinks = torch.from_numpy(sigma).to(getattr(torch, case.dtype))
        sigma = sinks.double().numpy()  # the sink as the target holds it
        views = [tensor(four[x], case.dtype, device, case.layout, False) for x in "qkv"]
        as_tensor = {"mask": torch.from_numpy(allowed.copy()).to(device)}
        if bias4 is not None:
            as_tensor["bias"] = torch.from_numpy(bias4.copy()).to(getattr(torch, case.dtype))
        y, lse = fn(
            *views,
            sinks=torch.from_numpy(sigma).to(getattr(torch, case.dtype)),
            **{**keywords, **as_tensor},
        )
        y_np = to_numpy("y", y, (B, H, n["n_q"], n["v"]))
        lse_np = to_numpy("lse", lse, (B, H, n["n_q"]))
        empty = np.isneginf(stats.lse)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # y: through the float64 lse (the target's, rounded, would move p_σ by u·|lse|)
            rescale = 1 + np.exp(sigma[None, :, None] - stats.lse.reshape(lse_np.shape))
            y_case = np.where(empty[..., None], 0.0, y_np * rescale[..., None])
            p_sink = np.exp(sigma[None, :, None] - lse_np)  # the target's own lse, judged
            lse_case = np.where(empty, -np.inf, lse_np + np.log1p(-p_sink))
        radius = _sink_radius(target, case, held, y64, stats, sigma)
        out = {"y": (y_case.reshape(held["g"].shape), radius["y"].reshape(held["g"].shape))}
        out["_dtype"] = dtype_name(y)
        if target.caps.lse is True:
            lse_radius = radius["lse"].reshape(held["g"].shape[:-1])
            out["lse"] = (lse_case.reshape(held["g"].shape[:-1]), lse_radius)
        return out


def _sink_radius(target: Any, case: Case, held, y64, stats, sigma) -> dict[str, np.ndarray]:
    """:func:`exactattn.error.bounds.sink_bounds` of the target's stated claim on the case (its
    compute format; ``steps``: the claimed key blocks + 1; the sink-free pass's lse bound,
    :func:`exactattn.error.bounds.bounds` in the claimed arithmetic), on the case's scale."""
    from ..error.bounds import bounds, sink_bounds

    claim, n_k = target.claim.resolve(case.dtype), case.sizes["n_k"]
    block = claim.bound_block(n_k)
    arith = claim.arith(block)
    u = arith.compute.u
    blocks = n_k if block is None else -(-n_k // max(block, 1))
    free = bounds(
        arith, held["q"], held["k"], held["v"], None,
        scale=case.scale, allowed=case.allowed(), bias=held.get("bias"), softcap=case.softcap,
        enable_gqa=case.group > 1,
    )["lse"]  # fmt: skip
    lse = np.asarray(stats.lse, dtype=np.float64)
    bound = sink_bounds(
        y64, lse, sigma, u, steps=max(1, blocks) + 1, m=stats.m,
        lse_error=free.reshape(lse.shape),
    )  # fmt: skip
    empty = np.isneginf(lse)
    with np.errstate(over="ignore", invalid="ignore"):
        grow = 1 + np.where(empty, 0.0, np.exp(sigma[None, :, None] - np.where(empty, 0.0, lse)))
    return {
        "y": np.where(empty[..., None], 0.0, bound["y"] * grow[..., None]),
        "lse": np.where(empty, 0.0, bound["lse"] * grow),
    }


GQA_HEAD_MULTIPLE = 8  # GroupQueryAttention's head_size rule (group_query_attention_helper.h)


def _returned(name: str, x: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A returned NumPy array as float64, after checking it is an array of ``shape``."""
    if not isinstance(x, np.ndarray):
        raise TargetError(f"{name} is a {type(x).__name__}; expected an array of shape {shape}")
    if x.shape != tuple(shape):
        raise TargetError(f"{name} has shape {x.shape}; expected {tuple(shape)}")
    return x.astype(np.float64)


def _same_cache(name: str, got: np.ndarray, expected: np.ndarray) -> None:
    """A present cache must be the concatenation of the past and the new rows, bit for bit
    (a copy: nothing in it is computed)."""
    if not np.array_equal(got, expected):
        at = tuple(int(i) for i in np.argwhere(~(got == expected))[0])
        raise TargetError(
            f"{name} is not the concatenation of the past and the new rows: entry {at} "
            f"(batch, kv head, position, column) is {float(got[at])!r}, expected "
            f"{float(expected[at])!r}"
        )


def _numpy_dtype(dtype: str) -> Any:
    return {"float64": np.float64, "float32": np.float32, "float16": np.float16}[dtype]


def past_length(case: Case) -> int:
    """The past length ``P`` :class:`OnnxKvcache` splits the case's keys at: a causal mask's
    offset (``is_causal`` sees ``j ≤ i + P``: 0 top-left, ``n_k − n_q`` bottom-right), else
    the start of the last nonempty part of the split-KV boundaries (at most ``n_k − 1``: the
    new part holds a key)."""
    n_q, n_k = case.sizes["n_q"], case.sizes["n_k"]
    align = mask_kinds.causal_alignment(case.mask)
    if align is not None:
        return 0 if align == "top-left" else n_k - n_q
    return max(e for e in InterfaceDraw.edges(case) if e < n_k)


class OnnxKvcache(Convention):
    """ONNX ``Attention`` with a KV cache: ``fn(query, key, value, past_key, past_value,
    attn_mask=None, is_causal=False, scale=None, softcap=None) -> (Y, present_key,
    present_value)`` on NumPy arrays ``(B, H, n, ·)`` in the case's dtype
    (:func:`exactattn.targets.ort_kvcache.ort_attention_kvcache`).

    The case's keys and values split at ``P`` (:func:`past_length`): rows ``j < P`` are
    ``past_key`` / ``past_value``, the others ``key`` / ``value``; the queries are the new
    rows. A causal mask is ``is_causal``, whose offset is the past length (ONNX's
    definition; a bottom-right mask with ``n_q > n_k`` has a negative offset, which no past
    gives); any other mask is a boolean ``attn_mask`` ``(B, H, n_q, n_k)``, a bias the additive
    one (``−∞`` where the mask excludes); the soft-cap is ``softcap``. ``present_key`` and
    ``present_value`` must equal the case's keys and values (the concatenation) exactly, or
    the case fails naming the first entry that differs.
    """

    name = "onnx-kvcache"

    def unsupported(self, target, case, device, grads):
        n = case.sizes
        if case.dtype not in ("float64", "float32", "float16"):
            return f"dtype {case.dtype}: the onnx-kvcache convention passes NumPy arrays"
        if mask_kinds.causal_alignment(case.mask) == "bottom-right" and n["n_q"] > n["n_k"]:
            return (
                "is_causal with a past sees j <= i + past_length: a bottom-right mask with "
                "n_q > n_k has a negative offset (no past)"
            )
        return None

    def run(self, target, case, held, device, grads):
        fn = target.load()
        B, H = lift(case.batch)
        n = case.sizes
        dtype = _numpy_dtype(case.dtype)
        four = {x: held[x].reshape((B, -1, *held[x].shape[-2:])).astype(dtype) for x in "qkv"}
        P = past_length(case)
        kwargs: dict[str, Any] = {"scale": case.scale, "softcap": case.softcap}
        if mask_kinds.causal_alignment(case.mask) is not None:
            kwargs["is_causal"] = True
        elif "bias" in held:
            values = case.lifted_bias(held["bias"])
            kwargs["attn_mask"] = np.where(lifted_allowed(case), values, -np.inf).astype(dtype)
        elif case.masked:
            kwargs["attn_mask"] = lifted_allowed(case).copy()
        k, v = four["k"], four["v"]
        y, present_key, present_value = fn(
            four["q"], k[:, :, P:], v[:, :, P:], k[:, :, :P], v[:, :, :P], **kwargs
        )
        _same_cache("present_key", _returned("present_key", present_key, k.shape), k)
        _same_cache("present_value", _returned("present_value", present_value, v.shape), v)
        out = _returned("y", y, (B, H, n["n_q"], n["v"]))
        return {"y": out.reshape(held["g"].shape), "_dtype": str(y.dtype)}


def gqa_layout(case: Case) -> dict[str, Any] | str:
    """How :class:`OrtGqa` lays the case out: each sequence's total length ``ℓ_b``
    (``lengths``) and ``local_window_size`` (``window``), or why the case is not
    GroupQueryAttention's.

    The kernel is causal at each sequence's own length and its new keys are the query rows:
    a causal / windowed mask aligned bottom-right (or square) with right bound 0 and ``n_q ≤
    n_k`` is ``ℓ_b = n_k`` with ``w = left + 1`` (−1 unbounded: the window holds ``w`` keys,
    the diagonal included); one query row sees every key up to its sequence's length, so
    key padding (the case's ``seqlens`` or a padding mask) with ``n_q = 1`` is ``ℓ_b`` itself."""
    n = case.sizes
    n_q, n_k = n["n_q"], n["n_k"]
    B, _ = lift(case.batch)
    if case.scale == 0:
        return "scale 0 is GroupQueryAttention's 'default' (1/sqrt(head_size))"
    if case.seqlens is not None or mask_kinds.key_lengths(case.mask) is not None:
        lengths, reason = _key_lengths(case, B)
        if reason is not None:
            return reason
        if n_q != 1:
            return "GroupQueryAttention is causal: key padding is expressible for one query row"
        if lengths.min(initial=1) < 1:
            return "a sequence of length 0 is seqlens_k = -1, which GroupQueryAttention rejects"
        return {"lengths": lengths, "window": -1}
    if n_q > n_k:
        return "GroupQueryAttention's new keys are the query rows: it needs n_q <= n_k"
    window = flash_window(case)
    if isinstance(window, str):
        return window.replace("the flash convention", "GroupQueryAttention")
    left, right = window
    if right != 0 and n_q != 1:  # one row at the last key: any right bound is causal
        return "GroupQueryAttention is causal (bottom-right): the mask's right bound must be 0"
    return {"lengths": np.full(B, n_k), "window": -1 if left == -1 else left + 1}


class OrtGqa(Convention):
    """``com.microsoft.GroupQueryAttention``'s interface: ``fn(query, key, value, past_key,
    past_value, seqlens_k, total_sequence_length, *, num_heads, kv_num_heads, scale,
    local_window_size, softcap) -> (output, present_key, present_value)``
    (:func:`exactattn.targets.ort_kvcache.ort_group_query_attention`).

    Per sequence ``b`` of total length ``ℓ_b`` (:func:`gqa_layout`) the ``S = n_q`` new rows
    are keys ``ℓ_b − S ≤ j < ℓ_b`` (``key``, ``value`` ``(B, S, H_kv·D)``; queries ``(B, S,
    H·D)``), the past ``P_b = ℓ_b − S`` rows sit right-padded in a static cache ``past_key``,
    ``past_value`` ``(B, H_kv, max ℓ_b + 1, D)`` (the kernel takes ``total_sequence_length``
    ≤ its length, or equal to it plus ``S``) whose unused slots (one at least) hold NaN, so a
    read past a sequence's past shows; ``seqlens_k = ℓ_b − 1``, ``total_sequence_length = max
    ℓ_b``.
    Head dims are padded with zero columns to ``D``, a multiple of 8 (the kernel's rule;
    exact: the added products are zeros), and the scale is then passed (the default would be
    ``1/√D``); the output is cut back to ``v``. The present caches' first ``ℓ_b`` rows must
    equal the case's keys and values exactly.
    """

    name = "ort-gqa"

    def unsupported(self, target, case, device, grads):
        if case.dtype not in ("float64", "float32", "float16"):
            return f"dtype {case.dtype}: the ort-gqa convention passes NumPy arrays"
        layout = gqa_layout(case)
        return layout if isinstance(layout, str) else None

    def run(self, target, case, held, device, grads):
        fn = target.load()
        layout = gqa_layout(case)
        assert not isinstance(layout, str), layout  # unsupported() said so
        B, H = lift(case.batch)
        n = case.sizes
        S, d, dv = n["n_q"], n["d"], n["v"]
        D = GQA_HEAD_MULTIPLE * -(-max(d, dv) // GQA_HEAD_MULTIPLE)
        dtype = _numpy_dtype(case.dtype)
        four = {x: self._padded(held[x], B, D) for x in "qkv"}
        H_kv = four["k"].shape[1]
        lengths = np.asarray(layout["lengths"], dtype=np.int64)
        past = lengths - S
        M = int(lengths.max()) + 1  # a static cache (total <= M) with a slot no row reaches
        caches = {x: np.full((B, H_kv, M, D), np.nan) for x in "kv"}
        new = {x: np.zeros((B, H_kv, S, D)) for x in "kv"}
        for x in "kv":
            for b in range(B):
                caches[x][b, :, : past[b]] = four[x][b, :, : past[b]]
                new[x][b] = four[x][b, :, past[b] : lengths[b]]
        packed = {
            x: a.transpose(0, 2, 1, 3).reshape(B, S, -1).astype(dtype) for x, a in new.items()
        }
        query = four["q"].transpose(0, 2, 1, 3).reshape(B, S, H * D).astype(dtype)
        scale = case.scale if d == D else case.c()
        output, present_key, present_value = fn(
            query,
            packed["k"],
            packed["v"],
            caches["k"].astype(dtype),
            caches["v"].astype(dtype),
            (lengths - 1).astype(np.int32),
            int(lengths.max()),
            num_heads=H,
            kv_num_heads=H_kv,
            scale=scale,
            local_window_size=int(layout["window"]),
            softcap=case.softcap,
        )
        for name, got, x in (
            ("present_key", present_key, "k"),
            ("present_value", present_value, "v"),
        ):
            got = _returned(name, got, (B, H_kv, M, D))
            for b in range(B):
                keep = slice(0, lengths[b])
                _same_cache(
                    name, got[b : b + 1, :, keep], four[x][b : b + 1, :, keep].astype(dtype)
                )
        y = _returned("output", output, (B, S, H * D)).reshape(B, S, H, D)
        y = y.transpose(0, 2, 1, 3)[..., :dv]
        return {"y": np.ascontiguousarray(y).reshape(held["g"].shape), "_dtype": str(output.dtype)}

    @staticmethod
    def _padded(x: np.ndarray, B: int, D: int) -> np.ndarray:
        """``x`` as ``(B, heads, n, D)``: its columns then zeros."""
        four = x.reshape((B, -1, *x.shape[-2:]))
        out = np.zeros((*four.shape[:-1], D))
        out[..., : four.shape[-1]] = four
        return out


CONVENTIONS = (
    FlashVarlen(),
    FlashKvcache(),
    Fa4Combine(),
    XformersMerge(),
    FlashinferMerge(),
    Sinks(),
    FlashinferPrefill(),
    FlashinferDecode(),
    FlashinferPaged(),
    OnnxKvcache(),
    OrtGqa(),
)
NAMES = tuple(c.name for c in CONVENTIONS)
FORWARD_ONLY = NAMES[1:]  # what they return has no gradient with respect to q, k, v
