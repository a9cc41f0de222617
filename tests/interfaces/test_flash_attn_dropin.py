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


@pytest.mark.parametrize("argument", ["rotary_cos", "rotary_sin", "cache_leftpad"])
def test_unsupported_arguments_are_named(argument):
    q, cache = torch.zeros(1, 1, 1, 4), torch.zeros(1, 4, 1, 4)
    with pytest.raises(NotImplementedError, match=argument):
        fa.flash_attn_with_kvcache(q, cache, cache, **{argument: torch.zeros(4, 2)})
