"""``exactattn check`` judges low-bit kernels against their own claims: the built-in schemes
pass on theirs, a user's FP8 kernel (:mod:`.fp8_kernel`) on a one-line claim, and one broken
twin per feature of the claim grammar fails where its correct twin passes:

* a block scale taken from the wrong block (the user's FP8 kernel; FAIL where its claim states
  its quantiser, SUSPICIOUS where not);
* ``p`` cast without its scale ``S`` (``pcast-fwd-s256``'s claim, run with ``S = 1``);
* an FP22 ``p·V`` accumulator summing more terms than its claimed chunk;
* Q smoothing whose mean is not added back (``sage2-int8``).

Each twin is judged on one case built to show its bug (a random draw of the check finds the
last three as well; see docs/check.md), through the check's own case path
(:func:`exactattn.testing.case_check.check_case`).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest

from exactattn import targets
from exactattn.cases import Case
from exactattn.cases.inputs import make_inputs
from exactattn.error.lowbit import SCHEMES, Scheme
from exactattn.targets.builtin import lowbit_target, scheme_target
from exactattn.testing import assert_attention_close
from exactattn.testing.case_check import Options, check_case
from tests.optional import requires

requires("flint")  # the certified references
from tests.optional import requires

NO_GRADS = Options(grads=False)


def _status(target, case) -> str:
    """``ok``, ``suspicious`` (within the rigorous bound, far outside the expected error:
    :mod:`exactattn.testing.suspicion`) or ``fail``."""
    (found,) = check_case(case, [targets.Variant(target, "float32")], NO_GRADS)
    assert found.status in ("ok", "fail"), found.detail
    return "suspicious" if found.status == "ok" and found.suspicious else found.status


def _case(inputs, block, **keywords) -> Case:
    return Case(*(inputs[x] for x in "qkvg"), block, dtype="float32", **keywords)


# --- the user's FP8 kernel -----------------------------------------------------------------
@pytest.mark.parametrize("claim", ["CLAIM", "CLAIM_ANY"])
def test_a_users_fp8_kernel_passes_its_one_line_claim(claim):
    requires("torch")
    from . import fp8_kernel

    result = assert_attention_close(
        fp8_kernel.fp8_attention,
        convention="sdpa",
        claim=getattr(fp8_kernel, claim),
        supports=fp8_kernel.SUPPORTS,
        examples=40,  # in every dtype: its fp32 arithmetic, float64 inputs cast to it
        max_n=200,
        max_d=None,
        grads=False,
        dropout_probe=False,
    )
    assert sum(c["ok"] for c in result.report.counts.values()) >= 30


def _fp8_target(bug, claim_text):
    from . import fp8_kernel

    fn = functools.partial(fp8_kernel.fp8_attention, bug=bug)
    caps = targets.Capabilities.parse(fp8_kernel.SUPPORTS, targets.user_capabilities("sdpa"))
    claim = targets.Claim.parse(claim_text)
    return targets.from_callable(fn, convention="sdpa", claim=claim, supports=caps)


def test_a_block_scale_from_the_wrong_block_fails():
    """Two blocks of 64 keys, the second's values 8 times larger: divided by the first
    block's scale and clamped to ±448, they saturate. With the quantiser stated the check
    takes exact attention at the quantised inputs the claim defines, and the twin's are
    not those: FAIL. Unstated, the rigorous bound charges every entry e4m3's 1/16 (and the
    largest group's s·μ) and is near vacuous here: the twin is only SUSPICIOUS (1.37 where
    3σ of the expected error is 0.21; the rigorous bound 7.1, the largest |Y| 8.4)."""
    requires("torch")
    from . import fp8_kernel

    inputs = {x: a[None, None].copy() for x, a in make_inputs("normal", 128, 8, 0).items()}
    inputs["v"][..., 64:, :] *= 8
    case = _case(inputs, 64)
    for claim, caught in ((fp8_kernel.CLAIM, "fail"), (fp8_kernel.CLAIM_ANY, "suspicious")):
        assert _status(_fp8_target(None, claim), case) == "ok"
        assert _status(_fp8_target("wrong-block-scale", claim), case) == caught


# --- the built-in schemes' features ----------------------------------------------------------
def test_a_p_cast_without_its_scale_fails():
    """Behind a sink of strength 8, most ``p`` fall below e4m3's least subnormal 2^-9 when
    cast with S = 1; S = 256 keeps them."""
    claim = lowbit_target("pcast-fwd-s256").claim
    case = _case(make_inputs("sink-8", 256, 32, 0), 64)
    assert _status(scheme_target("s256", SCHEMES["pcast-fwd-s256"], claim), case) == "ok"
    assert _status(scheme_target("no-s", SCHEMES["pcast-fwd"], claim), case) == "fail"


def test_an_fp22_chunk_longer_than_claimed_fails():
    """fp32 inputs and no cast isolate the accumulator: an FP22 (truncating) sum of 512
    terms per key block where the claim says 32 before each fp32 addition."""
    claimed = Scheme("fp22-32", "test", pv_acc="fp22", pv_chunk=32)
    claim = targets.Claim.parse(
        "input=fp32,scores=fp32,stats=fp32,acc=fp32,pv_acc=fp22,pv_chunk=32"
    )
    case = _case(make_inputs("normal", 512, 16, 1), 512)
    assert _status(scheme_target("chunk-32", claimed, claim), case) == "ok"
    longer = replace(claimed, pv_chunk=512)
    assert _status(scheme_target("chunk-512", longer, claim), case) == "fail"


class _MeanNotAddedBack(Scheme):
    """SageAttention 2's Q smoothing with the bug: ``q − q̄`` quantised, ``q̄`` never added
    back (``q̄·k_j`` differs between keys, so softmax does not forgive it)."""

    def hold(self, inputs):
        held = super().hold(inputs)
        exact = held["exact"]
        n, rows = exact["q"].shape[-2], self.smooth_q
        means = np.concatenate(
            [
                np.broadcast_to(exact["q"][..., s : s + rows, :].mean(-2, keepdims=True),
                                exact["q"][..., s : s + rows, :].shape)
                for s in range(0, n, rows)
            ],
            axis=-2,
        )  # fmt: skip
        return {**held, "inputs": {**held["inputs"], "q": held["inputs"]["q"] - means}}


def test_a_smoothing_mean_not_added_back_fails():
    """Queries with a common offset (their block mean is large), as SageAttention 2 §3.2
    motivates Q smoothing with."""
    inputs = make_inputs("normal", 256, 32, 2)
    inputs["q"] = inputs["q"] + 2.0
    case = _case(inputs, 64)
    fields = {f: getattr(SCHEMES["sage2-int8"], f) for f in Scheme.__dataclass_fields__}
    claim = lowbit_target("sage2-int8").claim
    assert _status(scheme_target("sage2", SCHEMES["sage2-int8"], claim), case) == "ok"
    assert _status(scheme_target("no-add-back", _MeanNotAddedBack(**fields), claim), case) == "fail"


# --- every built-in scheme on its own claim ---------------------------------------------------
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_every_scheme_passes_its_own_claim(name):
    """A few drawn cases each (the default profile's 200 are in the slow test below)."""
    from exactattn.testing.session import Settings, run

    settings = Settings(
        examples=6, max_n=160, grads=False, seed=1, determinism=False, baselines=False, probes=False
    )
    result = run([lowbit_target(name)], settings)
    (counts,) = result.report.counts.values()
    assert counts["fail"] == 0 and counts["ok"] >= 4, dict(counts)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_every_scheme_runs_most_default_cases(name):
    """``exactattn check NAME`` at the default profile: no failure, >= 80% of cases run."""
    from exactattn.testing.profiles import PROFILES
    from exactattn.testing.session import Settings, run

    profile = PROFILES["default"]
    settings = Settings(
        examples=profile.examples,
        max_n=profile.max_n,
        max_d=None,
        budget=profile.budget,
        determinism=False,
        baselines=False,
        probes=False,
    )
    result = run([lowbit_target(name)], settings)
    (counts,) = result.report.counts.values()
    assert counts["fail"] == 0, dict(counts)
    assert counts["ok"] >= 0.8 * profile.examples, dict(counts)


class _MaskNotReversed(Scheme):
    """Reverse key order with the bug: the keys reversed, the mask left in their old order."""

    def exact(self, inputs):
        out, rel, abs_ = super().exact(inputs)
        return {**out, "allowed": inputs.get("allowed")}, rel, abs_


def test_reverse_key_order_reverses_the_mask_too():
    """Under a causal mask the reversed keys must carry their mask entries with them."""
    case = _case(make_inputs("normal", 96, 16, 3), 32, mask={"kind": "causal"})
    fields = {f: getattr(SCHEMES["pcast-rev"], f) for f in Scheme.__dataclass_fields__}
    claim = lowbit_target("pcast-rev").claim
    assert _status(scheme_target("rev", SCHEMES["pcast-rev"], claim), case) == "ok"
    assert _status(scheme_target("rev-bug", _MaskNotReversed(**fields), claim), case) == "fail"


class _Truncating(Scheme):
    """SageAttention's INT8 per block with the bug: ``x/s`` truncated toward zero (a bare
    ``.to(int8)``, the ``+ ½·sign`` of ``quant_per_block_int8_kernel`` left out) where the
    claim says to nearest."""

    def hold(self, inputs):
        from exactattn.backends.quantize import group_amax

        held = super().hold(inputs)
        out = dict(held["inputs"])
        for name in "qk":
            operand = getattr(self, name)
            x = held["exact"][name]
            s = group_amax(x, operand.granularity, operand.block) / 127
            out[name] = s * np.trunc(x / s)
        return {**held, "inputs": out}


def test_a_quantiser_that_truncates_where_the_claim_says_nearest_fails():
    """The stated quantiser's own feature (``quantiser=nearest``): SageAttention 1's claim,
    on logits of a few units (q scaled by 4), where the truncation's score errors outgrow
    the fp16 ``p·V`` arithmetic's bound (on N(0, 1) inputs it is only SUSPICIOUS)."""
    inputs = make_inputs("normal", 256, 64, 4)
    inputs["q"] = inputs["q"] * 4
    case = _case(inputs, 64)
    fields = {f: getattr(SCHEMES["sage1"], f) for f in Scheme.__dataclass_fields__}
    claim = lowbit_target("sage1").claim
    assert _status(scheme_target("sage1", SCHEMES["sage1"], claim), case) == "ok"
    assert _status(scheme_target("truncating", _Truncating(**fields), claim), case) == "fail"
