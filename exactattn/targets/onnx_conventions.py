"""ONNX Runtime's KV-cache calling conventions: ``onnx-kvcache`` (the ONNX ``Attention``
operator with ``past_key`` / ``past_value``) and ``ort-gqa`` (``com.microsoft.
GroupQueryAttention``), over the interface conventions' machinery (:mod:`.interface_conventions`:
the case's split-KV boundaries and key lengths); the targets are :mod:`.ort_kvcache`'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cases import Case, mask_kinds
from .conventions import (
    Convention,
    TargetError,
    flash_window,
    lift,
    lifted_allowed,
)
from .interface_conventions import (
    InterfaceDraw,
    key_lengths,
)

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
    reads = ("splits",)  # the past length: the last split

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
        lengths, reason = key_lengths(case, B)
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
    reads = ("seqlens",)

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
