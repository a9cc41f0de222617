"""Every skip explained (:mod:`exactattn.testing.skips`): skipped cases are listed by reason
with the flag that would run them, and that flag does run them."""

from __future__ import annotations

import dataclasses

import pytest

from exactattn import targets
from exactattn.targets import Capabilities
from exactattn.targets.resolve import user_capabilities
from exactattn.testing import session, skips
from tests.optional import requires

requires("torch", "flint")

import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SPEC = "tests.check.test_skips:kernel"
SHORT = session.Settings(
    examples=40, max_n=12, max_d=8, dtypes=("float64",), determinism=False, baselines=False,
    probes=False, grads=False,
)  # fmt: skip


def kernel(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """torch SDPA's math backend, in SDPA's full signature."""
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa=enable_gqa
        )


def _told(supports: str) -> targets.Target:
    return targets.get(SPEC, supports=Capabilities.parse(supports, user_capabilities("sdpa")))


def _skipped(result, label: str) -> int:
    return sum(s.count for s in skips.rows(result) if s.reason.startswith(label))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_flag_listed_for_a_skip_runs_those_cases():
    told = session.run([_told("gqa=no")], SHORT)
    listed = {(s.reason.partition(":")[0], s.runs_them) for s in skips.rows(told)}
    assert ("GQA", "--supports gqa=yes") in listed, listed
    assert _skipped(told, "GQA") > 0
    again = session.run([_told("gqa=yes")], SHORT)
    assert _skipped(again, "GQA") == 0
    judged = [sum(c["ok"] + c["fail"] for c in r.report.counts.values()) for r in (told, again)]
    assert judged[1] == judged[0] + _skipped(told, "GQA")
    (line,) = [x for x in skips.terminal(told) if "GQA" in x]
    assert line.endswith("[--supports gqa=yes]") and SPEC in line
    assert any("`--supports gqa=yes`" in row for row in skips.markdown(told))


def test_what_runs_each_kind_of_skip():
    user = _told("grads=no,masks=causal")
    assert skips.runs_them(user, "gradients: not supported (--supports)") == "--supports grads=yes"
    assert (
        skips.runs_them(user, "mask kinds ['window'] not supported")
        == "--supports masks=causal+window"
    )
    unequal = dataclasses.replace(user, caps=dataclasses.replace(user.caps, equal_head_dims=True))
    assert skips.runs_them(unequal, "needs v == d") == "--supports equal_head_dims=no"
    bias = skips.runs_them(user, user.caps.bias and f"bias: {user.caps.bias}")
    assert bias == "--supports bias=yes"
    lowbit = "low-bit schemes run in the sweep only (exactattn sweep --preset lowbit)"
    assert skips.runs_them(user, lowbit) == "exactattn sweep --preset lowbit"
    # a library's own limit and a refusal at run time: no flag runs them
    xformers = targets.get("xformers")
    assert skips.runs_them(xformers, f"GQA: {xformers.caps.gqa}") == skips.NO_FLAG
    refused = "the target does not support this input: NotImplementedError: no GQA"
    assert skips.runs_them(user, refused) == skips.NO_FLAG
