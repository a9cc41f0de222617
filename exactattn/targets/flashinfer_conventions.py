"""FlashInfer's calling conventions: ``flashinfer-prefill``, ``flashinfer-decode``,
``flashinfer-paged`` and the merge ``flashinfer-merge``, over the interface conventions'
machinery (:mod:`.interface_conventions`: the case's pages, splits and key lengths).

FlashInfer's lse is in base 2 throughout (``lse₂ = m₂ + log₂ ℓ`` over the scores
``c·s·log₂e``), so each convention converts: ``lse = lse₂ / log₂e``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ..cases import Case
from .conventions import (
    dtype_name,
    lift,
    lifted_allowed,
    tensor,
    to_numpy,
    torch_dtype,
)
from .interface_conventions import (
    FlashBase,
    InterfaceDraw,
    MergeBase,
    key_lengths,
    paged_caches,
    sequences,
    to_bnhd,
    window_of,
)

LOG2_E = 1 / math.log(2)


class _Flashinfer(FlashBase):
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
        if reason is None and window_of(case)[1] > 0:  # type: ignore[index]
            return "FlashInfer bounds a window on the left only (window_left; right: causal)"
        return reason

    @staticmethod
    def keywords(case: Case, window: tuple[int, int] | None = None) -> dict[str, Any]:
        left, right = window or window_of(case)  # type: ignore[misc]
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
    logits_soft_cap=, return_lse=)`` once per batch element (request), on its real queries
    and keys only (:func:`~.interface_conventions.sequences`: a varlen batch's or a ragged
    batch's own query and key lengths, causal and windows aligned bottom-right within each
    request, as FlashInfer aligns them; a request's padded rows come back as rows with no
    key, ``Y = 0``, ``lse = −∞``); any other mask the same for every head as its
    ``custom_mask`` ``(n_q, n_k)`` (True = attend)."""

    name = "flashinfer-prefill"
    reads = ("seqlens",)
    ragged = True  # each request's own query length ...
    expresses = ("query_padding",)  # ... is its query padding

    def unsupported(self, target, case, device, grads):
        if case.seqlens is not None or case.q_seqlens is not None:
            if case.bias is not None:
                return "FlashInfer takes no bias (its ALiBi is pos_encoding_mode's own slopes)"
            layout = sequences(case, lift(case.batch)[0])
            if isinstance(layout, str):
                return layout
            if layout.window[1] > 0:
                return "FlashInfer bounds a window on the left only (window_left; right: causal)"
            return None
        reason = super().unsupported(target, case, device, grads)
        if reason is None or case.bias is not None or not self._custom(case):
            return reason
        allowed = lifted_allowed(case)
        if not (allowed == allowed[:, :1]).all():
            return f"{reason}; custom_mask is one (n_q, n_k) mask for every head"
        return None

    @staticmethod
    def _custom(case: Case) -> bool:
        """Whether the mask goes as ``custom_mask`` (not causal / window / lengths)."""
        if case.seqlens is not None or case.q_seqlens is not None:
            return False
        window = window_of(case)
        return isinstance(window, str) or window[1] > 0

    def run(self, target, case, held, device, grads):
        fn = target.load()
        B, H = lift(case.batch)
        n = case.sizes
        bnhd = to_bnhd(held, B)
        want_lse = target.caps.lse is True
        if self._custom(case):
            import torch

            q_lengths, k_lengths = [n["n_q"]] * B, key_lengths(case, B)[0]
            allowed = torch.from_numpy(lifted_allowed(case)[:, 0].copy()).to(device)
            keywords = {"sm_scale": case.c(), "logits_soft_cap": case.softcap}
            masks = [{"custom_mask": allowed[b], **keywords} for b in range(B)]
        else:
            layout = sequences(case, B)
            assert not isinstance(layout, str)  # unsupported() said so
            q_lengths, k_lengths = layout.q, layout.k
            masks = [self.keywords(case, layout.window)] * B
        y = np.zeros((B, n["n_q"], H, n["v"]))
        lse = np.full((B, n["n_q"], H), -np.inf)
        dtype = case.dtype
        for b in range(B):
            lq, lk = int(q_lengths[b]), int(k_lengths[b])
            if lq == 0:  # a request without queries: nothing to call
                continue
            parts = (bnhd["q"][b, :lq], bnhd["k"][b, :lk], bnhd["v"][b, :lk])
            views = [tensor(x, case.dtype, device, case.layout, False) for x in parts]
            result = fn(*views, return_lse=want_lse, **masks[b])
            out = result[0] if want_lse else result
            y[b, :lq] = to_numpy("y", out, (lq, H, n["v"]))
            dtype = dtype_name(out)
            if want_lse:
                lse[b, :lq] = to_numpy("lse", result[1], (lq, H))
        return self.outputs(held, y, lse if want_lse else None, dtype)


class FlashinferDecode(_Flashinfer):
    """``single_decode_with_kv_cache(q (H, d), k, v, window_left=, sm_scale=,
    logits_soft_cap=, return_lse=)`` once per query row, as the decode steps of a KV cache:
    row ``i`` of a causal case is the step whose cache holds keys ``0..i + n_k − n_q`` (the
    query sits at the last key, as decode's window counts back from it); without causal
    every row reads all ``ℓ_b`` real keys. A window without causal is no decode step."""

    name = "flashinfer-decode"
    reads = ("seqlens",)

    def unsupported(self, target, case, device, grads):
        reason = super().unsupported(target, case, device, grads)
        if reason is None:
            left, right = window_of(case)  # type: ignore[misc]
            if left >= 0 and right != 0:
                return "a decode step's window counts back from its last key: causal only"
        return reason

    def run(self, target, case, held, device, grads):
        fn = target.load()
        B, H = lift(case.batch)
        n = case.sizes
        bnhd = to_bnhd(held, B)
        lengths, _ = key_lengths(case, B)
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
    reads = ("seqlens", "pages")

    def run(self, target, case, held, device, grads):
        import torch

        wrapper_class = target.load()
        B, H = lift(case.batch)
        n = case.sizes
        bnhd = to_bnhd(held, B)
        lengths, _ = key_lengths(case, B)
        pages = InterfaceDraw.pages(case, B)
        size, table = pages["size"], np.asarray(pages["table"])
        caches = paged_caches(case, bnhd, pages, device)
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


class FlashinferMerge(MergeBase):
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
