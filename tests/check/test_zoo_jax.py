"""JAX's ``jax.nn.dot_product_attention`` as the ``jax-xla`` target, gradients through jax.vjp.

* the smoke check passes with gradients; v ≠ d is a skip with JAX's own message;
* its broken twins fail: a key mask shifted by one, dK scaled by 1 + 2^-7;
* the claim's two JAX-specific roundings are needed: ``dp=input`` (dP = G·Vᵀ in bfloat16)
  and ``ftz=bfloat16`` (XLA's CPU runtime flushes subnormals): each replayed case passes
  with it and fails without;
* float16 under jit and bfloat16's degenerate dots are ``KNOWN-UPSTREAM`` (replays exit 0);
* each reproducer in ``docs/zoo/jax_*.py`` runs (and still reproduces).

JAX compiles per shape: the cases here use few shapes.
"""

from __future__ import annotations

import dataclasses
import runpy
from pathlib import Path

import numpy as np
import pytest

from exactattn import targets
from exactattn.cases import Case, Draw, build_case
from exactattn.commands.check import main
from exactattn.testing.case_check import UNSUPPORTED, Options, check_case
from exactattn.testing.known import UPSTREAM, reclassify
from tests.optional import requires

requires("torch", "jax")

import torch

from exactattn.targets import jax_attention

ROOT = Path(__file__).resolve().parents[2]
ZOO = sorted((ROOT / "docs" / "zoo").glob("jax_*.py"))
FP16_JIT = ROOT / "tests" / "regressions" / "jax_fp16_jit_precision.json"
BF16_ELEMENTAL = ROOT / "tests" / "regressions" / "jax_bf16_elemental_dot.json"
EXACT = Options(sampled=False, fast_reference=True)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _variant(fn=None, dtype="float32", **claim) -> targets.Variant:
    target = targets.get("jax-xla")
    if fn is not None:
        target = dataclasses.replace(target, loader=lambda: fn)
    if claim:
        target = dataclasses.replace(target, claim=dataclasses.replace(target.claim, **claim))
    return targets.Variant(target, dtype)


def _case(dtype="float32", v=8, **kwargs) -> Case:
    return build_case(Draw((1, 2), 6, 11, 8, v, 512, dtype=dtype, data_seed=1, **kwargs))


@pytest.mark.slow  # several seconds: the default run stays within its budget
def test_the_smoke_check_passes_with_gradients(capsys):
    assert main(["jax-xla", "--profile", "smoke", "--dtypes", "float32", "float64"]) == 0
    out = capsys.readouterr().out
    assert "gradients on" in out and "FAIL" not in out


def test_the_claim_is_naive_float32_softmax_with_dp_and_flushes():
    claim = targets.claim_for(targets.get("jax-xla"), "bfloat16")
    assert (claim.scores, claim.stats, claim.p, claim.dp, claim.block) == (
        "float32", "float32", "bfloat16", "bfloat16", 0,
    )  # fmt: skip
    assert claim.flushed() == ("float32", "bfloat16")  # XLA's CPU runtime flushes float32's
    wide = targets.claim_for(targets.get("jax-xla"), "float64").arith(8)
    assert wide.compute.name == "float32" and wide.output.name == "float64" and wide.p is None


def test_v_unlike_d_is_a_skip_with_jax_reason():
    (found,) = check_case(_case(v=5), [_variant()], EXACT)
    assert found.status == "skip", found.detail
    assert found.detail.startswith(UNSUPPORTED) and "value shape should be" in found.detail


def test_float64_runs_in_a_scoped_x64_mode():
    import jax

    (found,) = check_case(_case("float64"), [_variant(dtype="float64")], EXACT)
    assert found.status == "ok", found.detail
    assert not jax.config.jax_enable_x64  # the caller's setting is left as it was


def shifted_mask(query, key, value, attn_mask=None, is_causal=False, **kwargs):
    """jax-xla with its key mask shifted by one key (a causal mask reaches one key ahead)."""
    n_q, n_k = query.shape[-2], key.shape[-2]
    if is_causal:
        attn_mask = torch.ones(n_q, n_k, dtype=torch.bool).tril(1)
    elif attn_mask is not None:
        attn_mask = attn_mask.roll(1, dims=-1)
    return jax_attention.xla_attention(query, key, value, attn_mask, **kwargs)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * (1 + 2.0**-7)


def scaled_dk(query, key, value, attn_mask=None, **kwargs):
    """jax-xla with dK scaled by 1 + 2^-7 on its way back."""
    return jax_attention.xla_attention(query, _ScaleGrad.apply(key), value, attn_mask, **kwargs)


@pytest.mark.parametrize(
    "broken, mask, output",
    [(shifted_mask, {"kind": "causal"}, "y"), (scaled_dk, {"kind": "none"}, "dk")],
)
def test_a_broken_wrapper_is_caught(broken, mask, output):
    case = _case(mask=mask)
    good, bad = check_case(case, [_variant(), _variant(broken)], EXACT)
    assert good.status == "ok", good.detail
    assert bad.status == "fail" and bad.detail.startswith(f"{output}["), bad.detail


def test_dp_in_the_input_dtype_is_claimed_and_needed():
    """Found by the default check (dQ 1.1× past the bound at n_k = 1428): the P·V einsum's
    transpose returns dP in bfloat16 (docs/zoo/jax_bf16_dp_rounding.py)."""
    case = build_case(Draw((1, 1), 4, 64, 16, 16, 512, dtype="bfloat16", data_seed=2))
    told, untold = _variant(dtype="bfloat16"), _variant(dtype="bfloat16", dp=None)
    found = check_case(case, [told, untold], EXACT)
    assert [f.status for f in found] == ["ok", "fail"], [f.detail for f in found]
    assert found[1].detail.startswith("dk[")


def test_the_cpu_flush_to_zero_is_claimed_and_needed():
    """Found by the default check (bfloat16 dK = 0 for an exact 4.86e-38): XLA's CPU runtime
    flushes subnormals (docs/zoo/jax_cpu_flush_to_zero.py). Keys 0, so p = 1/64 and the
    exact dK_j = ±c·2^-128, a bfloat16 subnormal that comes back 0."""
    n, e0 = 64, np.eye(8)[0]
    q, g = np.tile(2.0**-128 * e0, (1, 1, n, 1)), np.tile(e0, (1, 1, n, 1))
    v = g * np.where(np.arange(n) % 2, -1.0, 1.0)[:, None]
    case = Case(q, 0 * q, v, g, 512, dtype="bfloat16")
    told, untold = _variant(dtype="bfloat16"), _variant(dtype="bfloat16", ftz=None)
    found = check_case(case, [told, untold], EXACT)
    assert [f.status for f in found] == ["ok", "fail"], [f.detail for f in found]
    assert found[1].detail.startswith("dk[") and "(got 0," in found[1].detail


def test_the_float32_flush_is_claimed_and_needed():
    """Found by exactattn zoo (tests/regressions/jax_cpu_float32_flush.json): logits of
    thousands make p subnormal, the float32 softmax flushes it, and dK = 0 for an exact
    2.6e-37; a claim flushing only bfloat16 casts and float32 accumulators fails there."""
    case = Case.from_json(
        (ROOT / "tests" / "regressions" / "jax_cpu_float32_flush.json").read_text()
    )
    told, untold = _variant(dtype="float32"), _variant(dtype="float32", ftz="bfloat16")
    found = check_case(case, [told, untold], EXACT)
    assert [f.status for f in found] == ["ok", "fail"], [f.detail for f in found]
    assert found[1].detail.startswith("dk[") and "(got 0," in found[1].detail


@pytest.mark.parametrize(
    "replay, bug", [(FP16_JIT, "jax-cpu-fp16-jit"), (BF16_ELEMENTAL, "jax-cpu-bf16-elemental-dot")]
)
def test_the_jit_failures_are_known_upstream(replay, bug, capsys):
    assert main(["jax-xla", "--replay", str(replay)]) == 0
    assert "KNOWN-UPSTREAM jax-xla[" in capsys.readouterr().out
    case = Case.from_json(replay.read_text())
    variant = _variant(dtype=case.dtype)
    (found,) = check_case(case, [variant], EXACT)
    assert reclassify(variant, case, found).detail == bug
    assert (ROOT / UPSTREAM[bug].replay).exists() and "docs/zoo/" in UPSTREAM[bug].report
    user = targets.Variant(targets.from_callable(jax_attention.xla_attention), case.dtype)
    assert reclassify(user, case, check_case(case, [user], EXACT)[0]).status == "fail"


def test_jax_cudnn_is_skipped_here_with_its_reason():
    why = targets.unavailable(targets.get("jax-cudnn"))
    if why is None:
        pytest.skip("a CUDA device and JAX's GPU backend are here")
    assert "CUDA" in why or "GPU" in why


@pytest.mark.parametrize("script", ZOO, ids=[p.stem for p in ZOO])
def test_each_reproducer_runs_and_reproduces(script, capsys):
    assert len(script.read_text().splitlines()) <= 20
    runpy.run_path(str(script), run_name="__main__")  # SystemExit: no longer reproduced
    assert capsys.readouterr().out
