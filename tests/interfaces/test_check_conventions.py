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


@pytest.mark.slow  # several seconds: the default run stays within its budget
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", DEFAULT_PROFILE)
def test_planted_bug_is_caught_at_the_default_profile(name):
    convention, supports, output = BROKEN[name]
    with pytest.raises(AssertionError, match=rf"FAIL .*{output}"):
        _check(getattr(broken, name), convention, supports)


# flash_attn_with_kvcache as production calls it: appends across pages, cache_batch_idx,
# cache_leftpad, rotary (interleaved or not, partial) and num_splits, at real head dims
KVCACHE_BROKEN = {  # name -> what the counterexample names
    "kvcache_wrong_page": "",
    "kvcache_append_not_written": "k_cache after the call",
    "kvcache_append_in_first_page": "k_cache after the call",
    "kvcache_leftpad_ignored": "y",
    "kvcache_batch_idx_ignored": "",
    "kvcache_rotary_halves_only": "",
    "kvcache_rotary_whole_head": "",
    "kvcache_queries_at_one_position": "y",
}


def _check_kvcache(fn, examples):
    return assert_attention_close(
        fn, convention="flash-kvcache", claim=CLAIM, supports=FLASH, examples=examples,
        dtypes=("float32", "float16"), max_n=48, max_d=None, dropout_probe=False,
    )  # fmt: skip


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_exactattn_kvcache_passes_with_appends_rotary_and_cache_layouts():
    result = _check_kvcache(fa.flash_attn_with_kvcache, 60)
    covered = set().union(*(c.keys() for c in result.report.coverage.values()))
    for key in ("append 1", "paged cache", "contiguous", "cache_leftpad", "rotary partial"):
        assert f"iface {key}" in covered, key


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_kvcache_append_that_is_never_written_is_caught():
    with pytest.raises(AssertionError, match=r"FAIL .*k_cache after the call"):
        _check_kvcache(broken.kvcache_append_not_written, 60)


@pytest.mark.slow  # 200 drawn cases at real head dims, shrinking included: ~10-30 s each
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", sorted(KVCACHE_BROKEN))
def test_broken_kvcache_is_caught(name):
    with pytest.raises(AssertionError, match=rf"FAIL .*{KVCACHE_BROKEN[name]}"):
        _check_kvcache(getattr(broken, name), 200)


@pytest.mark.slow  # 200 drawn cases and the shrinking of the counterexample: ~10-60 s each
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_copy_is_caught(name):
    convention, supports, output = BROKEN[name]
    with pytest.raises(AssertionError, match=rf"FAIL .*{output}"):
        _check(getattr(broken, name), convention, supports, examples=200)
