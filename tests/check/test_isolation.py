"""A target in a child process: a segfault or a hang fails its own case, and the run goes on."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from exactattn import targets
from exactattn.cases import Case
from exactattn.testing.case_check import Options, check_case
from tests.optional import requires

requires("torch", "flint")

SPEC = "tests.check.crashing_kernels:crashes_on_seven_keys"


def _case(n_k: int) -> Case:
    rng = np.random.default_rng(n_k)
    q, g = rng.standard_normal((1, 1, 3, 4)), rng.standard_normal((1, 1, 3, 4))
    k, v = rng.standard_normal((1, 1, n_k, 4)), rng.standard_normal((1, 1, n_k, 4))
    return Case(q, k, v, g, 4, dtype="float32")


@pytest.mark.slow  # several seconds: the default run stays within its budget
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_segfault_and_a_hang_fail_only_their_cases():
    target = targets.get(SPEC)
    options = dataclasses.replace(target.options, isolated=True, case_timeout=20.0)
    variant = targets.Variant(dataclasses.replace(target, options=options), "float32")
    statuses, details = [], []
    for n_k in (6, 7, 6):
        (found,) = check_case(_case(n_k), [variant], Options(grads=False))
        statuses.append(found.status)
        details.append(found.detail)
    assert statuses == ["ok", "fail", "ok"], details
    assert "process died" in details[1] and "SIGSEGV" in details[1]
    quick = dataclasses.replace(options, case_timeout=2.0)
    hanging = targets.Variant(dataclasses.replace(target, options=quick), "float32")
    (found,) = check_case(_case(9), [hanging], Options(grads=False))
    assert found.status == "fail" and "hung" in found.detail and "2 s" in found.detail
    (found,) = check_case(_case(6), [hanging], Options(grads=False))
    assert found.status == "ok", found.detail


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_refusal_crosses_from_the_child_as_a_skip():
    target = targets.get("tests.check.refusing_kernels:no_dropout")
    options = dataclasses.replace(target.options, isolated=True)
    variant = targets.Variant(dataclasses.replace(target, options=options), "bfloat16")
    case = dataclasses.replace(_case(6), dtype="bfloat16")
    (found,) = check_case(case, [variant], Options(grads=False))
    assert found.status == "skip" and "no bfloat16 kernel on this device" in found.detail
