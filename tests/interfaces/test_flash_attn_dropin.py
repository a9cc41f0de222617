"""exactattn.layouts.flash_attn: flash-attn 2.8's functions against per-sequence attention."""

from __future__ import annotations

import numpy as np
import pytest

from tests.optional import requires

torch = requires("torch")

from exactattn.layouts import flash_attn as fa

from . import spec


def _t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


def test_dense_causal_window_softcap_alibi_with_lse():
    rng = np.random.default_rng(0)
    q, k, v = (
        rng.normal(size=(2, 5, 4, 3)),
        rng.normal(size=(2, 7, 2, 3)),
        rng.normal(size=(2, 7, 2, 3)),
    )
    slopes = rng.uniform(0, 1, size=(2, 4))
    out, lse, probs = fa.flash_attn_func(
        _t(q), _t(k), _t(v), causal=True, window_size=(3, -1), softcap=2.0,
        alibi_slopes=torch.tensor(slopes), return_attn_probs=True,
    )  # fmt: skip
    assert probs is None
    for b in range(2):
        y_ref, lse_ref = spec.varlen(
            q[b], k[b], v[b], [0, 5], [0, 7], causal=True, left=3, softcap=2.0, slopes=slopes[b]
        )
        np.testing.assert_allclose(out[b].numpy(), y_ref, atol=1e-14)
        np.testing.assert_allclose(lse[b].numpy(), lse_ref, atol=1e-13)


def test_varlen_and_packed_variants_agree():
    rng = np.random.default_rng(1)
    cu = np.array([0, 3, 3, 8])
    qkv = _t(rng.normal(size=(8, 3, 2, 4)))
    out = fa.flash_attn_varlen_qkvpacked_func(
        qkv, torch.tensor(cu, dtype=torch.int32), 5, causal=True
    )
    y_ref, _ = spec.varlen(*(qkv[:, r].detach().numpy() for r in range(3)), cu, cu, causal=True)
    np.testing.assert_allclose(out.detach().numpy(), y_ref, atol=1e-14)
    kv = qkv[:, 1:]
    out_kv = fa.flash_attn_varlen_kvpacked_func(qkv[:, 0], kv, cu, cu, 5, 5, causal=True)
    assert torch.equal(out_kv, out)


def test_kvcache_writes_new_keys_in_place_and_pages_of_any_size():
    rng = np.random.default_rng(2)
    page, pages, batch = 3, 8, 2
    k_cache, v_cache = (
        _t(rng.normal(size=(pages, page, 1, 4))),
        _t(rng.normal(size=(pages, page, 1, 4))),
    )
    table = torch.tensor([[6, 2, 0], [1, 5, 3]], dtype=torch.int32)
    seqlens = torch.tensor([4, 2], dtype=torch.int32)
    k_new, v_new = _t(rng.normal(size=(batch, 2, 1, 4))), _t(rng.normal(size=(batch, 2, 1, 4)))
    before_k = k_cache.clone().numpy()
    q = _t(rng.normal(size=(batch, 2, 2, 4)))
    out, lse = fa.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, block_table=table,
        causal=True, return_softmax_lse=True,
    )  # fmt: skip
    for b in range(batch):
        n = int(seqlens[b])
        for r in range(2):  # written where position n + r lives
            t = n + r
            np.testing.assert_array_equal(
                k_cache[table[b, t // page], t % page].numpy(), k_new[b, r].detach().numpy()
            )
        keys = np.concatenate(
            [spec.paged_sequence(before_k, table[b].numpy(), n), k_new[b].detach().numpy()]
        )
        values = spec.paged_sequence(v_cache.detach().numpy(), table[b].numpy(), n + 2)
        y_ref, lse_ref = spec.varlen(
            q[b].detach().numpy(), keys, values, [0, 2], [0, n + 2], causal=True
        )
        np.testing.assert_allclose(out[b].detach().numpy(), y_ref, atol=1e-14)
        np.testing.assert_allclose(lse[b].numpy(), lse_ref, atol=1e-13)


def test_kvcache_has_a_backward_into_the_cache_and_the_new_keys():
    rng = np.random.default_rng(3)
    k_cache, v_cache = (
        _t(rng.normal(size=(2, 5, 1, 3)), True),
        _t(rng.normal(size=(2, 5, 1, 3)), True),
    )
    k_new, v_new = _t(rng.normal(size=(2, 1, 1, 3)), True), _t(rng.normal(size=(2, 1, 1, 3)), True)
    q = _t(rng.normal(size=(2, 1, 2, 3)), True)

    def run(q, k_cache, v_cache, k_new, v_new):
        return fa.flash_attn_with_kvcache(
            q, k_cache.clone(), v_cache.clone(), k_new, v_new, cache_seqlens=3, causal=True
        )

    assert torch.autograd.gradcheck(run, (q, k_cache, v_cache, k_new, v_new))


def test_dense_backward_passes_gradcheck():
    rng = np.random.default_rng(4)
    q, k, v = (_t(rng.normal(size=(1, n, 2, 3)), True) for n in (4, 6, 6))

    def run(q, k, v):
        return fa.flash_attn_func(q, k, v, causal=True, window_size=(2, 1), softcap=3.0)

    assert torch.autograd.gradcheck(run, (q, k, v))


# --- S_dmask: flash-attn's encoding of the probabilities and the dropout pattern ----------
MASK32 = (1 << 32) - 1


def _lowbias32(x: int) -> int:
    """Wellons' lowbias32 on a 32-bit integer (Python ints: no overflow to reason about)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def _keep(seed: int, head: int, i: int, j: int, p: float) -> bool:
    """``r_ij`` as docs/algorithm.md defines the keep-bits: the top 24 bits of the hash chain
    of (seed, head, i, j) at least ``round(p·2^24)``."""
    key = _lowbias32(_lowbias32(seed & MASK32) ^ (seed >> 32))
    key = _lowbias32(key ^ (head & MASK32))
    key = _lowbias32(key ^ i)
    return (_lowbias32(key ^ _lowbias32(j)) >> 8) >= round(p * (1 << 24))


def _drawn_seed(generator_seed: int) -> int:
    """The dropout seed the drop-in draws after ``torch.manual_seed(generator_seed)``."""
    torch.manual_seed(generator_seed)
    return int(torch.randint(0, 1 << 62, (1,)).item())


def _check_s_dmask(s_dmask, scores, seed, head, rows, cols, block_n, lse):
    """One sequence and head: ``scores (n_q, n_k)`` (−∞ off A_i) at packed ``rows``, ``cols``.

    The definition: block ``t`` of ``block_n`` keys holds ``±e^{s − M^(t)}``, ``M^(t)`` the max
    over blocks ``t..T`` (flash-attn folds from the last block), minus where ``r_ij = 0``;
    and ``|S|·e^{M^(t) − lse} = softmax(scores)``. Returns the decoded keep-bits."""
    n_k = scores.shape[1]
    block_max = torch.stack([b.amax(-1) for b in scores.split(block_n, dim=-1)], dim=-1)
    running = block_max.flip(-1).cummax(-1).values.flip(-1)  # M^(t) (n_q, T)
    per_key = running.repeat_interleave(block_n, dim=-1)[:, :n_k]
    shift = torch.where(per_key.isneginf(), 0.0, per_key)
    keep = torch.tensor(
        [[_keep(seed, head, i, j, 0.3) for j in cols] for i in rows], dtype=torch.bool
    )
    np.testing.assert_allclose(s_dmask.abs(), torch.exp(scores - shift), rtol=1e-13, atol=0)
    assert torch.equal(torch.signbit(s_dmask), ~keep)  # -0.0 on an excluded dropped pair too
    decoded = s_dmask.abs() * torch.exp(shift - lse[:, None])
    np.testing.assert_allclose(decoded, torch.softmax(scores, dim=-1), atol=1e-14)
    return keep


def _scores(q, k, causal=False, slope=None):
    """``c·q·kᵀ`` with ALiBi ``−slope·|i + n_k − n_q − j|`` and the bottom-right causal mask."""
    n_q, n_k = q.shape[0], k.shape[0]
    s = (q @ k.T) / np.sqrt(q.shape[-1])
    centre = torch.arange(n_q)[:, None] + n_k - n_q
    j = torch.arange(n_k)[None, :]
    if slope is not None:
        s = s - slope * (centre - j).abs()
    return s.masked_fill(j > centre, float("-inf")) if causal else s


def test_s_dmask_decodes_to_the_keep_bits_and_the_probabilities():
    rng = np.random.default_rng(5)
    batch, n_q, n_k, heads, d = 2, 5, 70, 4, 100  # d = 100: blocks of 32 keys with dropout
    q, k, v = (
        _t(rng.normal(size=(batch, n_q, heads, d))),
        *(_t(rng.normal(size=(batch, n_k, 2, d))) for _ in range(2)),
    )
    slopes = torch.tensor(rng.uniform(0, 0.3, size=(batch, heads)))
    torch.manual_seed(11)
    out, lse, s_dmask = fa.flash_attn_func(
        q, k, v, 0.3, causal=True, alibi_slopes=slopes, return_attn_probs=True
    )
    seed = _drawn_seed(11)
    block_n = fa._get_block_size_n(q.device, d, True, True)
    assert block_n == 32 and s_dmask.shape == (batch, heads, 128, 128)
    assert s_dmask.dtype == q.dtype and not s_dmask[:, :, n_q:].any()
    assert not s_dmask[..., n_k:].any()
    for b in range(batch):
        for h in range(heads):
            scores = _scores(q[b, :, h], k[b, :, h // 2], True, slopes[b, h])
            rows, cols = range(b * n_q, (b + 1) * n_q), range(b * n_k, (b + 1) * n_k)
            keep = _check_s_dmask(
                s_dmask[b, h, :n_q, :n_k], scores, seed, h, rows, cols, block_n, lse[b, h]
            )
            weights = torch.softmax(scores, dim=-1) * keep / 0.7
            np.testing.assert_allclose(out[b, :, h], weights @ v[b, :, h // 2], atol=1e-13)


def test_varlen_s_dmask_is_per_sequence_at_packed_keep_bits():
    rng = np.random.default_rng(6)
    cu_q, cu_k = np.array([0, 3, 7]), np.array([0, 40, 49])
    q, k, v = _t(rng.normal(size=(7, 2, 16))), *(_t(rng.normal(size=(49, 2, 16))) for _ in "kv")
    torch.manual_seed(3)
    _, lse, s_dmask = fa.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, 4, 40, dropout_p=0.3, return_attn_probs=True
    )
    seed = _drawn_seed(3)
    assert s_dmask.shape == (2, 2, 128, 128)
    for s in range(2):
        rows, cols = range(cu_q[s], cu_q[s + 1]), range(cu_k[s], cu_k[s + 1])
        for h in range(2):
            scores = _scores(q[rows.start : rows.stop, h], k[cols.start : cols.stop, h])
            block = s_dmask[s, h, : len(rows), : len(cols)]
            _check_s_dmask(block, scores, seed, h, rows, cols, 128, lse[h, rows.start : rows.stop])
        assert not s_dmask[s, :, len(rows) :].any() and not s_dmask[s, :, :, len(cols) :].any()


def test_s_dmask_only_with_dropout_and_only_when_asked(monkeypatch):
    q = _t(np.ones((1, 3, 1, 4)))
    assert fa.flash_attn_func(q, q, q, return_attn_probs=True)[2] is None  # flash-attn's too

    def refuse(*args, **kwargs):
        raise AssertionError("S_dmask built for a call that did not ask for it")

    monkeypatch.setattr(fa, "attn_probs", refuse)
    out = fa.flash_attn_func(q, q, q, 0.5)
    assert out.shape == (1, 3, 1, 4)


# --- rotary embeddings and left padding in flash_attn_with_kvcache -------------------------
def _rotate(x, cos, sin, t, interleaved):
    """``x (d,)`` rotated at position ``t``: pairs ``(2u, 2u+1)`` or ``(u, u + R/2)`` turned by
    the angle of ``(cos[t, u], sin[t, u])``; the dims from ``R = 2·cos.shape[1]`` unchanged."""
    x, half = x.copy(), cos.shape[1]
    for u in range(half):
        a, b = (2 * u, 2 * u + 1) if interleaved else (u, u + half)
        x[a], x[b] = x[a] * cos[t, u] - x[b] * sin[t, u], x[b] * cos[t, u] + x[a] * sin[t, u]
    return x


def _kvcache_case(rng, n_cache=12, d=8):
    k_cache, v_cache = (_t(rng.normal(size=(2, n_cache, 1, d))) for _ in "kv")
    k_new, v_new = (_t(rng.normal(size=(2, 2, 1, d))) for _ in "kv")
    angle = rng.uniform(0, 2 * np.pi, size=(16, 3))  # rotary_dim 6 of d = 8: partial
    return k_cache, v_cache, k_new, v_new, _t(np.cos(angle)), _t(np.sin(angle))


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize(("causal", "leftpad"), [(True, None), (False, None), (True, [2, 0])])
def test_kvcache_rotary_and_leftpad_against_the_definition(interleaved, causal, leftpad):
    rng = np.random.default_rng(7)
    k_cache, v_cache, k_new, v_new, cos, sin = _kvcache_case(rng)
    q = _t(rng.normal(size=(2, 3, 2, 8)))
    lengths = [5, 9]
    before = k_cache.numpy().copy()
    out = fa.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=torch.tensor(lengths, dtype=torch.int32), causal=causal,
        rotary_interleaved=interleaved,
        cache_leftpad=None if leftpad is None else torch.tensor(leftpad, dtype=torch.int32),
    )  # fmt: skip
    c, s = cos.numpy(), sin.numpy()
    for b, n in enumerate(lengths):
        start = 0 if leftpad is None else leftpad[b]
        rotated = np.stack(
            [_rotate(k_new[b, r, 0].numpy(), c, s, n + r, interleaved) for r in (0, 1)]
        )
        np.testing.assert_allclose(k_cache[b, n : n + 2, 0].numpy(), rotated, atol=1e-15)
        np.testing.assert_array_equal(k_cache[b, n + 2 :].numpy(), before[b, n + 2 :])
        keys = np.concatenate([before[b, start:n, 0], rotated])[:, None]
        values = v_cache[b, start : n + 2].numpy()
        at = [n + i if causal else n for i in range(3)]  # flash-attn's rule for the queries
        queries = np.stack(
            [
                [_rotate(q[b, i, h].numpy(), c, s, at[i], interleaved) for h in (0, 1)]
                for i in range(3)
            ]
        )
        y_ref, _ = spec.varlen(queries, keys, values, [0, 3], [0, n + 2 - start], causal=causal)
        np.testing.assert_allclose(out[b].numpy(), y_ref, atol=1e-14)


def test_kvcache_leftpad_on_a_paged_cache():
    rng = np.random.default_rng(8)
    k_cache, v_cache = (_t(rng.normal(size=(6, 3, 1, 4))) for _ in "kv")
    table = torch.tensor([[4, 0, 2], [1, 5, 3]], dtype=torch.int32)
    q = _t(rng.normal(size=(2, 1, 2, 4)))
    out = fa.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor([7, 5]), block_table=table,
        cache_leftpad=torch.tensor([4, 1]), window_size=(1, -1),
    )  # fmt: skip
    for b, (start, n) in enumerate([(4, 7), (1, 5)]):
        keys = spec.paged_sequence(k_cache.numpy(), table[b].numpy(), n)[start:]
        values = spec.paged_sequence(v_cache.numpy(), table[b].numpy(), n)[start:]
        y_ref, _ = spec.varlen(q[b].numpy(), keys, values, [0, 1], [0, n - start], left=1)
        np.testing.assert_allclose(out[b].numpy(), y_ref, atol=1e-14)


FAILING_CALLS = {  # name -> the keywords of a call that must raise, naming the argument
    "rotary dim above headdim": (dict(rotary_cos=np.zeros((16, 5))), "rotary_dim <= headdim"),
    "rotary_cos too short": (
        dict(rotary_cos=np.zeros((10, 3)), rotary_sin=np.zeros((10, 3))),
        "rotary_cos has 10 positions",
    ),
    "rotary_cos without rotary_sin": (dict(rotary_sin=None), "give both rotary_cos and"),
    "leftpad beyond cache_seqlens": (dict(cache_leftpad=[2, 10]), r"cache_leftpad\[1\] = 10"),
    "append past the cache": (dict(cache_seqlens=[5, 11]), "sequence 1 needs 13 positions"),
    "alibi_slopes of another shape": (dict(alibi_slopes=np.ones(3)), "alibi_slopes has shape"),
}


@pytest.mark.parametrize("name", FAILING_CALLS)
def test_a_failing_call_leaves_the_caches_unchanged(name):
    keywords, message = FAILING_CALLS[name]
    rng = np.random.default_rng(9)
    k_cache, v_cache, k_new, v_new, cos, sin = _kvcache_case(rng)
    given = dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=[5, 9], causal=True)
    given.update({key: _t(x) if isinstance(x, np.ndarray) else x for key, x in keywords.items()})
    given = {key: torch.tensor(x) if isinstance(x, list) else x for key, x in given.items()}
    before = k_cache.clone(), v_cache.clone()
    q = _t(rng.normal(size=(2, 1, 2, 8)))
    with pytest.raises(fa.FlashAttnError, match=message) as raised:
        fa.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **given)
    assert isinstance(raised.value, RuntimeError) and isinstance(raised.value, ValueError)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


def test_flash_attn_errors_are_runtime_and_value_errors():
    q = _t(np.ones((3, 1, 4)))
    for expected in (RuntimeError, ValueError):
        with pytest.raises(expected, match="cu_seqlens_q must start at 0"):
            fa.flash_attn_varlen_func(q, q, q, [1, 3], [0, 3], 3, 3)
