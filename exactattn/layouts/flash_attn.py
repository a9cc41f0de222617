"""flash-attn 2.8's Python interface, exact, on any torch device, with a backward everywhere.

Change ``from flash_attn import flash_attn_func`` to ``from exactattn.flash_attn import
flash_attn_func`` (this module's public name) and the call runs the tiled algorithm (exact
up to one rounding policy: fp16/bf16 inputs keep scores and the summary in float32, as
flash-attn does). Signatures and semantics are flash-attn's
(``flash_attn/flash_attn_interface.py``): layouts
``(batch, seqlen, nheads, headdim)`` and packed ``(total, nheads, headdim)``; ``causal`` and
``window_size=(left, right)`` (``-1``: unbounded) aligned to the bottom-right corner of each
sequence; ``softcap > 0`` caps ``s ↦ cap·tanh(s/cap)``; ``alibi_slopes`` ``(nheads,)`` or
``(batch, nheads)`` adds ``−slope·|i + seqlen_k − seqlen_q − j|``; a query row with no key
gives 0; the lse is natural, ``(batch, nheads, seqlen_q)`` (``(nheads, total_q)`` for varlen),
float32 for half inputs.

Every function is one packed call: a dense batch is the packed batch of equal lengths, a KV
cache (paged or contiguous) is a gather (:mod:`exactattn.layouts.paged`), and the packed batch is
the block-diagonal mask of :mod:`exactattn.layouts.varlen`, run by
:func:`exactattn.torch.partials.attention_with_lse` (differentiable in q, k, v through both
outputs). Differences from flash-attn, all on the permissive side: pages of any size (flash-attn
wants multiples of 256), a backward for ``flash_attn_with_kvcache`` (flash-attn has none;
gradients reach the cache and the new keys), ``deterministic`` and ``num_splits`` accepted and
without effect (the result does not depend on the schedule). ``return_attn_probs=True`` returns
``(out, softmax_lse, None)``: the third item, flash-attn's ``S_dmask`` (its probabilities with
the dropout pattern in the sign bit, a debugging aid), would be an (n_q, n_k) matrix, which this
library never builds. Dropout draws its seed from torch's default generator (so
``torch.manual_seed`` makes a run repeatable); its keep-bits are exactattn's, not flash-attn's.
Rotary embeddings (``rotary_cos``/``rotary_sin``) and ``cache_leftpad`` are not supported: a
``NotImplementedError`` names the argument.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..infra.optional import needs
from . import paged, varlen

with needs("exactattn.flash_attn (flash-attn's API over exactattn.torch)"):
    import torch

from ..torch.partials import attention_with_lse, merge_partials

SEED_RANGE = 1 << 62


def _side(value: Any) -> int | None:
    value = int(value)
    return None if value < 0 else value


def _keywords(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes) -> dict:
    """flash-attn's options as :func:`exactattn.layouts.varlen.packed_problem`'s keywords."""
    if not (isinstance(window_size, (tuple, list, torch.Tensor)) and len(window_size) == 2):
        raise ValueError(f"window_size must be a (left, right) pair; got {window_size!r}")
    keywords: dict[str, Any] = dict(
        causal=bool(causal),
        window=(_side(window_size[0]), _side(window_size[1])),
        alibi_slopes=alibi_slopes,
        check_finite=False,
    )
    if softmax_scale is not None:
        keywords["scale"] = float(softmax_scale)
    if softcap is not None and float(softcap) > 0:
        keywords["softcap"] = float(softcap)
    if dropout_p:
        keywords["dropout_p"] = float(dropout_p)
        keywords["seed"] = int(torch.randint(0, SEED_RANGE, (1,)).item())
    return keywords


def _unsupported(**arguments: Any) -> None:
    for name, value in arguments.items():
        if value is not None:
            raise NotImplementedError(
                f"{name} is not supported by exactattn.flash_attn (rotary embeddings, left "
                f"padding and preallocated outputs are out of scope); pass {name}=None"
            )


def _packed(q, k, v, cu_q, cu_k, max_q, max_k, keywords) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out (total_q, H, d_v), lse (H, total_q))`` of one packed call."""
    qh, kh, vh, call = varlen.packed_problem(q, k, v, cu_q, cu_k, max_q, max_k, **keywords)
    y, lse = attention_with_lse(qh, kh, vh, **call)
    return y.swapaxes(0, 1), lse


def _cu(batch: int, length: int) -> np.ndarray:
    return np.arange(batch + 1, dtype=np.int64) * length


def _dense(q, k, v, keywords) -> tuple[torch.Tensor, torch.Tensor]:
    """A dense batch ``(B, n, H, d)`` as the packed batch of equal lengths."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(
                f"{name} must be (batch, seqlen, nheads, headdim); got {tuple(x.shape)}"
            )
    batch, n_q, n_k = q.shape[0], q.shape[1], k.shape[1]
    out, lse = _packed(
        q.reshape(batch * n_q, *q.shape[2:]), k.reshape(batch * n_k, *k.shape[2:]),
        v.reshape(batch * n_k, *v.shape[2:]), _cu(batch, n_q), _cu(batch, n_k), n_q, n_k,
        keywords,
    )  # fmt: skip
    return out.reshape(batch, n_q, *out.shape[1:]), lse.reshape(-1, batch, n_q).swapaxes(0, 1)


def _result(out, lse, return_lse: bool, probs: bool):
    if not return_lse:
        return out
    return (out, lse, None) if probs else (out, lse)


def flash_attn_func(
    q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
):  # fmt: skip
    """``q (B, n_q, H, d)``, ``k, v (B, n_k, H_kv, d)`` → ``out (B, n_q, H, d)``
    (``(out, softmax_lse (B, H, n_q), None)`` with ``return_attn_probs``)."""
    keywords = _keywords(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes)
    out, lse = _dense(q, k, v, keywords)
    return _result(out, lse, return_attn_probs, True)


def flash_attn_kvpacked_func(
    q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
):  # fmt: skip
    """:func:`flash_attn_func` with ``kv (B, n_k, 2, H_kv, d)``."""
    return flash_attn_func(
        q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap,
        alibi_slopes, deterministic, return_attn_probs,
    )  # fmt: skip


def flash_attn_qkvpacked_func(
    qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
):  # fmt: skip
    """:func:`flash_attn_func` with ``qkv (B, n, 3, H, d)``."""
    return flash_attn_func(
        qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal,
        window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
    )  # fmt: skip


def flash_attn_varlen_func(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
    deterministic=False, return_attn_probs=False, block_table=None,
):  # fmt: skip
    """Packed ``q (total_q, H, d)``, ``k, v (total_k, H_kv, d)`` with ``cu_seqlens`` →
    ``out (total_q, H, d)`` (and ``softmax_lse (H, total_q)``). With ``block_table``, ``k``
    and ``v`` are paged caches ``(num_pages, page_size, H_kv, d)`` and sequence ``s`` reads
    its ``cu_seqlens_k[s+1] − cu_seqlens_k[s]`` keys from its row of the table."""
    keywords = _keywords(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes)
    if block_table is not None:
        cu_k = varlen.host_integers("cu_seqlens_k", cu_seqlens_k)
        lengths = np.diff(cu_k)
        k, v, layout = paged.paged_keys(k, v, block_table, lengths, None, None, len(lengths))
        cu_seqlens_k = layout.cu_k
    out, lse = _packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, keywords)
    return _result(out, lse, return_attn_probs, True)


def flash_attn_varlen_kvpacked_func(
    q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
    deterministic=False, return_attn_probs=False,
):  # fmt: skip
    """:func:`flash_attn_varlen_func` with ``kv (total_k, 2, H_kv, d)``."""
    return flash_attn_varlen_func(
        q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs,
    )  # fmt: skip


def flash_attn_varlen_qkvpacked_func(
    qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
    return_attn_probs=False,
):  # fmt: skip
    """:func:`flash_attn_varlen_func` with ``qkv (total, 3, H, d)`` and one ``cu_seqlens``."""
    return flash_attn_varlen_func(
        qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
        dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs,
    )  # fmt: skip


def flash_attn_with_kvcache(
    q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
    cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
    rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
):  # fmt: skip
    """Decode against a KV cache: ``q (B, n_q, H, d)``; ``k_cache, v_cache`` contiguous
    ``(B_cache, n_cache, H_kv, d)`` (rows ``cache_batch_idx``) or paged
    ``(num_pages, page_size, H_kv, d)`` with ``block_table (B, pages)``; ``cache_seqlens``
    the keys already held. New ``k, v (B, n_new, H_kv, d)`` are written into the caches in
    place at positions ``cache_seqlens[b] + r`` (as flash-attn does) and attended to. Returns
    ``out (B, n_q, H, d)`` (and ``softmax_lse (B, H, n_q)``)."""
    _unsupported(rotary_cos=rotary_cos, rotary_sin=rotary_sin, cache_leftpad=cache_leftpad)
    if q.dim() != 4:
        raise ValueError(f"q must be (batch, seqlen, nheads, headdim); got {tuple(q.shape)}")
    keywords = _keywords(0.0, softmax_scale, causal, window_size, softcap, alibi_slopes)
    batch, n_q = q.shape[0], q.shape[1]
    keys, values, layout = paged.paged_keys(
        k_cache, v_cache, block_table, cache_seqlens, k, v, batch, cache_batch_idx
    )
    if k is not None:
        rows = torch.as_tensor(layout.written, device=k_cache.device)
        with torch.no_grad():
            k_cache.view(-1, *k_cache.shape[2:])[rows] = k.reshape(-1, *k.shape[2:])
            v_cache.view(-1, *v_cache.shape[2:])[rows] = v.reshape(-1, *v.shape[2:])
    out, lse = _packed(
        q.reshape(batch * n_q, *q.shape[2:]), keys, values, _cu(batch, n_q), layout.cu_k,
        None, None, keywords,
    )  # fmt: skip
    out = out.reshape(batch, n_q, *out.shape[1:])
    return _result(out, lse.reshape(-1, batch, n_q).swapaxes(0, 1), return_softmax_lse, False)


def flash_attn_combine(
    out_partial, lse_partial, out=None, out_dtype=None, cu_seqlens=None, seqused=None,
    virtual_batch_idx=None, return_lse=True,
):  # fmt: skip
    """FA4's combine of split-KV partials (``flash_attn.cute.flash_attn_combine``), exact:
    ``out_partial (num_splits, B, n, H, d)`` (or ``(num_splits, total_q, H, d)``) and
    ``lse_partial (num_splits, B, n, H)`` (natural log) → ``(out (B, n, H, d), lse
    (B, n, H))``, the fold of ⋆ (:func:`exactattn.core.merge.merge_partials`); differentiable."""
    _unsupported(out=out, cu_seqlens=cu_seqlens, seqused=seqused,
                 virtual_batch_idx=virtual_batch_idx)  # fmt: skip
    if out_partial.dim() not in (4, 5) or tuple(lse_partial.shape) != tuple(out_partial.shape[:-1]):
        raise ValueError(
            f"out_partial {tuple(out_partial.shape)} and lse_partial {tuple(lse_partial.shape)}: "
            "give (num_splits, batch, seqlen, heads, dim) and (num_splits, batch, seqlen, heads)"
        )
    partials = [(out_partial[t], lse_partial[t]) for t in range(out_partial.shape[0])]
    y, lse = merge_partials(partials)
    y = y.to(out_dtype or out_partial.dtype)
    return (y, lse) if return_lse else (y, None)
