"""``exactattn check`` of the interface conventions: exactattn passes, broken copies fail."""

from __future__ import annotations

import pytest

from tests.optional import requires

requires("torch")

import exactattn.torch as et
from exactattn.layouts import flash_attn as fa
from exactattn.testing import assert_attention_close

from . import broken_interfaces as broken

CLAIM = "scores=fp32,stats=fp32,acc=fp32"
FLASH = (
    "masks=none+causal+window+padding+and,dropout=no,lse=yes,bias=yes,softcap=yes,empty_rows=yes"
)
MERGE = "dropout=no,lse=yes,bias=yes,softcap=yes,empty_rows=yes"

CORRECT = {
    "flash-varlen": (fa.flash_attn_varlen_func, FLASH),
    "flash-kvcache": (fa.flash_attn_with_kvcache, FLASH),
    "fa4-combine": (fa.flash_attn_combine, MERGE),
    "xformers-merge": (broken.xformers_merge_attentions, MERGE),
    "flashinfer-merge": (broken.flashinfer_merge_state, MERGE),
    "exactattn-sinks": (et.attention_with_lse, MERGE),
}
BROKEN = {  # name -> (convention, supports, what the counterexample names)
    "varlen_wrong_offset": ("flash-varlen", FLASH, "y"),
    "varlen_equal_q_lengths": ("flash-varlen", FLASH, ""),
    "varlen_causal_top_left": ("flash-varlen", FLASH, ""),
    "kvcache_wrong_page": ("flash-kvcache", FLASH, "y"),
    "combine_without_max": ("fa4-combine", MERGE, ""),
    "flashinfer_natural_lse": ("flashinfer-merge", MERGE, ""),
    "sink_in_numerator": ("exactattn-sinks", MERGE, "y"),
    "sink_gradient_without_minus": ("exactattn-sinks", MERGE, "dsinks"),
    "sink_gradient_without_sink_in_l": ("exactattn-sinks", MERGE, "dsinks"),
    "sink_nan_on_empty_rows": ("exactattn-sinks", MERGE, "y"),
}


def _check(fn, convention, supports, examples=60):
    return assert_attention_close(
        fn,
        convention=convention,
        claim=CLAIM,
        supports=supports,
        examples=examples,
        dtypes=("float32", "float16"),
        max_n=12,
        dropout_probe=False,
    )


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("convention", sorted(CORRECT))
def test_exactattn_passes(convention):
    fn, supports = CORRECT[convention]
    result = _check(fn, convention, supports)
    assert sum(c["ok"] for c in result.report.counts.values()) >= 10


# planted bugs the draws missed before varlen batches had their own query lengths, causal /
# window masks per sequence, and the sink convention judged dsinks and rows with no key
DEFAULT_PROFILE = (
    "varlen_equal_q_lengths",
    "varlen_causal_top_left",
    "sink_gradient_without_minus",
    "sink_gradient_without_sink_in_l",
    "sink_nan_on_empty_rows",
)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", DEFAULT_PROFILE)
def test_planted_bug_is_caught_at_the_default_profile(name):
    convention, supports, output = BROKEN[name]
    with pytest.raises(AssertionError, match=rf"FAIL .*{output}"):
        _check(getattr(broken, name), convention, supports)


@pytest.mark.slow  # 200 drawn cases and the shrinking of the counterexample: ~10-60 s each
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_copy_is_caught(name):
    convention, supports, output = BROKEN[name]
    with pytest.raises(AssertionError, match=rf"FAIL .*{output}"):
        _check(getattr(broken, name), convention, supports, examples=200)
