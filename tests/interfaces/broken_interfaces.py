"""Targets of the interface conventions: correct adapters and deliberately broken copies.

The correct ones are exactattn's (``exactattn.layouts.flash_attn``) or thin adapters of
:func:`exactattn.torch.merge_partials` to xformers' ``merge_attentions`` and FlashInfer's
``merge_state`` signatures. Each broken copy makes one mistake a real kernel could make;
``exactattn check`` must catch every one (``test_check_conventions.py``), e.g.::

    python -m exactattn.cli check tests.interfaces.broken_interfaces:varlen_wrong_offset \\
        --convention flash-varlen --supports masks=none+causal+window+padding+and,dropout=no
"""

from __future__ import annotations

import torch

import exactattn.torch as et
from exactattn.layouts import flash_attn as fa


# --- correct -------------------------------------------------------------------------------
def xformers_merge_attentions(attn_split, lse_split):
    """xformers' ``merge_attentions``: ``(S, B, M, H, K)``, lse ``(S, B, H, M)`` → merged."""
    parts = [(attn_split[t], lse_split[t].transpose(-1, -2)) for t in range(attn_split.shape[0])]
    y, lse = et.merge_partials(parts)
    return y, lse.transpose(-1, -2)


def flashinfer_merge_state(v_a, s_a, v_b, s_b):
    """FlashInfer's ``merge_state``: ``v (n, H, d)``, ``s (n, H)`` in base 2 → merged."""
    return et.merge_partials([(v_a, s_a), (v_b, s_b)], lse_base=2)


# --- broken --------------------------------------------------------------------------------
def varlen_wrong_offset(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kw):
    """Reads every sequence's keys from one position too far on (where that stays in order)."""
    cu = cu_seqlens_k.clone()
    for s in range(1, len(cu) - 1):
        cu[s] = min(int(cu[s]) + 1, int(cu[s + 1]))
    return fa.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu, max_seqlen_q, max_seqlen_k + 1, **kw
    )


def varlen_equal_q_lengths(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kw):
    """Takes every sequence to have ``cu_seqlens_q[1]`` queries (a batch of equal lengths'
    stride), the last one the rest."""
    total = q.shape[0]
    cu = (torch.arange(len(cu_seqlens_q)) * int(cu_seqlens_q[1])).clamp(max=total)
    cu[-1] = total
    longest = int(cu.diff().max())
    return fa.flash_attn_varlen_func(
        q, k, v, cu.to(cu_seqlens_q), cu_seqlens_k, longest, max_seqlen_k, **kw
    )


def varlen_causal_top_left(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
    softmax_scale=None, softcap=0.0, return_attn_probs=False, **kw,
):  # fmt: skip
    """Aligns a causal mask top-left within each sequence (query ``i'`` sees keys ``j' ≤
    i'``), not bottom-right (``j' ≤ i' + ℓ^k − ℓ^q``)."""
    if not causal:
        return fa.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            softmax_scale=softmax_scale, softcap=softcap,
            return_attn_probs=return_attn_probs, **kw,
        )  # fmt: skip
    seq_q, pos_q = _positions(cu_seqlens_q)
    seq_k, pos_k = _positions(cu_seqlens_k)
    mask = (seq_q[:, None] == seq_k[None, :]) & (pos_k[None, :] <= pos_q[:, None])
    y, lse = et.attention_with_lse(
        *(x.transpose(0, 1)[None] for x in (q, k, v)),
        scale=softmax_scale, mask=mask, softcap=softcap or None,
        enable_gqa=q.shape[1] != k.shape[1], empty_rows="zero",
    )  # fmt: skip
    out = y[0].transpose(0, 1)
    return (out, lse[0], None) if return_attn_probs else out


def _positions(cu):
    """Each packed position's sequence and its position within it."""
    lengths = cu.diff().long()
    seq = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    return seq, torch.arange(int(cu[-1])) - cu.long()[seq]


def kvcache_wrong_page(q, k_cache, v_cache, cache_seqlens=None, block_table=None, **kw):
    """Reads sequence 0's first page from a block no sequence owns (a paged cache)."""
    table = None if block_table is None else block_table.clone()
    unused = (
        []
        if table is None
        else sorted(set(range(k_cache.shape[0])) - set(table.flatten().tolist()))
    )
    if unused:
        table[0, 0] = unused[0]
    return fa.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=table, **kw
    )


def kvcache_append_not_written(q, k_cache, v_cache, k=None, v=None, **kw):
    """Attends to the new keys but never stores them in the caches."""
    return fa.flash_attn_with_kvcache(q, k_cache.clone(), v_cache.clone(), k, v, **kw)


def kvcache_append_in_first_page(
    q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None, **kw
):
    """Writes every appended key into the page its first one falls in (an append that
    crosses a page boundary overwrites that page), then attends to the cache."""
    if k is None or block_table is None or kw.get("rotary_cos") is not None:
        return fa.flash_attn_with_kvcache(
            q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, block_table=block_table, **kw
        )
    size = k_cache.shape[1]
    with torch.no_grad():
        for b, start in enumerate(cache_seqlens.tolist()):
            page = int(block_table[b, start // size])
            for r in range(k.shape[1]):
                k_cache[page, (start + r) % size] = k[b, r]
                v_cache[page, (start + r) % size] = v[b, r]
    return fa.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=cache_seqlens + k.shape[1], block_table=block_table,
        **kw,
    )  # fmt: skip


def kvcache_leftpad_ignored(q, k_cache, v_cache, k=None, v=None, cache_leftpad=None, **kw):
    """Reads every cache row from position 0 (``cache_leftpad`` dropped)."""
    return fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, **kw)


def kvcache_batch_idx_ignored(q, k_cache, v_cache, k=None, v=None, cache_batch_idx=None, **kw):
    """Reads sequence ``b`` from cache row ``b`` (``cache_batch_idx`` dropped)."""
    return fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, **kw)


def kvcache_rotary_halves_only(q, k_cache, v_cache, k=None, v=None, rotary_interleaved=True, **kw):
    """Rotates the pairs ``(u, u + R/2)`` whatever ``rotary_interleaved`` says."""
    return fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_interleaved=False, **kw)


def kvcache_rotary_whole_head(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                              rotary_sin=None, **kw):  # fmt: skip
    """Rotates every dim of the head: a ``rotary_dim < headdim`` table repeated to cover it."""
    if rotary_cos is not None and 2 * rotary_cos.shape[1] < q.shape[-1]:
        half, reps = q.shape[-1] // 2, -(-q.shape[-1] // (2 * rotary_cos.shape[1]))
        rotary_cos, rotary_sin = (x.repeat(1, reps)[:, :half] for x in (rotary_cos, rotary_sin))
    return fa.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos=rotary_cos, rotary_sin=rotary_sin, **kw
    )


def kvcache_queries_at_one_position(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                                    rotary_sin=None, cache_seqlens=None, **kw):  # fmt: skip
    """Rotates every query at ``cache_seqlens`` (the non-causal rule), causal or not."""
    if rotary_cos is None:
        return fa.flash_attn_with_kvcache(
            q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, **kw
        )
    interleaved = kw.pop("rotary_interleaved", True)
    at = cache_seqlens.long()[:, None]
    k = fa.apply_rotary(k, rotary_cos, rotary_sin, at + torch.arange(k.shape[1]), interleaved)
    q = fa.apply_rotary(q, rotary_cos, rotary_sin, at.expand(-1, q.shape[1]), interleaved)
    return fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, **kw)


def combine_without_max(out_partial, lse_partial, **kw):
    """FA4's combine computed as ``Σ e^{lse_t} y_t / Σ e^{lse_t}``: no max subtracted."""
    w = torch.exp(lse_partial.float())
    y = (w[..., None] * out_partial.float()).sum(0) / w.sum(0)[..., None]
    return y.to(out_partial.dtype), torch.log(w.sum(0))


def flashinfer_natural_lse(v_a, s_a, v_b, s_b):
    """FlashInfer's ``merge_state`` reading its base-2 lse as natural."""
    return et.merge_partials([(v_a, s_a), (v_b, s_b)])


def sink_in_numerator(q, k, v, *, sinks, **kw):
    """Attention with sinks whose sink also enters the numerator (its value 1, not 0)."""
    y, lse = et.attention_with_lse(q, k, v, sinks=sinks, **kw)
    p_sink = torch.exp(sinks[None, :, None].to(lse.dtype) - lse)
    return y + p_sink[..., None].to(y.dtype), lse


def sink_gradient_without_minus(q, k, v, *, sinks, **kw):
    """Attention with sinks whose ``dσ`` is ``+Σ p_σ δ`` (the minus sign dropped)."""
    return _with_sink_gradient(q, k, v, sinks, kw, lambda p_sink, lse: p_sink)


def sink_gradient_without_sink_in_l(q, k, v, *, sinks, **kw):
    """Attention with sinks whose ``dσ`` weighs each row by ``e^{σ−m}/ℓ``: the row's sum
    without the sink's own term (the sink-free lse)."""

    def weight(p_sink, lse):
        return -p_sink / (1 - p_sink)

    return _with_sink_gradient(q, k, v, sinks, kw, weight)


def sink_nan_on_empty_rows(q, k, v, *, sinks, **kw):
    """Attention with sinks whose rows with no allowed key are NaN (``0/0``: the sink left
    out of the row's normaliser where no key is)."""
    y, lse = et.attention_with_lse(q, k, v, sinks=sinks, **kw)
    empty = ~kw["mask"].any(-1)
    return y.masked_fill(empty[..., None], float("nan")), lse


class _SinkGradient(torch.autograd.Function):
    """``y`` unchanged forward; backward ``dσ_h = Σ_{b,i} w_i·δ_i`` with ``w`` the given
    weights (the exact one: ``w = −p_σ``), ``δ_i = G_i·y_i``."""

    @staticmethod
    def forward(ctx, y, sinks, weight):
        ctx.save_for_backward(y, weight)
        return y.clone()

    @staticmethod
    def backward(ctx, grad_y):
        y, weight = ctx.saved_tensors
        delta = (grad_y.float() * y.float()).sum(-1)
        return grad_y, (weight * delta).sum((0, 2)), None


def _with_sink_gradient(q, k, v, sinks, kw, weight_of):
    y, lse = et.attention_with_lse(q, k, v, sinks=sinks.detach(), **kw)
    p_sink = torch.exp(sinks.detach()[None, :, None].float() - lse.float())
    y = _SinkGradient.apply(y, sinks, weight_of(p_sink, lse).float())
    return y, lse
