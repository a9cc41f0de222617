"""ONNX's Attention as targets: ONNX Runtime's CPU kernel and the specification's reference.

Each passes the smoke check; what ONNX Runtime refuses (a negative scale, bfloat16) is a
skip quoting its message; the same target with a broken wrapper (the scale dropped, the
causal mask one key too wide) fails, so the check sees what the wrapper passes; causal masks
are top-left as the ``sdpa`` convention's ``is_causal``; opset 24 computes what opset 23
does; every reproducer of ``docs/zoo/`` for these targets runs.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from exactattn import targets
from exactattn.cases import Case
from exactattn.infra.optional import PACKAGES
from exactattn.testing.case_check import UNSUPPORTED, Options, check_case
from tests.optional import requires

requires("torch", "onnx", "onnxruntime", "flint")

import torch

from exactattn.targets import onnx_attention

ZOO = Path(__file__).resolve().parents[2] / "docs" / "zoo"
REPROS = sorted([*ZOO.glob("onnx_*.py"), *ZOO.glob("ort_*.py")])
CAUSAL = {"kind": "causal", "align": "top-left"}


def _case(dtype="float32", scale=None, mask=None, n_q=6, n_k=6):
    rng = np.random.default_rng(0)
    q, g = (rng.standard_normal((1, 2, n_q, 4)) for _ in range(2))
    k, v = (rng.standard_normal((1, 2, n_k, 4)) for _ in range(2))
    return Case(q, k, v, g, 4, scale=scale, mask=mask or {"kind": "none"}, dtype=dtype)


def _variant(name, dtype="float32", fn=None):
    target = targets.get(name)
    if fn is not None:  # the same target, claims and refusals, with another callable
        target = dataclasses.replace(target, name=fn.__name__, loader=lambda: fn)
    return targets.Variant(target, dtype)


def scale_dropped(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    return onnx_attention.ort_attention(query, key, value, attn_mask, is_causal, None, enable_gqa)


def causal_shifted(
    query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False
):
    if is_causal:  # each query also sees the key after its own
        n_q, n_k = query.shape[-2], key.shape[-2]
        attn_mask, is_causal = torch.ones(n_q, n_k, dtype=torch.bool).tril(diagonal=1), False
    return onnx_attention.ort_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(
    "name",
    [
        "ort-attention",
        # ~15 s; the 3-D path is bit-identical to the 4-D one (tested below) and its packing
        # is checked by a broken wrapper: the whole smoke check runs in the slow step
        pytest.param("ort-attention-3d", marks=pytest.mark.slow),
        "onnx-reference",
    ],
)
@pytest.mark.slow  # several seconds: the default run stays within its budget
def test_each_target_passes_the_smoke_check(name, capsys):
    from exactattn.commands.check import main

    assert main([name, "--profile", "smoke", "--no-determinism"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and f"{name}[float16]" in out


@pytest.mark.parametrize(
    ("dtype", "scale", "message"),
    [
        ("float32", -0.5, "scale must be greater than 0 if specified"),
        ("float16", -1.0, "scale must be greater than 0 if specified"),
        ("bfloat16", None, "NOT_IMPLEMENTED : Could not find an implementation for"),
    ],
)
def test_what_onnx_runtime_refuses_is_a_skip_with_its_message(dtype, scale, message):
    (found,) = check_case(_case(dtype, scale), [_variant("ort-attention", dtype)], Options())
    assert found.status == "skip", found.detail
    assert found.detail.startswith(UNSUPPORTED) and message in found.detail, found.detail


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_negative_scale_is_known_upstream_not_refused_in_the_reference():
    """The reference (and ONNX Runtime in float64, the function body) returns NaN: a fail that
    the one list of known bugs explains for these targets, not for a user's function."""
    from exactattn.testing.known import UPSTREAM_STATUS, reclassify

    case = _case("float64", -1.0)
    user = targets.Variant(targets.from_callable(onnx_attention.onnx_reference), "float64")
    variants = [_variant("onnx-reference", "float64"), _variant("ort-attention", "float64"), user]
    found = check_case(case, variants, Options())
    assert [f.status for f in found] == ["fail"] * 3, [f.detail for f in found]
    verdicts = [reclassify(u, case, f) for u, f in zip(variants, found)]
    assert [v.status for v in verdicts] == [UPSTREAM_STATUS, UPSTREAM_STATUS, "fail"]
    assert {v.detail for v in verdicts[:2]} == {onnx_attention.NEGATIVE_SCALE}


def heads_packed_last(
    query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False
):
    """3-D inputs with each token's columns head-minor, (B, n, E·H), where ONNX reads H·E."""
    flat = [x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1) for x in (query, key, value)]
    unpacked = [
        x.reshape(x.shape[0], x.shape[1], h, -1).transpose(1, 2)
        for x, h in zip(flat, (query.shape[1], key.shape[1], value.shape[1]))
    ]  # read back as ONNX reads them: the columns in the wrong heads
    return onnx_attention.ort_attention_packed(*unpacked, attn_mask, is_causal, scale, enable_gqa)


def _gqa_case(n_q=5, n_k=7):
    rng = np.random.default_rng(1)
    q, g = (rng.standard_normal((1, 4, n_q, 4)) for _ in range(2))
    k, v = (rng.standard_normal((1, 2, n_k, 4)) for _ in range(2))
    return Case(q, k, v, g, 4, mask=CAUSAL, dtype="float32")


def test_the_3d_inputs_compute_what_the_4d_ones_do():
    """The same kernel after its own head split: the outputs agree to the last bit on GQA."""
    case = _gqa_case()
    y = {}
    for fn in (onnx_attention.ort_attention, onnx_attention.ort_attention_packed):
        q, k, v = (torch.from_numpy(x).float() for x in (case.q, case.k, case.v))
        y[fn] = fn(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(*y.values())


@pytest.mark.parametrize(
    ("broken", "case"),
    [
        (heads_packed_last, _gqa_case()),
        (scale_dropped, _case(scale=2.0)),
        (causal_shifted, _case(mask=CAUSAL)),
        (causal_shifted, _case(mask=CAUSAL, n_q=3, n_k=7)),
    ],
)
def test_a_broken_wrapper_is_caught(broken, case):
    name = "ort-attention-3d" if broken is heads_packed_last else "ort-attention"
    told = [_variant(name), _variant(name, fn=broken)]
    found = check_case(case, told, Options())
    assert [f.status for f in found] == ["ok", "fail"], [f.detail for f in found]


@pytest.mark.parametrize("runner", ["ort", "reference"])
@pytest.mark.parametrize(("n_q", "n_k"), [(3, 7), (1, 5), (7, 3)])
def test_is_causal_is_top_left_as_the_sdpa_convention_passes_it(runner, n_q, n_k):
    rng = np.random.default_rng(1)
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 2, n, 4), dtype=np.float32))
               for n in (n_q, n_k, n_k))  # fmt: skip
    top_left = torch.ones(n_q, n_k, dtype=torch.bool).tril()
    causal = onnx_attention.attention(runner, q, k, v, is_causal=True)
    masked = onnx_attention.attention(runner, q, k, v, attn_mask=top_left.expand(1, 2, n_q, n_k))
    torch.testing.assert_close(causal, masked, rtol=0, atol=2e-7)


@pytest.mark.parametrize("runner", ["ort", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_opset_24_computes_what_opset_23_does(runner, dtype):
    rng = np.random.default_rng(2)
    q = torch.from_numpy(rng.standard_normal((2, 4, 5, 8))).to(dtype)
    k, v = (torch.from_numpy(rng.standard_normal((2, 2, 9, 8))).to(dtype) for _ in range(2))
    mask = torch.from_numpy(rng.random((2, 4, 5, 9)) < 0.7)
    for kwargs in ({"is_causal": True, "scale": 0.25}, {"attn_mask": mask}):
        y23, y24 = (
            onnx_attention.attention(runner, q, k, v, enable_gqa=True, opset=opset, **kwargs)
            for opset in (23, 24)
        )
        assert torch.equal(y23, y24)


def _extras(path: Path) -> list[str]:
    """The optional packages a reproducer imports (its extra: it is skipped without it)."""
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            tops |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            tops.add(node.module.partition(".")[0])
    return sorted(tops & set(PACKAGES))


@pytest.mark.parametrize("path", REPROS, ids=[p.name for p in REPROS])
def test_each_reproducer_runs(path):
    requires(*_extras(path))
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_there_is_a_reproducer_for_each_known_upstream_bug_of_these_targets():
    from exactattn.testing.known import UPSTREAM

    for name in {*targets.get("ort-attention").options.known,
                 *targets.get("onnx-reference").options.known}:  # fmt: skip
        assert (ZOO.parents[1] / UPSTREAM[name].report.split()[0]).exists(), name


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_float64_empty_row_nan_is_known_upstream_for_onnx_runtime_only(capsys):
    """Found by ``exactattn zoo``: a decode row whose bias is -inf on every key."""
    from exactattn.commands.check import main

    replay = str(
        Path(__file__).resolve().parents[1]
        / "regressions"
        / "onnx_attention_empty_row_float64.json"
    )
    assert main(["ort-attention", "--replay", replay]) == 0
    assert "KNOWN-UPSTREAM ort-attention[float64]" in capsys.readouterr().out
