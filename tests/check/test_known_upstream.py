"""Claims that tell the truth about torch, and ``KNOWN-UPSTREAM`` for what no claim expresses.

* torch's GQA backward rounds each head's dK, dV to the input dtype and sums the group in
  it: the SDPA claims say ``group=input``; the replayed case passes under that claim and
  fails under the same claim without it (the group-sum terms are needed).
* SDPA's NaN for ``is_causal`` with a negative scale is ``known-upstream`` for the targets
  that inherit it (named in the one list, :mod:`exactattn.testing.known`), with its replay
  file and upstream report; a user's function with the same NaN still fails, and
  ``check --replay`` exits 0 only for the known one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exactattn import targets
from exactattn.cases import Case
from exactattn.commands.check import main
from exactattn.targets import Claim
from exactattn.testing.case_check import Options, check_case
from exactattn.testing.known import UPSTREAM, reclassify
from tests.optional import requires

requires("torch", "flint")

REGRESSIONS = Path(__file__).resolve().parents[1] / "regressions"
GROUP_SUM = REGRESSIONS / "torch_sdpa_gqa_fp16_group_sum.json"
NEGATIVE = REGRESSIONS / "torch_sdpa_negative_scale_causal.json"


def _without(target: targets.Target, **fields) -> targets.Target:
    return dataclasses.replace(target, claim=dataclasses.replace(target.claim, **fields))


def _without_group(name: str) -> targets.Target:
    return _without(targets.get(name), group=None)


def _without_probe(target: targets.Target) -> targets.Target:
    """The target claiming no flush whatever the machine does."""
    return dataclasses.replace(target, options=dataclasses.replace(target.options, ftz_probe=None))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_gqa_group_sum_is_in_the_claim_and_needed():
    case = Case.from_json(GROUP_SUM.read_text())
    told = targets.Variant(targets.get("sdpa"), "float16")
    untold = targets.Variant(_without_group("sdpa"), "float16")
    assert told.claim.group == "float16" and untold.claim.group is None
    found = check_case(case, [told, untold], Options(sampled=False))
    assert [f.status for f in found] == ["ok", "fail"], [f.detail for f in found]
    assert found[1].detail.startswith("dk[")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_causal_negative_scale_nan_is_known_upstream_for_torch_only():
    case = Case.from_json(NEGATIVE.read_text())
    sdpa = targets.Variant(targets.get("sdpa"), "float32")
    import torch.nn.functional as F

    user = targets.Variant(targets.from_callable(F.scaled_dot_product_attention), "float32")
    found = {f.target: f for f in check_case(case, [sdpa, user], Options(sampled=False))}
    assert {f.status for f in found.values()} == {"fail"}
    verdict = reclassify(sdpa, case, found[sdpa.name])
    assert verdict.status == "known-upstream" and verdict.detail in UPSTREAM
    bug = UPSTREAM[verdict.detail]
    assert (REGRESSIONS.parent.parent / bug.replay).exists() and "docs/check.md" in bug.report
    assert reclassify(user, case, found[user.name]).status == "fail"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_same_bug_as_rows_of_zeros_in_bfloat16_is_known_upstream_too():
    """In bf16 with keys past the CPU kernel's first block the same +inf gives rows of
    zeros (found by the default check; the kernels built for AVX2 and AVX-512) or NaN (the
    ``ATEN_CPU_CAPABILITY=default`` build); the math backend stays right, and the same case
    with a positive scale passes."""
    from exactattn.cases import Draw, build_case

    mask = {"kind": "causal", "align": "top-left"}
    draw = Draw((1, 1), 3, 700, 8, 8, 512, mask=mask, dtype="bfloat16", data_seed=2)
    negative = dataclasses.replace(build_case(draw), scale=-1.0)
    positive = dataclasses.replace(negative, scale=1.0)
    sdpa, math = (targets.Variant(targets.get(t), "bfloat16") for t in ("sdpa", "sdpa-math"))
    options = Options(sampled=False, fast_reference=True)
    found = check_case(negative, [sdpa, math], options)
    assert [f.status for f in found] == ["fail", "ok"], [f.detail for f in found]
    assert "(got 0," in found[0].detail or " is nan for finite inputs" in found[0].detail
    assert reclassify(sdpa, negative, found[0]).status == "known-upstream"
    assert [f.status for f in check_case(positive, [sdpa], options)] == ["ok"]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_replay_exits_zero_for_known_upstream_and_one_for_the_same_nan_elsewhere(capsys):
    assert main(["sdpa", "--replay", str(NEGATIVE)]) == 0
    assert "KNOWN-UPSTREAM sdpa[float32]" in capsys.readouterr().out
    fn = "torch.nn.functional:scaled_dot_product_attention"
    assert main([fn, "--replay", str(NEGATIVE)]) == 1


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_cpu_flash_backward_query_split_is_claimed_and_charged():
    """torch's CPU flash backward adds dK, dV per block of query rows in the input type
    (found at n = 256-1546: fp16/bf16 dV 1.2-1.4x beyond one rounding, float32 dK half a
    subnormal off; those replays are megabytes, not kept): qsplit=32 on the CPU only, and
    the bound it adds is charged where n_q > 32."""
    from exactattn.cases import Draw, build_case
    from exactattn.cases.exact import fast
    from exactattn.testing.tolerance import bounds

    assert Claim.parse("qsplit=64").qsplit == 64
    assert targets.claim_for(targets.get("sdpa"), "float16").qsplit == 32
    assert targets.claim_for(targets.get("sdpa"), "float16", "cuda").qsplit is None
    assert targets.claim_for(targets.get("sdpa-math"), "float16").qsplit is None
    case = build_case(Draw((1, 1), 80, 40, 8, 8, 512, dtype="float16", data_seed=3))
    told = targets.Variant(targets.get("sdpa"), "float16")
    untold = targets.Variant(_without(told.target, qsplit=None), "float16")
    ref = fast(case, told.held(case))
    wide, narrow = bounds(told, ref).bound, bounds(untold, ref).bound
    assert (wide["dv"] > narrow["dv"]).all() and (wide["y"] == narrow["y"]).all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("batch", [(), (3,), (1, 2)])
def test_the_query_split_term_takes_any_leading_dims(batch):
    from exactattn.cases import Draw, build_case

    case = build_case(Draw(batch, 40, 9, 4, 3, 512, dtype="float32", data_seed=1))
    variant = targets.Variant(targets.get("sdpa"), "float32")
    (found,) = check_case(case, [variant], Options(fast_reference=True))
    assert found.status == "ok", found.detail


ROUNDS_HERE = (
    "this machine's CPU flash kernel rounds bf16 subnormals (its oneDNN runs no AVX512-BF16 "
    "or AMX code): no flush to claim, so none to show needed"
)


def test_the_flush_probe_says_no_flush_where_onednn_runs_avx2_code():
    """The probe measures the kernel, not a guess from the CPU: capped at AVX2 (oneDNN's
    ``ONEDNN_MAX_CPU_ISA``, which any x86 CPU honours) the kernel rounds, and the claims of
    sdpa and hf-sdpa then state no flush."""
    import subprocess
    import sys

    script = (
        "from exactattn import targets; from exactattn.targets.foreign import cpu_flash_flush;"
        "print(cpu_flash_flush(), targets.claim_for(targets.get('sdpa'), 'bfloat16').ftz)"
    )
    env = {**__import__("os").environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["None", "None"], out.stdout + out.stderr


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("seed", [0, 1])
def test_the_cpu_flash_kernels_flush_to_zero_is_claimed_where_measured_and_needed(seed):
    """Found by the default check (seed 0): SDPA's CPU flash backward returned bf16 dK = 0
    where the exact value is the bf16 subnormal 1.06e-38 (its oneDNN fp32 → bf16 casts on
    AVX512-BF16 flush subnormals; the math backend rounds them): where the probe measures a
    flush, ``ftz=bf16`` on the CPU claim charges each bf16 cast the smallest normal, and the
    same case fails the claim without it. Where the kernel rounds, the claim states no flush
    and still passes the case."""
    import numpy as np

    from exactattn.targets.foreign import cpu_flash_flush

    assert Claim.parse("ftz=bf16").ftz == "bfloat16" and Claim.parse("ftz=no").ftz is None
    with pytest.raises(ValueError, match="unknown number format"):
        Claim.parse("ftz=maybe")
    measured = cpu_flash_flush()
    assert measured in ("bfloat16", None)
    assert targets.claim_for(targets.get("sdpa"), "bfloat16").ftz == measured
    assert targets.claim_for(targets.get("sdpa"), "bfloat16", "cuda").ftz is None
    assert targets.claim_for(targets.get("sdpa-math"), "bfloat16").ftz is None
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 1, 40, 8)) * 2.0**-128  # dK = c·Σ γ q: bf16 subnormals
    k, v, g = (rng.standard_normal((1, 1, 40, 8)) for _ in range(3))
    case = Case(q, k, v, g, 512, mask={"kind": "causal", "align": "top-left"}, dtype="bfloat16")
    told = targets.Variant(targets.get("sdpa"), "bfloat16")
    (found,) = check_case(case, [told], Options(fast_reference=True))
    assert found.status == "ok", found.detail
    if measured is None:
        pytest.skip(ROUNDS_HERE)
    untold = targets.Variant(_without_probe(told.target), "bfloat16")
    (found,) = check_case(case, [untold], Options(fast_reference=True))
    assert found.status == "fail" and found.detail.startswith("dk["), found.detail


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("seed", [0, 3])
def test_the_cpu_flash_dq_key_block_parts_are_claimed_and_needed(seed):
    """Found by the default check (seed 0): fp16 dQ = −5.96e-8 where the exact value is
    −1.4e-8 — torch's CPU flash backward rounds dQ's part of each 512-key block to fp16
    and sums the parts in fp16 (parts 1.9e-8 and −3.3e-8 became 0 and −5.96e-8). The
    query-split claim charges them (one query row here: only dQ's parts are in play);
    without it the same case fails on dQ."""
    import numpy as np

    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((1, 1, 1, 64)) * 4e-6, rng.standard_normal((1, 1, 1100, 64)) * 4e-6
    v, g = rng.standard_normal((1, 1, 1100, 64)), rng.standard_normal((1, 1, 1, 64))
    case = Case(q, k, v, g, 512, dtype="float16")
    told = targets.Variant(targets.get("sdpa"), "float16")
    untold = targets.Variant(_without(told.target, qsplit=None), "float16")
    found = check_case(case, [told, untold], Options(fast_reference=True))
    assert [f.status for f in found] == ["ok", "fail"], [f.detail for f in found]
    assert found[1].detail.startswith("dq[")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("seed", [0, 3])
def test_the_cpu_flash_gemms_flush_before_the_scale_is_claimed_and_needed(seed, monkeypatch):
    """Found by ``check sdpa sdpa-math hf-sdpa --examples 2000``: bf16 dK = 0 where the
    exact value is ~2.1e-38, a bf16 *normal* number, so no cast flushed it: the CPU flash
    backward's GEMM sums γ·q before the scale c = 2 with fp32 subnormals flushed. ``ftz``
    therefore flushes the fp32 accumulator too (bf16's exponent range); with casts-only
    flushing the same decode case fails on dK. hf-sdpa calls the same kernel and claims it.
    Where the kernel rounds (the probe), the claim states no flush and passes the case."""
    import numpy as np

    from exactattn.backends.formats import number_format
    from exactattn.targets.foreign import cpu_flash_flush

    measured = cpu_flash_flush()
    assert targets.claim_for(targets.get("hf-sdpa"), "bfloat16").ftz == measured
    arith = targets.claim_for(targets.get("sdpa"), "bfloat16").arith(512)
    flushed = number_format("float32").p if measured else 0
    assert arith.acc.e_min == number_format("float32").e_min + flushed
    rng = np.random.default_rng(seed)
    q, g = rng.standard_normal((1, 1, 1, 64)), rng.standard_normal((1, 1, 1, 64))
    k, v = (rng.standard_normal((1, 1, 1100, 64)) for _ in range(2))
    case = Case(q, k, v, g, 512, scale=2.0, dtype="bfloat16")
    told = targets.Variant(targets.get("sdpa"), "bfloat16")
    (found,) = check_case(case, [told], Options(fast_reference=True))
    assert found.status == "ok", found.detail
    if measured is None:
        pytest.skip(ROUNDS_HERE)

    real = Claim.arith

    def casts_only(claim: Claim, block):
        a = real(claim, block)
        acc = dataclasses.replace(a.acc, e_min=number_format(a.acc.name).e_min)
        return dataclasses.replace(a, acc=acc)

    monkeypatch.setattr(Claim, "arith", casts_only)
    (found,) = check_case(case, [told], Options(fast_reference=True))
    assert found.status == "fail" and found.detail.startswith("dk["), found.detail
