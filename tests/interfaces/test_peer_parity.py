"""Parity with each peer's documented semantics, forward and gradients, float64 to rounding.

Each spec is the peer's own reference formula, rewritten here in float64 torch (so torch's
autograd differentiates it), never exactattn:

* flash-attn 2.8, ``tests/test_flash_attn.py``: ``attention_ref`` with
  ``construct_local_mask`` and ``attn_bias_from_alibi_slopes`` (causal and windows aligned
  bottom-right to each sequence's own lengths ``sk − sq``; padded queries give 0), the
  varlen functions compared on the padded layout the test unpads, and
  ``flash_attn_with_kvcache`` with a paged cache gathered as the test gathers it
  (``k_cache_paged[block_table.flatten()]``) and new keys appended at ``cache_seqlens``;
* xformers, ``benchmarks/benchmark_merge_attentions.py``: ``_merge_attentions_varargs_ref``
  (``attn (S, B, M, G, H, K)``, ``lse (S, B, G, H, M)``: max, exp, weighted sum, ``max +
  log Σ``);
* FlashInfer, ``flashinfer/trace/templates/cascade.py``: ``_merge_state_reference`` and
  ``_merge_states_reference`` (lse in base 2: multiplied by ``ln 2`` in, divided out);
* gpt-oss, ``gpt_oss/torch/model.py``: ``sdpa(Q, K, V, S, sm_scale, sliding_window)``
  (``Q (T, H_kv, q_mult, d)``; the sink column concatenated, softmax, dropped; the window
  keeps ``i − W < j ≤ i``).

Where a peer's reference is undefined (a row with no key: NaN from ``softmax`` of
``−∞``), exactattn's documented value (0, lse −∞ or the sink) is not compared here.
"""

from __future__ import annotations

import math

import pytest

from tests.optional import requires

torch = requires("torch")

import exactattn.torch as et
from exactattn.core import masks
from exactattn.layouts import flash_attn as fa

F64 = torch.float64
ATOL = 1e-12


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _grads(out, leaves, g):
    return torch.autograd.grad(out, leaves, g, allow_unused=True)


# --- flash-attn: attention_ref ----------------------------------------------------------------
def local_mask(seqlen_q, seqlen_k, window, sk, sq):
    """flash-attn's ``construct_local_mask`` (True = masked out); ``sk, sq (B, 1, 1, 1)``."""
    row = torch.arange(seqlen_q)[:, None]
    col = torch.arange(seqlen_k)
    if window[0] < 0:
        return col > row + sk - sq + window[1]
    return torch.logical_or(
        col > torch.minimum(row + sk - sq + window[1], sk), col < row + sk - sq - window[0]
    )


def attention_ref(q, k, v, q_pad, k_pad, causal, window, softcap, slopes):
    """flash-attn's ``attention_ref`` (upcast, no dropout): ``q (B, Sq, H, d)``."""
    if causal:
        window = (window[0], 0)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    g = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q / math.sqrt(q.shape[-1]), k)
    if softcap > 0:
        scores = (scores / softcap).tanh() * softcap
    scores = scores.masked_fill(~k_pad[:, None, None, :], -math.inf)
    sk = k_pad.sum(-1)[:, None, None, None]
    sq = q_pad.sum(-1)[:, None, None, None]
    local = None
    if window[0] >= 0 or window[1] >= 0:
        local = local_mask(seqlen_q, seqlen_k, window, sk, sq)
        scores = scores.masked_fill(local, -math.inf)
    if slopes is not None:  # attn_bias_from_alibi_slopes with the padding masks
        row, col = torch.arange(seqlen_q)[:, None], torch.arange(seqlen_k)
        scores = scores - slopes[:, :, None, None] * torch.abs(row + sk - sq - col)
    attention = torch.softmax(scores, dim=-1)
    if local is not None:
        attention = attention.masked_fill(local.all(dim=-1, keepdim=True), 0.0)
    attention = attention.masked_fill(~q_pad[:, None, :, None], 0.0)
    out = torch.einsum("bhts,bshd->bthd", attention, v)
    return out.masked_fill(~q_pad[:, :, None, None], 0.0)


CASES = [  # causal, window, softcap, alibi
    (False, (-1, -1), 0.0, False),
    (True, (-1, -1), 0.0, False),
    (False, (3, 2), 0.0, False),
    (True, (4, -1), 5.0, False),
    (False, (-1, -1), 0.0, True),
    (True, (-1, -1), 3.0, True),
]


@pytest.mark.parametrize(("causal", "window", "softcap", "alibi"), CASES)
def test_flash_attn_varlen_equals_attention_ref(causal, window, softcap, alibi):
    gen = _gen(1)
    lens_q, lens_k = [5, 1, 9], [7, 12, 9]  # n_q != n_k, n_q > n_k is avoided by causal ref
    B, H, H_kv, d = 3, 4, 2, 8
    Sq, Sk = max(lens_q), max(lens_k)
    q = torch.randn(B, Sq, H, d, generator=gen, dtype=F64)
    k, v = (torch.randn(B, Sk, H_kv, d, generator=gen, dtype=F64) for _ in "kv")
    q_pad = torch.arange(Sq)[None] < torch.tensor(lens_q)[:, None]
    k_pad = torch.arange(Sk)[None] < torch.tensor(lens_k)[:, None]
    slopes = torch.rand(B, H, generator=gen, dtype=F64) if alibi else None
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = attention_ref(*leaves, q_pad, k_pad, causal, window, softcap, slopes)
    # the test's unpadding: the real rows of each sequence, packed
    packed = [x[pad] for x, pad in zip(leaves, (q_pad, k_pad, k_pad))]
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    out = fa.flash_attn_varlen_func(
        *packed, cu_q, cu_k, Sq, Sk, causal=causal, window_size=window, softcap=softcap,
        alibi_slopes=slopes,
    )  # fmt: skip
    torch.testing.assert_close(out, ref[q_pad], rtol=0, atol=ATOL)
    g = torch.randn(out.shape, generator=gen, dtype=F64)
    g_pad = torch.zeros(ref.shape, dtype=F64)
    g_pad[q_pad] = g
    for name, a, b in zip("qkv", _grads(out, leaves, g), _grads(ref, leaves, g_pad)):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL, msg=f"d{name}")


@pytest.mark.parametrize(("causal", "window", "softcap", "alibi"), CASES)
def test_flash_attn_with_kvcache_equals_attention_ref(causal, window, softcap, alibi):
    gen = _gen(2)
    B, H, H_kv, d, size, per = 3, 4, 2, 8, 3, 5  # pages of 3 (not 256's multiple), 5 a sequence
    Sq, new = 2, 2
    cache_seqlens = torch.tensor([4, 11, 0], dtype=torch.int32)  # then +new each
    pool = B * per + 1
    table = torch.randperm(pool, generator=gen)[: B * per].reshape(B, per).to(torch.int32)
    k_cache, v_cache = (torch.randn(pool, size, H_kv, d, generator=gen, dtype=F64) for _ in "kv")
    q = torch.randn(B, Sq, H, d, generator=gen, dtype=F64)
    k_new, v_new = (torch.randn(B, new, H_kv, d, generator=gen, dtype=F64) for _ in "kv")
    slopes = torch.rand(B, H, generator=gen, dtype=F64) if alibi else None
    # the reference: the paged cache gathered as flash-attn's test gathers it, new keys placed
    # at cache_seqlens, keys beyond cache_seqlens + new masked (key_padding_mask)
    leaves = [x.clone().requires_grad_() for x in (q, k_cache, v_cache, k_new, v_new)]
    lens = cache_seqlens.long() + new
    gathered = []
    for cache, fresh in ((leaves[1], leaves[3]), (leaves[2], leaves[4])):
        full = cache[table.flatten().long()].reshape(B, per * size, H_kv, d)
        pos = torch.arange(per * size)[None, :, None, None]
        start = cache_seqlens.long()[:, None, None, None]
        placed = torch.zeros_like(full)
        for t in range(new):
            placed = torch.where(pos == start + t, fresh[:, t : t + 1], placed)
        is_new = (pos >= start) & (pos < start + new)
        gathered.append(torch.where(is_new, placed, full))
    k_pad = torch.arange(per * size)[None] < lens[:, None]
    q_pad = torch.ones(B, Sq, dtype=torch.bool)
    ref = attention_ref(leaves[0], *gathered, q_pad, k_pad, causal, window, softcap, slopes)
    mine = [x.detach().clone().requires_grad_() for x in leaves]
    k_c, v_c = (x.detach().clone() for x in mine[1:3])  # written in place: keep the leaves
    out = fa.flash_attn_with_kvcache(
        mine[0], k_c, v_c, mine[3], mine[4], cache_seqlens=cache_seqlens.clone(),
        block_table=table, causal=causal, window_size=window, softcap=softcap,
        alibi_slopes=slopes,
    )  # fmt: skip
    torch.testing.assert_close(out, ref, rtol=0, atol=ATOL)
    g = torch.randn(out.shape, generator=gen, dtype=F64)
    for name, a, b in zip(
        ("dq", "dk_new", "dv_new"),
        _grads(out, [mine[0], mine[3], mine[4]], g),
        _grads(ref, [leaves[0], leaves[3], leaves[4]], g),
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL, msg=name)


# --- xformers: merge_attentions ----------------------------------------------------------------
def xformers_merge_ref(attn_split, lse_split):
    """``_merge_attentions_varargs_ref``: ``attn (S, B, M, G, H, K)``, ``lse (S, B, G, H, M)``."""
    lse = lse_split[..., None].moveaxis(4, 2)  # (S, B, M, G, H, 1)
    lse_max, _ = torch.max(lse, dim=0)
    sumexp = torch.exp(lse - lse_max)
    denominator = sumexp.sum(dim=0)
    attn = (sumexp * attn_split).sum(dim=0) / denominator
    lse_out = (lse_max + torch.log(denominator)).squeeze(4).permute(0, 2, 3, 1)
    return attn, lse_out


def test_xformers_merge_attentions_semantics():
    gen = _gen(3)
    S, B, M, G, H, K = 4, 2, 5, 2, 3, 6
    attn = torch.randn(S, B, M, G, H, K, generator=gen, dtype=F64)
    lse = 4 * torch.randn(S, B, G, H, M, generator=gen, dtype=F64)
    leaves = [attn.clone().requires_grad_(), lse.clone().requires_grad_()]
    ref = xformers_merge_ref(*leaves)
    mine = [attn.clone().requires_grad_(), lse.clone().requires_grad_()]
    # exactattn's merge on the same partials: rows (B, M, G, H), lse moved to their layout
    parts = [(mine[0][t], mine[1][t].permute(0, 3, 1, 2)) for t in range(S)]
    y, lse_out = et.merge_partials(parts)
    torch.testing.assert_close(y, ref[0], rtol=0, atol=ATOL)
    torch.testing.assert_close(lse_out.permute(0, 2, 3, 1), ref[1], rtol=0, atol=ATOL)
    gy = torch.randn(y.shape, generator=gen, dtype=F64)
    gl = torch.randn(ref[1].shape, generator=gen, dtype=F64)
    got = _grads((y, lse_out.permute(0, 2, 3, 1)), mine, (gy, gl))
    want = _grads(ref, leaves, (gy, gl))
    for name, a, b in zip(("d attn", "d lse"), got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL, msg=name)


# --- FlashInfer: merge_state / merge_states (base-2 lse) --------------------------------------
def flashinfer_merge_state_ref(v_a, s_a, v_b, s_b):
    """``_merge_state_reference`` (float64 here, not float32): ``v (n, H, d)``, ``s (n, H)``."""
    s_a, s_b = s_a * math.log(2.0), s_b * math.log(2.0)
    s_max = torch.maximum(s_a, s_b)
    exp_a, exp_b = torch.exp(s_a - s_max), torch.exp(s_b - s_max)
    exp_sum = exp_a + exp_b
    v = (v_a * exp_a.unsqueeze(-1) + v_b * exp_b.unsqueeze(-1)) / exp_sum.unsqueeze(-1)
    return v, (s_max + torch.log(exp_sum)) / math.log(2.0)


def flashinfer_merge_states_ref(v, s):
    """``_merge_states_reference``: ``v (n, S, H, d)``, ``s (n, S, H)`` in base 2."""
    s_nat = s * math.log(2.0)
    s_max, _ = s_nat.max(dim=1, keepdim=True)
    exp_s = torch.exp(s_nat - s_max)
    exp_sum = exp_s.sum(dim=1, keepdim=True)
    merged = (v * (exp_s / exp_sum).unsqueeze(-1)).sum(dim=1)
    return merged, (s_max.squeeze(1) + torch.log(exp_sum.squeeze(1))) / math.log(2.0)


def test_flashinfer_merge_state_semantics():
    gen = _gen(4)
    n, H, d = 7, 3, 5
    inputs = [
        torch.randn(n, H, d, generator=gen, dtype=F64),
        6 * torch.randn(n, H, generator=gen, dtype=F64),
        torch.randn(n, H, d, generator=gen, dtype=F64),
        6 * torch.randn(n, H, generator=gen, dtype=F64),
    ]
    leaves = [x.clone().requires_grad_() for x in inputs]
    ref = flashinfer_merge_state_ref(*leaves)
    mine = [x.clone().requires_grad_() for x in inputs]
    got = et.merge_partials([(mine[0], mine[1]), (mine[2], mine[3])], lse_base=2)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL)
    g = (
        torch.randn(n, H, d, generator=gen, dtype=F64),
        torch.randn(n, H, generator=gen, dtype=F64),
    )
    for a, b in zip(_grads(got, mine, g), _grads(ref, leaves, g)):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL)
    # reading the base-2 lse as natural is another merge: the parity above can fail
    natural = et.merge_partials([(inputs[0], inputs[1]), (inputs[2], inputs[3])])
    assert (natural[0] - ref[0].detach()).abs().max() > 1e-3


def test_flashinfer_merge_states_semantics():
    gen = _gen(5)
    n, S, H, d = 6, 4, 2, 5
    v = torch.randn(n, S, H, d, generator=gen, dtype=F64)
    s = 5 * torch.randn(n, S, H, generator=gen, dtype=F64)
    leaves = [v.clone().requires_grad_(), s.clone().requires_grad_()]
    ref = flashinfer_merge_states_ref(*leaves)
    mine = [v.clone().requires_grad_(), s.clone().requires_grad_()]
    got = et.merge_partials([(mine[0][:, t], mine[1][:, t]) for t in range(S)], lse_base=2)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL)
    g = (
        torch.randn(n, H, d, generator=gen, dtype=F64),
        torch.randn(n, H, generator=gen, dtype=F64),
    )
    for a, b in zip(_grads(got, mine, g), _grads(ref, leaves, g)):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL)


# --- gpt-oss: sdpa with sinks -----------------------------------------------------------------
def gpt_oss_sdpa(Q, K, V, S, sm_scale, sliding_window=0):
    """gpt-oss's ``sdpa``: ``Q (T, H_kv, q_mult, d)``, ``K, V (T, H_kv, d)``, ``S (H,)``."""
    n_tokens, n_heads, q_mult, _ = Q.shape
    K = K[:, :, None, :].expand(-1, -1, q_mult, -1)
    V = V[:, :, None, :].expand(-1, -1, q_mult, -1)
    S = S.reshape(n_heads, q_mult, 1, 1).expand(-1, -1, n_tokens, -1)
    mask = torch.triu(Q.new_full((n_tokens, n_tokens), -float("inf")), diagonal=1)
    if sliding_window > 0:
        mask = mask + torch.tril(
            mask.new_full((n_tokens, n_tokens), -float("inf")), diagonal=-sliding_window
        )
    QK = torch.einsum("qhmd,khmd->hmqk", Q, K) * sm_scale + mask[None, None, :, :]
    W = torch.softmax(torch.cat([QK, S], dim=-1), dim=-1)[..., :-1]
    return torch.einsum("hmqk,khmd->qhmd", W, V).reshape(n_tokens, -1)


@pytest.mark.parametrize("sliding_window", [0, 4])
def test_gpt_oss_sinks_semantics(sliding_window):
    gen = _gen(6)
    T, H_kv, q_mult, d = 300, 2, 3, 8  # T = 300: two key blocks of 256
    Q = torch.randn(T, H_kv, q_mult, d, generator=gen, dtype=F64)
    K, V = (torch.randn(T, H_kv, d, generator=gen, dtype=F64) for _ in "kv")
    S = 2 * torch.randn(H_kv * q_mult, generator=gen, dtype=F64)
    leaves = [x.clone().requires_grad_() for x in (Q, K, V, S)]
    ref = gpt_oss_sdpa(*leaves, 0.3, sliding_window)
    mine = [x.clone().requires_grad_() for x in (Q, K, V, S)]
    q = mine[0].reshape(T, H_kv * q_mult, d).transpose(0, 1)  # (H, T, d): head h = kv·q_mult + m
    k, v = (x.transpose(0, 1) for x in mine[1:3])
    mask = masks.causal()
    if sliding_window:
        mask = masks.sliding_window(sliding_window - 1, 0)
    y = et.attention(q, k, v, sinks=mine[3], scale=0.3, mask=mask, enable_gqa=True)
    out = y.transpose(0, 1).reshape(T, -1)
    torch.testing.assert_close(out, ref, rtol=0, atol=ATOL)
    g = torch.randn(out.shape, generator=gen, dtype=F64)
    for name, a, b in zip(("dQ", "dK", "dV", "dS"), _grads(out, mine, g), _grads(ref, leaves, g)):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL, msg=name)
