"""Score modification in the checked cases (issue 12 item 1, issue 15 item 3).

The bias of each kind is written from its definition (:mod:`exactattn.cases.spec`) and
checked here against numbers worked by hand; each kind reaches the judge on exactattn's
own targets and on SDPA; a target that ignores the bias, one that soft-caps after the bias
and a reference that drops a score_mod's slope are each caught; a user's program (a
document mask with ALiBi) runs through ``exactattn check``; bad programs are clear errors.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from exactattn import targets
from exactattn.cases import Case, Draw, build_case, spec
from exactattn.testing.case_check import Options, check_case
from tests.optional import requires

PROGRAM = "tests.check.program_mods"
KINDS = {
    "alibi": ({"kind": "alibi", "form": "abs", "align": "bottom-right"}, None),
    "alibi-causal": ({"kind": "alibi", "form": "causal", "align": "top-left"}, None),
    "t5": ({"kind": "t5", "buckets": 8, "max_distance": 16}, None),
    "dense": ({"kind": "dense", "shape": "per_head", "empty_row": True}, None),
    "softcap": ({"kind": "none"}, 2.0),
    "softcap+bias": ({"kind": "dense", "shape": "shared"}, 20.0),
}


def _case(kind: str, **changes) -> Case:
    score, cap = KINDS[kind]
    draw = Draw((2, 2), 5, 6, 3, 2, 2, score=score, softcap=cap, data_seed=7)
    return build_case(dataclasses.replace(draw, **changes))


# --- the specification ---------------------------------------------------------------------
def test_alibi_and_t5_biases_by_hand():
    abs_tl = spec.bias({"kind": "alibi", "slopes": [0.5], "form": "abs"}, (), 2, 3)
    assert abs_tl.tolist() == [[0, -0.5, -1], [-0.5, 0, -0.5]]
    causal_br = {"kind": "alibi", "slopes": [1, 2], "form": "causal", "align": "bottom-right"}
    assert spec.bias(causal_br, (1, 2), 1, 3).tolist() == [[[-2, -1, 0]], [[-4, -2, 0]]]
    # T5, 8 buckets, max distance 16: 4 per sign, exact below 2, log-spaced to 16 (by hand)
    rel = np.array([0, -1, 1, -2, -5, -8, -100, 2, 100])
    assert spec.t5_bucket(rel, 8, 16).tolist() == [0, 1, 5, 2, 2, 3, 3, 6, 7]
    t5 = {"kind": "t5", "table": [[10, 11, 12, 13, 14, 15, 16, 17]], "max_distance": 16}
    assert spec.bias(t5, (), 2, 2).tolist() == [[10, 15], [11, 10]]


def test_rows_excluded_by_the_bias_follow_the_empty_row_policy():
    case = _case("dense")
    assert (case.bias[..., 0, :] == -math.inf).all() and case.empty_rows == "zero"
    assert not case.attended()[..., 0, :].any() and case.allowed()[..., 0, :].all()
    assert _case("alibi").empty_rows == "error"


def test_cases_with_a_bias_replay_and_old_files_still_load():
    case = _case("dense")
    again = Case.from_json(case.to_json())
    assert np.array_equal(again.bias, case.bias) and again.score == case.score
    assert again.describe() == case.describe() and "dense bias" in case.describe()
    old = json.loads(case.to_json())
    for name in ("bias", "softcap", "score", "score_mod"):
        old.pop(name)
    old["shape"].pop("bias")
    legacy = Case.from_json(json.dumps(old))
    assert legacy.bias is None and legacy.softcap is None and not legacy.modified


def test_the_strategies_draw_each_modification_for_a_fair_share():
    from hypothesis import HealthCheck, given, settings

    from exactattn.cases.strategies import draws

    seen: list[str] = []

    @settings(
        max_examples=300, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    @given(draws())
    def collect(draw):
        seen.append(draw.score["kind"] + ("+cap" if draw.softcap else ""))

    collect()
    shares = {kind: seen.count(kind) / len(seen) for kind in set(seen)}
    assert 0.3 < shares["none"] < 0.8, shares
    for kind in ("alibi", "t5", "dense", "none+cap"):
        assert shares.get(kind, 0) > 0.03, shares


# --- reaching the judge ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_is_judged_with_its_gradient(kind):
    requires("flint", "torch")
    case = _case(kind, dtype="float64")
    units = [targets.variant(n, dtype="float64") for n in ("exactattn", "sdpa")]
    units += [targets.variant("np-fp64")]
    found = {f.target: f for f in check_case(case, units, Options(grads=True))}
    for name in ("exactattn[float64]", "np-fp64"):
        assert found[name].status == "ok", found[name].detail
        assert ("dbias" in found[name].errors) == (case.bias is not None)
    sdpa = found["sdpa[float64]"]
    if case.softcap is None:
        assert sdpa.status == "ok", sdpa.detail
    else:
        assert sdpa.status == "skip" and "soft-cap" in sdpa.detail


def test_capabilities_parse_the_new_keys():
    caps = targets.Capabilities.parse("bias=no,softcap=yes,program=yes")
    assert caps.bias == "not supported (--supports)" and caps.softcap is True and caps.program
    unit = targets.Variant(targets.get("np-fp64"), "float64")
    case = _case("alibi")
    assert unit.unsupported(case) is None
    refusing = dataclasses.replace(unit.target, caps=caps)
    assert targets.Variant(refusing, "float64").unsupported(case) == (
        "bias: not supported (--supports)"
    )


# --- broken variants are caught ----------------------------------------------------------------
def _torch_attention(**dropped):
    def fn(q, k, v, **keywords):
        from exactattn.torch import attention  # at the call: collection needs no torch

        return attention(q, k, v, **{**keywords, **dropped})

    return fn


def _softcap_after_bias(q, k, v, *, scale=None, bias=None, softcap=None, mask=None, **_):
    import torch

    c = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = c * q @ k.transpose(-1, -2) + bias  # the bias first: the wrong order
    s = softcap * torch.tanh(s / softcap)
    return torch.softmax(s, dim=-1) @ v


@pytest.mark.parametrize(
    ("kind", "broken", "grads"),
    [
        ("alibi", _torch_attention(bias=None), True),
        ("t5", _torch_attention(bias=None), False),
        ("softcap+bias", _softcap_after_bias, False),
        ("softcap", _torch_attention(softcap=None), False),
    ],
)
def test_a_target_that_mishandles_the_modification_fails(kind, broken, grads):
    requires("flint", "torch")
    case = build_case(
        dataclasses.replace(
            Draw((2, 2), 5, 6, 3, 2, 2),
            score=KINDS[kind][0],
            softcap=KINDS[kind][1],
            dtype="float64",
            data_seed=1,
        )
    )
    target = targets.from_callable(broken, convention="exactattn", name="broken")
    [finding] = check_case(case, [targets.Variant(target, "float64")], Options(grads=grads))
    assert finding.status == "fail", finding.detail
    honest = targets.from_callable(_torch_attention(), convention="exactattn", name="honest")
    [finding] = check_case(case, [targets.Variant(honest, "float64")], Options(grads=grads))
    assert finding.status == "ok", finding.detail


def test_a_reference_that_drops_the_score_mods_slope_is_caught(monkeypatch):
    requires("flint", "torch")
    from exactattn.oracle import certified

    case = build_case(Draw((1, 2), 4, 4, 2, 2, 2, score_mod=f"{PROGRAM}:capped", data_seed=3))
    flint = targets.variant("flint")
    [finding] = check_case(case, [flint], Options(grads=True, sampled=False))
    assert finding.status == "ok", finding.detail
    modified = certified._Block._modified

    def slope_one(self, s):
        value, _ = modified(self, s)
        return value, [certified._ONE] * len(value)

    monkeypatch.setattr(certified._Block, "_modified", slope_one)
    [finding] = check_case(case, [flint], Options(grads=True, sampled=False))
    assert finding.status == "fail" and finding.detail.startswith(("dq", "dk")), finding.detail


def test_a_non_additive_program_is_judged_by_enclosures_only():
    requires("flint", "torch")
    case = build_case(Draw((1, 2), 4, 4, 2, 2, 2, score_mod=f"{PROGRAM}:capped", data_seed=3))
    found = check_case(case, [targets.variant("np-fp64")], Options(grads=True))
    assert found[0].status == "skip" and "not an additive bias" in found[0].detail


# --- a user's program --------------------------------------------------------------------------
def test_a_document_mask_with_alibi_runs_through_check():
    requires("flint", "torch")
    from exactattn.testing import session

    settings = session.Settings(
        examples=12, max_n=12, determinism=False, baselines=False, probes=False,
        program=(f"{PROGRAM}:document_mask", f"{PROGRAM}:alibi"),
    )  # fmt: skip
    chosen = [targets.get(n) for n in ("np-fp64", "flint", "exactattn", "sdpa")]
    result = session.run(chosen, settings)
    counts, skips = result.report.counts, result.report.skips
    assert not result.report.failures, result.report.failures
    assert counts["np-fp64"]["ok"] > 0 and counts["flint"]["ok"] > 0
    assert any("takes no score_mod" in why for why in skips["exactattn[float32]"])
    assert any("runs no FlexAttention program" in why for why in skips["sdpa[float32]"])


@pytest.mark.slow  # FlexAttention compiles (~10 s each)
def test_flex_on_a_users_program_and_a_flex_that_ignores_the_score_mod():
    requires("flint", "torch")
    from exactattn.targets import flex_convention
    from exactattn.testing import session

    settings = session.Settings(
        examples=6, max_n=12, dtypes=("float32",), determinism=False, baselines=False,
        probes=False, program=(f"{PROGRAM}:document_mask", f"{PROGRAM}:alibi"),
    )  # fmt: skip
    result = session.run([targets.get("flex")], settings)
    assert not result.report.failures and result.report.counts["flex[float32]"]["ok"] > 0
    honest = flex_convention._score_mod
    try:
        flex_convention._score_mod = lambda case, held, padded, device: honest(
            dataclasses.replace(case, score_mod=None), held, padded, device
        )
        result = session.run([targets.get("flex")], settings)
    finally:
        flex_convention._score_mod = honest
    assert result.report.failures


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--score-mod", f"{PROGRAM}:nothing"], "has no attribute 'nothing'"),
        (["--score-mod", f"{PROGRAM}:not_callable"], "is a int, not a function"),
        (["--score-mod", "no_such_module_here:f"], "cannot import 'no_such_module_here'"),
        (["--score-mod", f"{PROGRAM}:torch_only"], "exactattn.ops.tanh"),
        (["--mask-mod", f"{PROGRAM}:alibi"], "--mask-mod"),
    ],
)
def test_bad_programs_are_clear_errors(argv, expected, capsys):
    requires("torch")
    from exactattn.commands import check

    assert check.main(["np-fp64", "--examples", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert expected in err, err


def test_module_fn_finds_modules_in_the_current_directory(tmp_path):
    (tmp_path / "user_prog_here.py").write_text("def mask(b, h, i, j):\n    return j <= i\n")
    code = (
        "import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
        "from exactattn.infra.loading import load_callable\n"
        "print(load_callable('user_prog_here:mask').__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == "mask", out.stderr
