"""Unsupported is not wrong: a target that refuses an input skips that case with its reason.

``NotImplementedError`` from any target, and a library's documented refusal named in the
target's ``Options.refusals``, make the case a skip whose reason quotes the library; any
other error stays a failure (the checker is not blind), and a refused dropout probe is "not
run", not a FAIL.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from exactattn import targets
from exactattn.cases import Case
from exactattn.testing.case_check import UNSUPPORTED, Options, check_case
from tests.optional import requires

requires("torch", "flint")

from tests.check import refusing_kernels

REFUSES_NEGATIVE = (("ValueError", refusing_kernels.NEGATIVE),)


def _case(dtype="float32", scale=None, dropout_p=0.0):
    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((1, 2, 6, 4)) for _ in range(4))
    return Case(q, k, v, g, 4, scale=scale, dropout_p=dropout_p, seed=0, dtype=dtype)


def _variant(fn, dtype="float32", refusals=()):
    target = targets.from_callable(fn)
    options = dataclasses.replace(target.options, refusals=refusals)
    return targets.Variant(dataclasses.replace(target, options=options), dtype)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_not_implemented_skips_the_case_with_the_library_reason():
    (found,) = check_case(_case("bfloat16"), [_variant(refusing_kernels.no_dropout, "bfloat16")])
    assert found.status == "skip"
    assert found.detail == f"{UNSUPPORTED}: NotImplementedError: no bfloat16 kernel on this device"
    (found,) = check_case(_case(), [_variant(refusing_kernels.no_dropout)])
    assert found.status == "ok", found.detail


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_documented_refusal_skips_and_any_other_error_fails():
    negative = _case(scale=-0.5)
    told = _variant(refusing_kernels.no_negative_scale, refusals=REFUSES_NEGATIVE)
    untold = _variant(refusing_kernels.no_negative_scale)
    found = check_case(negative, [told, untold], Options(grads=False))
    assert [f.status for f in found] == ["skip", "fail"], [f.detail for f in found]
    assert refusing_kernels.NEGATIVE in found[0].detail
    assert found[1].detail.startswith("raised ValueError")
    other = _variant(refusing_kernels.no_negative_scale, refusals=(("ValueError", "other text"),))
    assert check_case(negative, [other], Options(grads=False))[0].status == "fail"
    wrong = _variant(refusing_kernels.wrong_on_negative_scale, refusals=REFUSES_NEGATIVE)
    assert check_case(negative, [wrong], Options(grads=False))[0].status == "fail"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_target_without_dropout_gets_no_failed_probe(capsys):
    from exactattn.commands.check import main

    spec = "tests.check.refusing_kernels:no_dropout"
    assert main([spec, "--profile", "smoke", "--dtypes", "float32", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out
    assert "dropout probe" in out and "not run, the target has no dropout" in out
    assert "no bfloat16 kernel on this device" in out or "skip" in out


def test_not_implemented_from_exactattn_own_configuration_is_a_bug_not_a_skip():
    own = dataclasses.replace(targets.get("np-fp32"))
    assert own.family != "foreign" and own.refuses(NotImplementedError("no such op")) is None
    user = targets.from_callable(refusing_kernels.no_dropout)
    assert user.refuses(NotImplementedError("no dropout")) == "no dropout"
    assert user.refuses(RuntimeError("no dropout")) is None


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_detached_output_is_a_zero_gradient_judged_where_it_is_exact():
    """Every row with no allowed key: Y = 0 whatever q, k, v, so dQ = dK = dV = 0 exactly and
    a detached output passes; with keys, the zero gradients fail, saying why."""
    from exactattn.targets.conventions import DETACHED

    detached = _variant(refusing_kernels.detached)
    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((1, 2, 6, 4)) for _ in range(4))
    none = {"kind": "dense", "allowed": np.zeros((6, 6), dtype=bool).tolist()}
    empty = Case(q, k, v, g, 4, mask=none, empty_rows="zero", dtype="float32")
    (found,) = check_case(empty, [detached])
    assert found.status == "ok", found.detail
    (found,) = check_case(_case(), [detached])
    assert found.status == "fail" and found.detail.startswith(DETACHED), found.detail
    assert "dq" in found.detail or "dk" in found.detail or "dv" in found.detail
