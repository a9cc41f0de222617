"""A user's function is called the way its signature allows (:mod:`exactattn.targets.signature`).

A plain ``def attn(q, k, v, *, is_causal=False, scale=None, attn_mask=None)`` passes a
default check: GQA cases reach it with ``K, V`` expanded over each group (the check sums the
heads' gradients), no dropout case and no dropout probe, each said once. The checks can
fail: an expansion with the wrong head mapping is caught, and so is a GQA backward judged
without the group-sum terms (:mod:`exactattn.testing.group_sums`).
"""

from __future__ import annotations

import importlib

import pytest

from exactattn import targets
from exactattn.testing import assert_attention_close
from exactattn.testing.session import Settings, run
from tests.optional import requires

requires("torch")

import numpy as np
import torch


def plain(q, k, v, *, is_causal=False, scale=None, attn_mask=None):
    """Attention from its definition, in the inputs' dtype (scores in fp32 for fp16/bf16); a
    row with no allowed key is 0, as SDPA defines it."""
    c = q.shape[-1] ** -0.5 if scale is None else scale
    wide = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    s = (q.to(wide) @ k.to(wide).transpose(-1, -2)) * c
    if is_causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(~torch.ones(n_q, n_k, dtype=torch.bool).tril(), float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    empty = torch.isinf(s).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    return (p @ v.to(wide)).to(q.dtype)


def unscaled(q, k, v, *, is_causal=False):
    return plain(q, k, v, is_causal=is_causal)


def test_the_signature_narrows_the_capabilities():
    target = targets.from_callable(plain)
    assert target.options.takes == {"q", "k", "v", "is_causal", "scale", "attn_mask"}
    assert "dropout_p" in target.caps.dropout and target.caps.gqa is True
    assert any("GQA cases are called with K, V expanded" in n for n in target.options.notes)
    bare = targets.from_callable(unscaled)
    assert "attn_mask" in bare.caps.bias
    anything = targets.from_callable(lambda q, k, v, **kw: plain(q, k, v))
    assert anything.options.takes is None and anything.options.notes == ()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_plain_function_passes_by_default_and_is_told_once():
    result = assert_attention_close(plain, examples=60, max_n=12, dtypes=("float32", "float16"))
    assert not result.probes  # no dropout_p: no dropout probe
    notes = [n for n in result.report.notes if "dropout probe" in n]
    assert len(notes) == 1
    gqa = [f for f in result.report.findings.get("plain[float16]", []) if f.status == "ok"]
    assert gqa, "no float16 case ran"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_without_attn_mask_or_scale_such_cases_are_skipped_with_the_reason():
    settings = Settings(examples=40, max_n=8, dtypes=("float32",), probes=False,
                        determinism=False, baselines=False)  # fmt: skip
    result = run([targets.from_callable(unscaled)], settings)
    assert not result.report.failures, [f.detail for f, _ in result.report.failures]
    reasons = " ".join(result.report.skips.get("unscaled[float32]", {}))
    assert "takes no scale" in reasons and "attn_mask" in reasons


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_wrong_expansion_of_the_heads_is_caught(monkeypatch):
    conventions = importlib.import_module("exactattn.targets.conventions")

    def tiled(held, group):  # head h reads key/value head h % H_kv instead of h // g
        out = dict(held)
        for x in "kv":
            out[x] = np.tile(held[x], (1, group, 1, 1))
        return out

    monkeypatch.setattr(conventions, "expand_heads", tiled)
    with pytest.raises(AssertionError, match="GQA group"):
        assert_attention_close(plain, examples=200, max_n=8, dtypes=("float32",),
                               dropout_probe=False)  # fmt: skip
