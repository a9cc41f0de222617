"""``exactattn check --discover``: the flags it prints leave out exactly what a function
refuses, so the check then has no FAIL from an unsupported input, and never hides a wrong
answer behind a flag."""

from __future__ import annotations

import pytest

from exactattn import targets
from exactattn.commands.check import main
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


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_without_the_flags_the_refusal_is_a_failure_and_a_wrong_answer_is_never_hidden(capsys):
    assert main([f"{KERNELS}:no_negative_scale", "--profile", "smoke"]) == 1
    outcomes = discover(targets.get(f"{KERNELS}:wrong_on_negative_scale"))
    (negative,) = [o for o in outcomes if o.probe.feature == "negative scale"]
    assert negative.status == "fails" and supports_text(outcomes) == ""
