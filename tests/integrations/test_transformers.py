"""attn_implementation="exactattn" and exact_sdpa() on tiny random-weight transformers models.

Llama (grouped-query attention, a left-padded batch), GPT2 (padding), Mistral (a sliding
window shorter than the sequence): logits, loss and every parameter gradient against
``attn_implementation="sdpa"``, and greedy generation with a dynamic and a static cache.

Tolerance, derived rather than chosen: the truth is the float64 model under ``sdpa``. In
float32 both implementations round the same function in different orders, so ours must be
as close to the truth as SDPA's float32 result is, within a factor 2, plus 8 units of
float32 roundoff of the quantity's magnitude (for quantities SDPA happens to get almost
exactly): ``|ours32 − truth| ≤ 2·|sdpa32 − truth| + 8·u32·max|truth|``. In float64 the
same bound is scaled by ``u64/u32`` (a rounding error is proportional to the unit
roundoff): ``|ours64 − sdpa64| ≤ (u64/u32)·(2·|sdpa32 − truth| + 8·u32·max|truth|)``.
"""

from __future__ import annotations

import pytest

from tests.optional import requires

torch = requires("torch")
requires("transformers")

import exactattn.integrations.transformers as hf_exact
from exactattn.torch import exact_sdpa

from .hf_models import MODELS, build, generated, outputs

U32 = torch.finfo(torch.float32).eps / 2
U64 = torch.finfo(torch.float64).eps / 2


@pytest.fixture(scope="module", autouse=True)
def registered():
    hf_exact.register()


def _error(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


@pytest.mark.parametrize("name", MODELS)
def test_logits_loss_and_every_gradient_match_sdpa(name):
    model64, ids, mask = build(name, torch.float64)
    truth = outputs(model64, ids, mask, "sdpa")
    ours64 = outputs(model64, ids, mask, "exactattn")
    model32, _, _ = build(name, torch.float32)
    sdpa32, ours32 = outputs(model32, ids, mask, "sdpa"), outputs(model32, ids, mask, "exactattn")
    assert set(ours32) == set(truth) and len(truth) > 10  # logits, loss, every parameter
    for key, want in truth.items():
        tol32 = 2 * _error(sdpa32[key], want) + 8 * U32 * want.abs().max().item()
        assert _error(ours32[key], want) <= tol32, f"float32 {key}"
        assert _error(ours64[key], want) <= U64 / U32 * tol32, f"float64 {key}"


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", MODELS)
def test_generate_gives_identical_tokens_in_float64(name, cache):
    model, ids, mask = build(name, torch.float64)
    ours = generated(model, ids, mask, "exactattn", cache)
    assert torch.equal(ours, generated(model, ids, mask, "sdpa", cache))
    assert ours.shape[1] > ids.shape[1] + 4  # it generated past the prompt (and the window)


def test_the_attention_function_is_the_one_called():
    """The registered names resolve to exactattn's functions, and a call goes through them."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    assert AttentionInterface()["exactattn"] is hf_exact.attention_forward
    assert AttentionMaskInterface()["exactattn"] is sdpa_mask
    model, ids, mask = build("llama-gqa", torch.float64)
    model.set_attn_implementation("exactattn")
    with exact_sdpa() as routed:  # counts SDPA calls: there must be none
        model(input_ids=ids, attention_mask=mask)
    assert routed.calls == 0


def test_exact_sdpa_routes_a_models_sdpa_calls():
    """Under exact_sdpa() an ``sdpa`` model runs exactattn: the same logits bit for bit as
    ``attn_implementation="exactattn"``, and a routed call per layer."""
    model, ids, mask = build("gpt2-padding", torch.float32)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        with exact_sdpa() as routed:
            inside = model(input_ids=ids, attention_mask=mask).logits
        outside = model(input_ids=ids, attention_mask=mask).logits
        model.set_attn_implementation("exactattn")
        registered = model(input_ids=ids, attention_mask=mask).logits
    assert routed.calls == model.config.n_layer
    assert torch.equal(inside, registered)
    assert not torch.equal(inside, outside)  # float32: the two implementations round apart


def test_unsupported_keywords_are_refused():
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(NotImplementedError, match="position_bias"):
        hf_exact.attention_forward(torch.nn.Module(), q, q, q, None, position_bias=q)


def test_s_aux_is_gpt_oss_sink():
    """gpt-oss's eager attention: the sink as one more column of the scores, then dropped."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 5, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64) for _ in range(2))
    sinks = torch.randn(4, generator=g, dtype=torch.float64)
    y, _ = hf_exact.attention_forward(torch.nn.Module(), q, k, v, None, scaling=0.5, s_aux=sinks)
    kr, vr = (x.repeat_interleave(2, dim=1) for x in (k, v))
    s = 0.5 * q @ kr.transpose(2, 3) + torch.full((5, 5), -torch.inf).triu(1)
    w = torch.cat([s, sinks.reshape(1, -1, 1, 1).expand(1, 4, 5, 1)], -1).softmax(-1)[..., :-1]
    torch.testing.assert_close(y, (w @ vr).transpose(1, 2), rtol=0, atol=1e-14)
