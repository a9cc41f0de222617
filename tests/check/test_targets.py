"""The registry: names, claims, capabilities, user targets, and the built-in foreign targets.

Each built-in target available here passes a short check (the measured tables come from
``exactattn check ... --examples 2000``; see docs/check.md); FlexAttention's compile makes its
check slow. The registry lists without importing torch.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from exactattn import targets
from exactattn.targets import Capabilities, Claim
from exactattn.testing import session
from tests.optional import requires


def test_names_are_unique_and_described():
    registry = targets.registry()
    assert len(registry) == len(set(registry)) >= 25
    assert all(t.description for t in registry.values())
    for name in ("np-fa2-fp16", "torch-fa2-bf16", "mp11", "sdpa", "sdpa-math", "flex", "hf-eager"):
        assert name in registry


def test_listing_imports_no_optional_package():
    code = (
        "import sys, exactattn.targets as t\n"
        "t.names(); t.get('mp37'); t.get('np-fp32').claim\n"
        "assert not {'torch', 'transformers'} & set(sys.modules), sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_check_list_imports_no_optional_package():
    """``exactattn check --list`` names every target and why one cannot run without
    importing torch, transformers or triton (it took 6.6 s on an idle machine when it did)."""
    code = (
        "import sys, contextlib, io\n"
        "from exactattn.commands import check\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    assert check.main(['--list']) == 0\n"
        "assert 'sdpa ' in out.getvalue() and 'flex ' in out.getvalue()\n"
        "assert not {'torch', 'transformers', 'triton'} & set(sys.modules), sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_claims_parse_and_resolve():
    claim = Claim.parse("input=fp16,scores=fp32,stats=fp32,p=fp16,acc=fp32,block=128")
    assert claim == Claim("float16", "float32", "float32", "float16", "float32", 128)
    assert Claim.parse(claim.as_text()) == claim
    assert Claim().resolve("bfloat16") == Claim(*["bfloat16"] * 5, None)
    assert Claim().bound_block(50) is None and Claim(block=0).bound_block(50) == 50
    for bad in ("input=fp12", "speed=fast", "block=big", "scores"):
        with pytest.raises(ValueError):
            Claim.parse(bad)


def test_a_finer_accumulator_is_the_arithmetic_s():
    """A claim whose sums are finer than its compute format (fp16 scores from an fp32 GEMM,
    ONNX Runtime's fp16 Attention) bounds them in that format, as Arith.claim reads the same
    text; clamped to the compute format, 46% of ort-attention[float16]'s default-profile
    bounds were vacuous."""
    from exactattn.error.bounds import Arith

    text = "input=fp16,scores=fp16,stats=fp32,p=fp16,acc=fp32,block=64"
    arith = Claim.parse(text).resolve("float16").arith(64)
    assert (arith.compute.name, arith.acc.name) == ("float16", "float32")
    assert arith.acc == Arith.claim(text).acc


def test_an_accumulator_finer_than_the_scores_is_kept():
    """bf16 scores of an fp32 GEMM (OpenVINO's unfused MatMul): the products are summed in
    fp32 and rounded once into bf16, not every sum bounded in bf16."""
    arith = Claim("float32", "bfloat16", "float32", "bfloat16", "float32", 0).arith(64)
    assert (arith.compute.name, arith.acc.name, arith.p) == ("bfloat16", "float32", None)
    coarse = Claim("float32", "float32", "float32", "float32", "bfloat16", 0).arith(64)
    assert coarse.acc.name == "bfloat16"


def test_capabilities_parse():
    caps = Capabilities.parse("masks=none+causal,gqa=no,dropout=own,dtypes=bf16+fp16")
    assert caps.masks == ("none", "causal") and caps.dtypes == ("bfloat16", "float16")
    assert caps.gqa == "not supported (--supports)" and caps.dropout == "own"
    with pytest.raises(ValueError, match="--supports"):
        Capabilities.parse("colour=blue")


def test_supports_reads_dtypes_as_dtypes_does():
    """``dtypes=float32+float16`` and ``dtypes="float32 float16"`` are one list, read by the
    parser of ``--dtypes`` (which takes ``+`` too); an unknown name is named."""
    from exactattn.backends.formats import format_names

    joined = Capabilities.parse("dtypes=float32+fp16").dtypes
    assert joined == Capabilities.parse("dtypes=float32 float16").dtypes == ("float32", "float16")
    assert format_names(["float32", "fp16+bf16"]) == ("float32", "float16", "bfloat16")
    with pytest.raises(ValueError, match="'float17'"):
        Capabilities.parse("dtypes=float32+float17")
    with pytest.raises(ValueError, match="no format"):
        format_names(" + ")


def test_claims_of_the_built_in_targets():
    """Each claim follows its documented source (see exactattn.targets.foreign); SDPA's
    ``ftz`` is measured by running torch (its probe), hence torch."""
    requires("torch")
    assert targets.claim_for(targets.get("sdpa-math"), "bfloat16") == Claim(
        "bfloat16", *["float32"] * 4, 0, group="bfloat16"
    )
    flash = targets.claim_for(targets.get("sdpa-flash"), "float16")
    assert (flash.scores, flash.p, flash.acc, flash.block) == ("float32", "float16", "float32", 512)
    eager = targets.claim_for(targets.get("hf-eager"), "float64")
    assert (eager.scores, eager.stats, eager.p) == ("float64", "float32", "float32")
    assert targets.claim_for(targets.get("sdpa"), "float32", "cuda").block is None


def test_the_numpy_fa2_claim_rounds_p_to_float16():
    assert targets.claim_for(targets.get("np-fa2-fp16"), "float16").p == "float16"


def test_unsupported_cases_are_skipped_with_reasons():
    requires("torch")
    from exactattn.cases import Draw, build_case

    flash = targets.Variant(targets.get("sdpa-flash"), "float32")
    assert flash.unsupported(build_case(Draw((1, 1), 3, 3, 2, 3, 2, dtype="float32"))) == (
        "needs v == d"
    )
    case = build_case(Draw((1, 1), 3, 3, 2, 2, 2, dropout_p=0.5, seed=1, dtype="float32"))
    assert flash.unsupported(case) == "dropout: the CPU flash kernel takes no dropout"
    eager = targets.Variant(targets.get("hf-eager"), "float32")
    empty = {"kind": "dense", "empty_row": True}
    why = eager.unsupported(build_case(Draw((1, 1), 3, 3, 2, 2, 2, mask=empty, dtype="float32")))
    assert why.startswith("rows with no allowed key")


def _same(a, b) -> bool:
    """Equal outputs: arrays bit for bit (NaN too), object arrays entry for entry, pairs."""
    if isinstance(a, str):
        return a == b
    if isinstance(a, tuple):
        return isinstance(b, tuple) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == object:
        return all(x == y for x, y in zip(a.flat, b.flat))
    return np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize(
    "name", ["np-fp16", "np-naive-fp32", "torch-bf16", "mp11", "sympy", "flint", "emu11-rn"]
)
def test_the_api_convention_reads_no_backend_family(name):
    """Each context converts the case in and its outputs out: the family ``Options.backend``
    names changes nothing (a strided GQA case with a bias, a soft-cap and a scale)."""
    from dataclasses import replace

    from exactattn.cases import Draw, build_case

    variant = targets.variant(name)
    if targets.unavailable(variant.target):
        pytest.skip(targets.unavailable(variant.target))
    draw = Draw((1, 2), 2, 3, 2, 2, 2, group=2, layout="strided", data_seed=3)
    case = build_case(replace(draw, score={"kind": "alibi", "slopes": [0.5]}, softcap=5.0))
    case = replace(case, scale=0.375)
    assert case.bias is not None and case.softcap == 5.0 and case.group == 2
    unnamed = replace(variant.target, options=replace(variant.target.options, backend=None))
    anonymous = targets.Variant(unnamed, variant.dtype, variant.device)
    named, found = (v.run(case, v.held(case), grads=True) for v in (variant, anonymous))
    assert named.keys() == found.keys() >= {"y", "lse", "dq", "dk", "dv", "dbias"}
    assert all(_same(named[x], found[x]) for x in named)


BUILTIN = ["sdpa", "sdpa-math", "sdpa-flash", "exactattn", "hf-sdpa", "hf-eager"]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", BUILTIN)
def test_a_built_in_target_passes_a_short_check(name):
    target = targets.get(name)
    why = targets.unavailable(target)
    if why is not None:
        pytest.skip(f"{name}: {why}")
    settings = session.Settings(examples=40, max_n=10, determinism=False, probes=False)
    result = session.run([target], settings)
    # torch's NaN for is_causal with a negative scale is KNOWN-UPSTREAM (not a failure), its
    # GQA backward's fp16 group sums are in its claim (group=input): nothing is excused here
    assert not result.report.failures, [f.detail for f, _ in result.report.failures]
    assert sum(c["ok"] for c in result.report.counts.values()) >= 5


def _guarded(x):
    """What a static-shape compile guards on in a mod and what it captures: a function's
    code and its closure, a tensor's shape and dtype (its values are inputs), a list's
    items, a Python constant's value."""
    if hasattr(x, "shape"):
        return ("tensor", tuple(x.shape), x.dtype)
    if hasattr(x, "__code__"):
        return (x.__code__, tuple(_guarded(c.cell_contents) for c in x.__closure__ or ()))
    if isinstance(x, (list, tuple)):
        return tuple(_guarded(y) for y in x)
    return x if isinstance(x, (int, float, bool, str, type(None))) else type(x).__name__


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_flex_passes_a_short_check_with_bounded_compiles(monkeypatch):
    """One compile per bucket: the calls' padded shapes, dtype, score_mod and GQA flag are
    what a static-shape compile is keyed on; more compiles than distinct keys is a
    recompile per case, and some calls must reuse a kernel."""
    from exactattn.targets import flex_convention

    target = targets.get("flex")
    why = targets.unavailable(target)
    if why is not None:
        pytest.skip(f"flex: {why}")
    keys, real = set(), flex_convention._compiled

    def spying(fn):
        compiled = real(fn)

        def call(*tensors, score_mod, block_mask, **keywords):
            shapes = tuple(tuple(t.shape) for t in tensors)
            mods = (_guarded(score_mod), _guarded(block_mask.mask_mod))
            keys.add((shapes, tensors[0].dtype, mods, keywords.get("enable_gqa")))
            return compiled(*tensors, score_mod=score_mod, block_mask=block_mask, **keywords)

        return call

    monkeypatch.setattr(flex_convention, "_compiled", spying)
    settings = session.Settings(examples=40, max_n=12, probes=False)
    result = session.run([target], settings)
    assert not result.report.failures, [f.detail for f, _ in result.report.failures]
    assert 0 < result.compile["compiles"] <= len(keys)
    assert result.compile["runs"] > 0
    skipped = {why for c in result.report.grads_skipped.values() for why in c}
    assert skipped == {"torch 2.13 has no FlexAttention backward on the CPU"}
