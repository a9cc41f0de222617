"""The dropout probe fails broken dropout; determinism is reported; the xformers convention
plumbs through (with a stand-in function: xformers itself needs CUDA)."""

from __future__ import annotations

import dataclasses

import pytest

from exactattn import targets
from exactattn.testing import session
from exactattn.testing.probes import probe
from tests.optional import requires

torch = requires("torch")
F = torch.nn.functional


def _dropout_kernel(keep_scale: float, rate: float):
    """SDPA with its own dropout: keep with probability 1 − rate, scale kept weights."""

    def attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False):  # fmt: skip
        s = q @ k.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
        p = torch.softmax(s, dim=-1)
        if dropout_p:
            keep = torch.rand_like(p) >= rate
            p = p * keep / (keep_scale if keep_scale else 1 - dropout_p)
        return p @ v

    return attention


def _variant(fn):
    return targets.Variant(targets.from_callable(fn, name="kernel"), "float32")


def test_the_probe_passes_correct_dropout_and_fails_broken_dropout():
    assert probe(_variant(_dropout_kernel(0.0, 0.3)), p=0.3, draws=100).ok
    unscaled = probe(_variant(_dropout_kernel(1.0, 0.3)), p=0.3, draws=100)
    assert not unscaled.ok and "off 1/((1-p) n_k)" in unscaled.detail
    wrong_rate = probe(_variant(_dropout_kernel(0.0, 0.4)), p=0.3, draws=100)
    assert not wrong_rate.ok and "keep-rate" in wrong_rate.detail


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nondeterminism_is_reported_not_failed():
    def shuffled(q, k, v, **kw):
        """Keys in a random order each call: another summation order, as atomics give."""
        order = torch.randperm(k.shape[-2])
        return F.scaled_dot_product_attention(q, k[..., order, :], v[..., order, :], **kw)

    target = targets.from_callable(shuffled, name="shuffled", supports=_no_masks())
    settings = session.Settings(examples=30, dtypes=("float32",), probes=False, baselines=False)
    result = session.run([target], settings)
    assert not result.report.failures, [f.detail for f, _ in result.report.failures]
    found = result.report.findings["shuffled[float32]"]
    assert any(f.deterministic is False for f in found)


def _no_masks():
    return targets.Capabilities.parse("masks=none,dropout=no")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_xformers_convention_with_a_stand_in():
    def memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None):
        q, k, v = (x.transpose(1, 2) for x in (query, key, value))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, scale=scale)
        return y.transpose(1, 2)

    base = targets.get("xformers")
    target = dataclasses.replace(
        base,
        loader=lambda: memory_efficient_attention,
        caps=dataclasses.replace(base.caps, devices=("cpu",), masks=("none", "dense", "padding")),
        requires=(),
        needs_cuda=False,
    )
    settings = session.Settings(examples=60, dtypes=("float32",), probes=False)
    result = session.run([target], settings)
    assert not result.report.failures, [f.detail for f, _ in result.report.failures]
    assert result.report.counts["xformers[float32]"]["ok"] >= 5
