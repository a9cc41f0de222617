"""OpenVINO's PagedAttention on its CPU plugin (:mod:`exactattn.targets.openvino_paged`): a
short check passes on the cases it expresses (causal from each sequence's end, decode with
key padding), a case it does not is a skip with the reason, and a block table off by one
block fails."""

from __future__ import annotations

import dataclasses

import pytest

from exactattn import targets
from exactattn.cases import Draw, build_case
from exactattn.testing import session
from exactattn.testing.case_check import Options, check_case
from tests.optional import requires

requires("openvino")

from exactattn.targets import openvino_paged

EXACT = Options(sampled=False, fast_reference=True)
SHORT = session.Settings(
    examples=40, max_n=80, max_d=8, budget=1 << 12, determinism=False, baselines=False,
    probes=False, grads=False,
)  # fmt: skip
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _variant(fn=None) -> targets.Variant:
    target = targets.get("openvino-paged")
    if fn is not None:
        target = dataclasses.replace(target, loader=lambda: fn)
    return targets.Variant(target, "float32")


def test_a_short_check_passes():
    result = session.run([targets.get("openvino-paged")], SHORT)
    assert result.report.failures == [], result.report.failures[:1]
    assert result.report.counts["openvino-paged"]["ok"] >= 5, result.report.counts


def next_block(*args, **kwargs):
    """The op with every block index moved to the next page of the pool."""
    args = list(args)
    args[7] = (args[7] + 1) % args[3].shape[0]
    return openvino_paged.attention(*args, **kwargs)


@pytest.mark.parametrize(
    "batch, n_q, n_k, mask",
    [
        ((2, 2), 5, 70, {"kind": "causal", "align": "bottom-right"}),
        ((2,), 1, 40, {"kind": "padding", "lengths": [7, 33]}),
    ],
)
def test_the_cache_is_read_and_a_block_off_by_one_fails(batch, n_q, n_k, mask):
    case = build_case(Draw(batch, n_q, n_k, 8, 8, 512, dtype="float32", data_seed=1, mask=mask))
    found = check_case(case, [_variant(), _variant(next_block)], EXACT)
    assert [f.status for f in found] == ["ok", "fail"], [f.detail for f in found]
    assert found[1].detail.startswith("y[")


def test_a_mask_that_is_not_paged_attention_is_a_skip_with_the_reason():
    case = build_case(Draw((1,), 3, 9, 4, 4, 512, dtype="float32", data_seed=1))
    (found,) = check_case(case, [_variant()], EXACT)
    assert found.status == "skip" and found.detail == openvino_paged.NOT_PAGED
