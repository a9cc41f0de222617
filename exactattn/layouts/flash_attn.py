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
without effect (the result does not depend on the schedule), rotary dimensions of any even
size (flash-attn wants multiples of 16) and ``cache_leftpad`` with a paged cache too.

Dropout draws its seed ``torch.randint(0, 2**62, (1,))`` from torch's default generator (so
``torch.manual_seed`` makes a run repeatable); its keep-bits ``r_ij`` are exactattn's
(:mod:`exactattn.core.dropout`), not flash-attn's. ``return_attn_probs=True`` with dropout
returns flash-attn's debugging matrix ``S_dmask`` (:func:`attn_probs`) in flash-attn's
encoding, built only then (it is ``(batch, nheads, n_q, n_k)``); without dropout the third
item is ``None``, as flash-attn's.

``flash_attn_with_kvcache`` applies rotary embeddings (:func:`apply_rotary`) to the new keys
at their positions ``cache_seqlens[b] + r`` and to the queries, and reads each sequence's
keys from ``cache_leftpad[b]`` on (:mod:`exactattn.layouts.paged`). It writes the caches last:
a call that raises leaves them as they were. A bad argument raises :class:`FlashAttnError`,
both the ``RuntimeError`` flash-attn raises and the ``ValueError`` the rest of exactattn does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import api
from ..core import algorithm
from ..core.masks import tile_index
from ..infra.optional import needs
from . import paged, varlen

with needs("exactattn.flash_attn (flash-attn's API over exactattn.torch)"):
    import torch

from ..torch.partials import attention_with_lse, merge_partials

SEED_RANGE = 1 << 62
S_DMASK_ROUNDING = 128  # flash-attn rounds S_dmask's seqlen_q and seqlen_k up to multiples of 128


class FlashAttnError(RuntimeError, ValueError):
    """A bad argument of :mod:`exactattn.flash_attn`: flash-attn raises ``RuntimeError`` (its
    ``TORCH_CHECK``), exactattn ``ValueError``; this is both, so either ``except`` catches it."""


def _flash_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with each ``ValueError`` of its checks raised as :class:`FlashAttnError`, the
    same message and traceback."""

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FlashAttnError:
            raise
        except ValueError as error:
            raise FlashAttnError(*error.args).with_traceback(error.__traceback__) from None

    return checked


def _get_block_size_n(device: Any, head_dim: int, is_dropout: bool, is_causal: bool) -> int:
    """The key-block size ``b_n`` in which :func:`attn_probs` writes ``S_dmask``: flash-attn
    2.8's ``flash_attn_interface._get_block_size_n`` on an A100 (sm80), the same signature, so
    code that decodes ``S_dmask`` with flash-attn's helper decodes exactattn's with this one."""
    if head_dim > 256:
        raise FlashAttnError(f"head_dim must be <= 256 (flash-attn's limit); got {head_dim}")
    if head_dim <= 32:
        return 128
    if head_dim <= 64:
        return 64 if is_dropout else 128
    if head_dim <= 96:
        return 64
    if head_dim <= 128:
        return 32 if is_dropout else 64
    return 64


def _round_up(n: int) -> int:
    return -(-n // S_DMASK_ROUNDING) * S_DMASK_ROUNDING


def attn_probs(
    qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, call: dict[str, Any],
    shape: tuple[int, int], block_n: int,
) -> torch.Tensor:  # fmt: skip
    """flash-attn's ``S_dmask`` of one packed call ``(H, total, ·)`` with dropout:
    ``(B, H, n_q', n_k')``, ``n'`` the sizes ``shape`` rounded up to multiples of 128.

    flash-attn's kernel folds a sequence's key blocks ``J_t`` (``b_n`` keys from the
    sequence's first, :func:`_get_block_size_n`) from the last to the first and writes each
    block's unnormalised weights against the running max of the blocks folded so far:

        S[b, h, i', j'] = ±e^{s_ij − M_i^(t)},  M_i^(t) = max_{j ∈ A_i, j ∈ J_t ∪ … ∪ J_T} s_ij,

    local positions ``i', j'`` of sequence ``b``, ``j ∈ J_t``, ``−`` (the sign bit, so
    ``−0.0`` for an excluded pair) where ``r_ij = 0`` (dropped), ``0`` outside the
    sequence. Decoding: ``r_ij = [S ≥ 0]`` and ``p_ij = |S|·e^{M_i^(t) − lse_i}``. The scores
    are the call's own (``s_ij = mod(c·q_i·k_j)``, −∞ off ``A_i``) and ``r_ij`` its keep-bits,
    read one tile at a time; the result is in q's dtype, as flash-attn's.
    """
    prepared = api.prepare_call(qh, kh, vh, **call)
    ctx, geometry, mask, mod = prepared.ctx, prepared.geometry, prepared.mask, prepared.score_mod
    a = prepared.arrays
    q, k, _ = algorithm.grouped(geometry, ctx.compute(a["q"]), ctx.compute(a["k"]), a["v"])
    bh, flat = geometry.batch_head(ctx), geometry.flat_index(ctx)
    cu_q, cu_k = call["mask"].cu_q.tolist(), call["mask"].cu_k.tolist()
    out = qh.new_zeros((len(cu_q) - 1, geometry.heads, *map(_round_up, shape)))
    for b in range(len(cu_q) - 1):
        rows, n_k = range(cu_q[b], cu_q[b + 1]), cu_k[b + 1] - cu_k[b]
        running = ctx.full((*geometry.tile_batch, len(rows)), ctx.neg_inf)  # M_i^(t)
        for start in reversed(range(0, n_k if rows else 0, block_n)):
            cols = range(cu_k[b] + start, cu_k[b] + min(start + block_n, n_k))
            index = tile_index(ctx, geometry, rows, cols, bh)
            scores = algorithm.tile_scores(
                ctx, q[..., cu_q[b] : cu_q[b + 1], :], k[..., cols.start : cols.stop, :],
                prepared.scale, None if mask is None else mask.allowed(index, geometry),
                None if mod is None else mod.at(ctx, index, geometry),
            )  # fmt: skip
            running = ctx.maximum(running, ctx.rowmax(scores))
            weights = ctx.exp_shifted(scores, algorithm.safe_shift(ctx, running))
            keep = prepared.dropout.keep(flat, index.i, index.j)
            block = geometry.merge_heads(torch.where(keep, weights, -weights))
            out[b, :, : len(rows), start : start + len(cols)] = block
    return out


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
                f"{name} is not supported by exactattn.flash_attn (preallocated outputs and "
                f"FA4's varlen combine are out of scope); pass {name}=None"
            )


def _packed(q, k, v, cu_q, cu_k, max_q, max_k, keywords, probs=False) -> tuple[Any, Any, Any]:
    """``(out (total_q, H, d_v), lse (H, total_q), S_dmask)`` of one packed call; ``S_dmask``
    (:func:`attn_probs`) only when ``probs`` asks for it and there is dropout, else None."""
    qh, kh, vh, call = varlen.packed_problem(q, k, v, cu_q, cu_k, max_q, max_k, **keywords)
    y, lse = attention_with_lse(qh, kh, vh, **call)
    s_dmask = None
    if probs and "dropout_p" in call:
        lengths = (np.diff(call["mask"].cu_q), np.diff(call["mask"].cu_k))
        given = (max_q, max_k)
        shape = tuple(int(n.max()) if m is None else int(m) for m, n in zip(given, lengths))
        block_n = _get_block_size_n(q.device, q.shape[-1], True, keywords["causal"])
        with torch.no_grad():
            s_dmask = attn_probs(qh.detach(), kh.detach(), vh.detach(), call, shape, block_n)
    return y.swapaxes(0, 1), lse, s_dmask


def _cu(batch: int, length: int) -> np.ndarray:
    return np.arange(batch + 1, dtype=np.int64) * length


def _dense(q, k, v, keywords, probs=False) -> tuple[Any, Any, Any]:
    """A dense batch ``(B, n, H, d)`` as the packed batch of equal lengths."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(
                f"{name} must be (batch, seqlen, nheads, headdim); got {tuple(x.shape)}"
            )
    batch, n_q, n_k = q.shape[0], q.shape[1], k.shape[1]
    out, lse, s_dmask = _packed(
        q.reshape(batch * n_q, *q.shape[2:]), k.reshape(batch * n_k, *k.shape[2:]),
        v.reshape(batch * n_k, *v.shape[2:]), _cu(batch, n_q), _cu(batch, n_k), n_q, n_k,
        keywords, probs,
    )  # fmt: skip
    out = out.reshape(batch, n_q, *out.shape[1:])
    return out, lse.reshape(-1, batch, n_q).swapaxes(0, 1), s_dmask


@_flash_errors
def flash_attn_func(
    q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
):  # fmt: skip
    """``q (B, n_q, H, d)``, ``k, v (B, n_k, H_kv, d)`` → ``out (B, n_q, H, d)``
    (``(out, softmax_lse (B, H, n_q), S_dmask)`` with ``return_attn_probs``: :func:`attn_probs`
    with dropout, else None)."""
    keywords = _keywords(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes)
    out, lse, s_dmask = _dense(q, k, v, keywords, return_attn_probs)
    return (out, lse, s_dmask) if return_attn_probs else out


@_flash_errors
def flash_attn_kvpacked_func(
    q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
):  # fmt: skip
    """:func:`flash_attn_func` with ``kv (B, n_k, 2, H_kv, d)``."""
    return flash_attn_func(
        q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap,
        alibi_slopes, deterministic, return_attn_probs,
    )  # fmt: skip


@_flash_errors
def flash_attn_qkvpacked_func(
    qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
):  # fmt: skip
    """:func:`flash_attn_func` with ``qkv (B, n, 3, H, d)``."""
    return flash_attn_func(
        qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal,
        window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
    )  # fmt: skip


@_flash_errors
def flash_attn_varlen_func(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
    deterministic=False, return_attn_probs=False, block_table=None,
):  # fmt: skip
    """Packed ``q (total_q, H, d)``, ``k, v (total_k, H_kv, d)`` with ``cu_seqlens`` →
    ``out (total_q, H, d)`` (and ``softmax_lse (H, total_q)``). With ``block_table``, ``k``
    and ``v`` are paged caches ``(num_pages, page_size, H_kv, d)`` and sequence ``s`` reads
    its ``cu_seqlens_k[s+1] − cu_seqlens_k[s]`` keys from its row of the table.
    ``return_attn_probs``: also ``S_dmask`` ``(S, H, max_seqlen_q', max_seqlen_k')``
    (:func:`attn_probs`) with dropout, else None."""
    keywords = _keywords(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes)
    if block_table is not None:
        cu_k = varlen.host_integers("cu_seqlens_k", cu_seqlens_k)
        lengths = np.diff(cu_k)
        k, v, layout = paged.paged_keys(k, v, block_table, lengths, None, None, len(lengths))
        cu_seqlens_k = layout.cu_k
    out, lse, s_dmask = _packed(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, keywords,
        return_attn_probs,
    )  # fmt: skip
    return (out, lse, s_dmask) if return_attn_probs else out


@_flash_errors
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


@_flash_errors
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


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
    interleaved: bool,
) -> torch.Tensor:  # fmt: skip
    """flash-attn's rotary embedding (``flash_attn.layers.rotary.apply_rotary_emb``) of
    ``x (B, n, H, d)``, row ``(b, r)`` at position ``t = positions[b, r]``.

    The first ``R = 2·cos.shape[1]`` dims are rotated in pairs ``(x_a, x_b)`` by the angle
    whose cosine and sine are ``cos[t, u]``, ``sin[t, u]``: ``(x_a cos − x_b sin,
    x_b cos + x_a sin)``, pairs ``(2u, 2u+1)`` when ``interleaved``, else GPT-NeoX's halves
    ``(u, u + R/2)``; dims from ``R`` on pass unchanged. Computed in float32 (at least) and
    rounded once to x's dtype, as flash-attn's kernel does; differentiable in ``x``.
    """
    half = cos.shape[1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    c, s = (t[positions].to(dtype)[:, :, None, :] for t in (cos, sin))  # (B, n, 1, R/2)
    rotary = x[..., : 2 * half].to(dtype)
    if interleaved:
        x_a, x_b = rotary[..., 0::2], rotary[..., 1::2]
        rotated = torch.stack((x_a * c - x_b * s, x_b * c + x_a * s), dim=-1).flatten(-2)
    else:
        x_a, x_b = rotary[..., :half], rotary[..., half:]
        rotated = torch.cat((x_a * c - x_b * s, x_b * c + x_a * s), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., 2 * half :]), dim=-1)


def _rotary_positions(
    rotary_cos, rotary_sin, q, k, lengths: np.ndarray, per_row: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions ``(B, n_new)`` of the new keys, ``cache_seqlens[b] + r``, and ``(B, n_q)``
    of the queries (the same, or ``cache_seqlens[b]`` for every query unless ``per_row``),
    after checking ``rotary_cos``/``rotary_sin`` against them."""
    if rotary_cos is None or rotary_sin is None:
        raise ValueError("give both rotary_cos and rotary_sin (the rotary embedding), or neither")
    if k is None:
        raise ValueError(
            "rotary_cos/rotary_sin rotate the new keys: give k and v to append, or no rotary"
        )
    shape = tuple(rotary_cos.shape)
    if len(shape) != 2 or tuple(rotary_sin.shape) != shape or not 0 < 2 * shape[1] <= q.shape[-1]:
        raise ValueError(
            f"rotary_cos {shape} and rotary_sin {tuple(rotary_sin.shape)} must both be "
            f"(seqlen_ro, rotary_dim / 2) with 0 < rotary_dim <= headdim = {q.shape[-1]}"
        )
    base = torch.as_tensor(lengths, device=rotary_cos.device)[:, None]
    keys = base + torch.arange(k.shape[1], device=rotary_cos.device)
    queries = base + (torch.arange(q.shape[1], device=rotary_cos.device) if per_row else 0)
    queries = queries.expand(q.shape[0], q.shape[1])
    needed = int(lengths.max(initial=0)) + max(k.shape[1], q.shape[1] if per_row else 1)
    if shape[0] < needed:
        raise ValueError(
            f"rotary_cos has {shape[0]} positions but the new keys and queries reach position "
            f"{needed - 1} (cache_seqlens + their index); give at least {needed} rows"
        )
    return keys, queries


def _bounded(window_size, capacity: int) -> bool:
    """flash-attn's ``is_local``: a side of the window below the cache's capacity."""
    return any(0 <= int(side) < capacity for side in window_size)


@_flash_errors
def flash_attn_with_kvcache(
    q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
    cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
    rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
):  # fmt: skip
    """Decode against a KV cache: ``q (B, n_q, H, d)``; ``k_cache, v_cache`` contiguous
    ``(B_cache, n_cache, H_kv, d)`` (rows ``cache_batch_idx``) or paged
    ``(num_pages, page_size, H_kv, d)`` with ``block_table (B, pages)``; ``cache_seqlens``
    the keys already held, ``cache_leftpad (B,)`` where each starts (keys ``cache_leftpad[b]
    ≤ t < cache_seqlens[b]``; default 0). New ``k, v (B, n_new, H_kv, d)`` are written into
    the caches in place at positions ``cache_seqlens[b] + r`` (as flash-attn does) and
    attended to. ``rotary_cos, rotary_sin (seqlen_ro, R/2)``: the new keys are rotated
    (:func:`apply_rotary`, ``rotary_interleaved``) at their positions, and so are the
    queries, at ``cache_seqlens[b] + i`` when causal or local, else all at
    ``cache_seqlens[b]`` (flash-attn's rule). Every check runs before the caches are written.
    Returns ``out (B, n_q, H, d)`` (and ``softmax_lse (B, H, n_q)``)."""
    if q.dim() != 4:
        raise ValueError(f"q must be (batch, seqlen, nheads, headdim); got {tuple(q.shape)}")
    keywords = _keywords(0.0, softmax_scale, causal, window_size, softcap, alibi_slopes)
    batch, n_q = q.shape[0], q.shape[1]
    if rotary_cos is not None or rotary_sin is not None:
        lengths = paged.cache_lengths(k_cache, block_table, cache_seqlens, batch)
        pages = 1 if block_table is None else block_table.shape[1]
        per_row = bool(causal) or _bounded(window_size, pages * k_cache.shape[1])
        keys_at, queries_at = _rotary_positions(rotary_cos, rotary_sin, q, k, lengths, per_row)
        k = apply_rotary(k, rotary_cos, rotary_sin, keys_at, rotary_interleaved)
        q = apply_rotary(q, rotary_cos, rotary_sin, queries_at, rotary_interleaved)
    keys, values, layout = paged.paged_keys(
        k_cache, v_cache, block_table, cache_seqlens, k, v, batch, cache_batch_idx, cache_leftpad
    )
    out, lse, _ = _packed(
        q.reshape(batch * n_q, *q.shape[2:]), keys, values, _cu(batch, n_q), layout.cu_k,
        None, None, keywords,
    )  # fmt: skip
    if k is not None:  # last: a call that raised has written nothing
        rows = torch.as_tensor(layout.written, device=k_cache.device)
        with torch.no_grad():
            k_cache.view(-1, *k_cache.shape[2:])[rows] = k.reshape(-1, *k.shape[2:])
            v_cache.view(-1, *v_cache.shape[2:])[rows] = v.reshape(-1, *v.shape[2:])
    out = out.reshape(batch, n_q, *out.shape[1:])
    lse = lse.reshape(-1, batch, n_q).swapaxes(0, 1)
    return (out, lse) if return_softmax_lse else out


@_flash_errors
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
