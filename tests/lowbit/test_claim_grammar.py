"""The low-bit claim grammar (:mod:`exactattn.error.lowbit_claim`): each built-in scheme's
claim text parses back to the scheme's own arithmetic, and every malformed field is a usage
error that lists the valid values."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from exactattn import targets
from exactattn.cases import Case
from exactattn.cases.inputs import make_inputs
from exactattn.error.lowbit import SCHEMES, rotation
from exactattn.error.lowbit_claim import claim_text
from exactattn.targets.builtin import lowbit_target
from exactattn.targets.target import Claim


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_a_schemes_claim_is_its_arithmetic(name):
    """The text goes through the grammar and back to the same Arith as ``Scheme.arith``
    (the reverse casts are the claim's only addition: p and γ as FA-2 casts them)."""
    scheme = SCHEMES[name]
    inputs = make_inputs("fa3-outliers", 64, 32, 3)
    claim = Claim.parse(claim_text(scheme))
    assert Claim.parse(claim.as_text()) == claim
    via_claim = targets.Variant(lowbit_target(name), "float32").arith(32, inputs)
    own = scheme.arith(32, inputs)
    assert replace(via_claim, grad_cast=None) == own
    if own.quant_each is not None:
        for x in "qkv":
            assert via_claim.quant_each.rel[x] == own.quant_each.rel[x]
            np.testing.assert_array_equal(via_claim.quant_each.abs[x], own.quant_each.abs[x])


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("q=e3m4:block64", r"unknown format 'e3m4'.*'e4m3', 'e5m2', 'e2m1', 'int8', 'int4'"),
        ("k=e4m3:rows64", r"unknown granularity 'rows64'.*'tensor', 'head', 'token'"),
        ("k=e4m3:block0", r"unknown granularity 'block0'.*block<r>"),
        ("v=e2m1:group32:e5m2", r"unknown scale format 'e5m2'.*'fp32', 'e4m3', 'e8m0'"),
        ("q=int8:block16:e8m0", r"integer formats take fp32 scales"),
        ("smooth=v", r"smooth='v'.*k, q<r>"),
        ("rotate=random", r"hadamard or no"),
        ("p_scale=-1", r"p_scale must be a finite number > 0"),
        ("pv_chunk=0", r"pv_chunk must be an integer >= 1"),
        ("pv_acc=fp8", r"unknown accumulator.*'fp32', 'fp16', 'fp22', 'fp22-rn'"),
        ("q=e4m3,quantiser=exact", r"quantiser='exact'.*'any', 'nearest'"),
        ("p=e4m3,quantiser=nearest", r"quantiser=nearest states how q, k or v are quantised"),
    ],
)
def test_malformed_fields_list_the_valid_values(text, says):
    with pytest.raises(ValueError, match=says):
        Claim.parse(text)


def test_a_group_that_does_not_divide_its_dimension():
    """Skipped per case with the reason by check; a ValueError listing the divisors when
    the quantisation is called directly."""
    variant = targets.Variant(lowbit_target("mxfp4"), "float32")
    inputs = make_inputs("normal", 8, 80, 0)
    case = Case(*(inputs[x] for x in "qkvg"), 8)
    assert variant.unsupported(case) == "q=e2m1:group32:e8m0: a group of 32 does not divide 80"
    with pytest.raises(ValueError, match=r"q: a group of 32 does not divide.*\[1, 2, 4, 5, 8"):
        SCHEMES["mxfp4"].hold(inputs)


@pytest.mark.parametrize("d", [80, 96, 192])
def test_the_rotation_is_orthogonal_for_head_dims_that_are_not_powers_of_two(d):
    m = rotation(d)
    np.testing.assert_allclose(m @ m.T, np.eye(d), atol=1e-15)
    assert np.count_nonzero(m) == d * (d & -d)  # blocks of the largest power of two
    inputs = make_inputs("normal", 16, d, 1)
    exact = SCHEMES["fa3-fp8-block-hadamard"].exact(inputs)[0]
    c = 1 / math.sqrt(d)
    np.testing.assert_allclose(
        c * exact["q"] @ exact["k"].T, c * inputs["q"] @ inputs["k"].T, atol=1e-12
    )
