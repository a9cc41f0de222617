"""``exactattn check --discover``: the flags it prints leave out exactly what a function
refuses, so the check then has no FAIL from an unsupported input, and never hides a wrong
answer behind a flag."""

from __future__ import annotations

import pytest

from exactattn import targets
from exactattn.commands.check import main
from exactattn.targets import Capabilities
from exactattn.targets.resolve import user_capabilities
from exactattn.testing.discover import discover, supports_text
from tests.optional import requires

requires("torch", "flint")

KERNELS = "tests.check.refusing_kernels"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(
    ("function", "flags"),
    [
        ("no_dropout", "dtypes=float64+float32+float16,dropout=no"),
        ("no_negative_scale", "negative_scale=no"),
        ("detached", "dtypes=float64+float32+float16,grads=no"),
        ("nan_on_empty_rows", "empty_rows=no"),
    ],
)
def test_the_printed_flags_leave_out_what_the_function_refuses(function, flags, capsys):
    spec = f"{KERNELS}:{function}"
    assert supports_text(discover(targets.get(spec))) == flags
    assert main([spec, "--discover"]) == 0
    assert (
        f"flags: exactattn check {spec} --convention sdpa --supports {flags}"
        in capsys.readouterr().out
    )
    assert main([spec, "--supports", flags, "--profile", "smoke"]) == 0
    assert "FAIL" not in capsys.readouterr().out


@pytest.mark.slow  # several seconds: the default run stays within its budget
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_without_the_flags_the_refusal_is_a_failure_and_a_wrong_answer_is_never_hidden(capsys):
    assert main([f"{KERNELS}:no_negative_scale", "--profile", "smoke"]) == 1
    outcomes = discover(targets.get(f"{KERNELS}:wrong_on_negative_scale"))
    (negative,) = [o for o in outcomes if o.probe.feature == "negative scale"]
    assert negative.status == "fails" and supports_text(outcomes) == ""


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_an_sdpa_kernel_is_judged_on_rows_with_no_allowed_key_by_default():
    """SDPA defines such a row (Y = 0): by default a kernel that returns NaN there fails, one
    that returns 0 passes, and told ``empty_rows=no`` the case is skipped with the flag."""
    import numpy as np

    from exactattn.cases import Case
    from exactattn.testing.case_check import check_case

    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((1, 2, 6, 4)) for _ in range(4))
    allowed = np.ones((6, 6), dtype=bool)
    allowed[2] = False
    mask = {"kind": "dense", "allowed": allowed.tolist()}
    case = Case(q, k, v, g, 4, mask=mask, empty_rows="zero", dtype="float64")
    nan, zero = (targets.get(f"{KERNELS}:{f}") for f in ("nan_on_empty_rows", "no_dropout"))
    found = check_case(case, [targets.Variant(t, "float64") for t in (nan, zero)])
    assert [f.status for f in found] == ["fail", "ok"], [f.detail for f in found]
    assert "is nan" in found[0].detail
    told = targets.get(f"{KERNELS}:nan_on_empty_rows", supports=Capabilities.parse(
        "empty_rows=no", user_capabilities("sdpa")
    ))  # fmt: skip
    assert targets.Variant(told, "float64").unsupported(case).startswith("rows with no allowed")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_empty_row_probe_never_excuses_wrong_rows_with_keys():
    """NaN on the empty row is "not supported" only where every row with keys is right: the
    same NaN with the other rows 1% off is a failure."""
    from tests.check import refusing_kernels

    def off(q, k, v, attn_mask=None, is_causal=False, scale=None):
        return 1.01 * refusing_kernels.nan_on_empty_rows(q, k, v, attn_mask, is_causal, scale)

    outcomes = {o.probe.feature: o for o in discover(targets.from_callable(off), ("float64",))}
    assert outcomes["a row with no allowed key"].status == "fails"
    told = discover(targets.get(f"{KERNELS}:nan_on_empty_rows"), ("float64",))
    (empty,) = [o for o in told if o.probe.key == "empty_rows"]
    assert empty.status == "not supported" and "not 0 there" in empty.detail
