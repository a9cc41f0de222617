"""Metamorphic properties, on every backend ``exactattn difftest`` finds here.

Each property transforms a case in a way whose effect on the exact result is known and
checks the backend's two runs against each other: exactly where floating point is exact
(powers of two, terms that are exact zeros, the same computation twice), else within the
sum of the two runs' derived bounds (``exactattn.testing.tolerance.bounds``).
"""

from __future__ import annotations

import dataclasses

import mpmath
import numpy as np
import pytest

from exactattn.cases import Draw, build_case
from exactattn.difftest.targets import BITWISE as BITWISE_FAMILIES
from exactattn.difftest.targets import discover

from .metamorphic_helpers import allowance, assert_close, assert_identical, held, run

TARGETS, _ = discover()
BY_NAME = {t.name: t for t in TARGETS}
IDS = sorted(BY_NAME)
BITWISE = sorted(n for n, t in BY_NAME.items() if t.target.family in BITWISE_FAMILIES)


def _case(target, mask="none", data_seed=0, **sizes):
    """A small integer-valued case every backend supports (sympy included)."""
    spec = Draw(
        batch=sizes.get("batch", (1,)),
        n_q=sizes.get("n_q", 3),
        n_k=sizes.get("n_k", 3),
        d=sizes.get("d", 2),
        v=sizes.get("v", 2),
        block_size=sizes.get("b", 2),
        distribution="uniform_int",
        mask={"kind": mask},
        data_seed=data_seed,
    )
    case = held(target, build_case(spec))
    if target.unsupported(case) is not None:
        pytest.skip(f"{target.name} does not take this case")
    return case


def _exact(target, name, a, b):
    """Bit-identical, except for sympy whose exact results are compared after evaluation to
    50 digits (two algebraically equal forms may round differently there): 2^-150 relative."""
    if target.target.family == "sympy":
        slack = 2.0**-150 * (1 + np.abs(np.asarray(a[0], dtype=np.float64)))
        assert_close(name, a, b, slack, slack)
    else:
        assert_identical(name, a, b)


def _target(name):
    t = BY_NAME[name]
    return t


@pytest.fixture(params=IDS)
def target(request):
    return _target(request.param)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_block_size_does_not_change_the_result(target):
    base = _case(target, n_k=3, b=1)
    other = dataclasses.replace(base, block_size=4)
    a, b = run(target, base), run(target, other)
    ba, bb = allowance(target, base), allowance(target, other)
    for name in a:
        assert_close(name, a[name], b[name], ba[name], bb[name])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("masked", [False, True])
def test_permuting_keys_with_values_and_mask_leaves_y_unchanged(target, masked):
    base = _case(target, mask="dense" if masked else "none", n_k=3, data_seed=3)
    perm = np.array([2, 0, 1])
    mask = dict(base.mask)
    if masked:
        mask["allowed"] = np.asarray(mask["allowed"])[..., perm].tolist()
    other = dataclasses.replace(base, k=base.k[..., perm, :], v=base.v[..., perm, :], mask=mask)
    if target.unsupported(other) is not None:
        pytest.skip("target does not take the permuted case")
    a, b = run(target, base), run(target, other)
    ba, bb = allowance(target, base), allowance(target, other)
    for name in ("y", "dq"):
        assert_close(name, a[name], b[name], ba[name], bb[name])
    for name in ("dk", "dv"):  # the key gradients move with their keys
        back = (b[name][0][..., np.argsort(perm), :], b[name][1][..., np.argsort(perm), :])
        assert_close(name, a[name], back, ba[name], bb[name][..., np.argsort(perm), :])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_masked_keys_and_values_change_nothing_and_get_zero_gradient(target):
    """Keys j ≥ L are padding: their scores are −∞ before any arithmetic, so y is the same
    bits whatever K_j, V_j hold, and dK_j = dV_j = 0 exactly (γ_ij = p_ij = 0)."""
    base = _case(target, n_k=3)
    base = dataclasses.replace(base, mask={"kind": "padding", "lengths": [2]})
    k, v = base.k.copy(), base.v.copy()
    k[..., 2, :] = target.hold(np.array([7.0, -5.0])[: k.shape[-1]])
    v[..., 2, :] = target.hold(np.array([-6.0, 9.0])[: v.shape[-1]])
    other = dataclasses.replace(base, k=k, v=v)
    a, b = run(target, base), run(target, other)
    for name in ("y", "dq"):
        _exact(target, name, a[name], b[name])
    for out in (a, b):
        for name in ("dk", "dv"):
            value = out[name][0][..., 2, :]
            assert all(float(e) == 0 for e in np.asarray(value).flat), name


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_batch_elements_are_independent(target):
    whole = _case(target, batch=(1,), data_seed=5)
    pair = build_case(Draw((2,), 3, 3, 2, 2, 2, distribution="uniform_int", data_seed=9))
    both = dataclasses.replace(
        whole,
        **{
            n: np.concatenate([getattr(whole, n), target.hold(getattr(pair, n))[:1]])
            for n in "qkvg"
        },
    )
    if target.unsupported(both) is not None:
        pytest.skip("target does not take a batch of 2")
    a, b = run(target, whole), run(target, both)
    ba, bb = allowance(target, whole), allowance(target, both)
    for name in a:
        first = (b[name][0][:1], b[name][1][:1])
        assert_close(name, a[name], first, ba[name], bb[name][:1])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_scaling_v_by_a_power_of_two_scales_y_exactly(target):
    """Y(2^-3 V) = 2^-3 Y(V), dQ and dK scale likewise, dV is unchanged: in binary floating
    point multiplying by a power of two is exact, so the results agree bit for bit."""
    base = _case(target, data_seed=2)
    other = dataclasses.replace(base, v=base.v / 8)
    a, b = run(target, base), run(target, other)
    for name in ("y", "dq", "dk"):
        with mpmath.workprec(400):  # mpf division rounds to the working precision
            scaled = (a[name][0] / 8, a[name][1] / 8)
        _exact(target, name, scaled, b[name])
    _exact(target, "dv", a["dv"], b["dv"])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_shifting_every_score_of_a_row_leaves_y_unchanged(target):
    """Append a column of ones to K and a column t_i to Q: s_ij gains c·t_i for every j,
    which the softmax ignores. dQ's new column is c·Σ_j γ_ij = 0 up to rounding."""
    base = dataclasses.replace(_case(target, data_seed=4), scale=0.5)
    shift = target.hold(np.array([[1.0], [-2.0], [3.0]]))[None]
    q = np.concatenate([base.q, shift], axis=-1)
    k = np.concatenate([base.k, np.ones((*base.k.shape[:-1], 1))], axis=-1)
    other = dataclasses.replace(base, q=q, k=k)
    if target.unsupported(other) is not None:
        pytest.skip("target does not take d + 1")
    a, b = run(target, base), run(target, other)
    ba, bb = allowance(target, base), allowance(target, other)
    assert_close("y", a["y"], b["y"], ba["y"], bb["y"])
    assert_close("dv", a["dv"], b["dv"], ba["dv"], bb["dv"])
    for name in ("dq", "dk"):
        first = (b[name][0][..., :-1], b[name][1][..., :-1])
        assert_close(name, a[name], first, ba[name], bb[name][..., :-1])
    zero = (np.zeros_like(np.asarray(b["dq"][0][..., -1], dtype=np.float64)), 0.0)
    assert_close(
        "dq[..., d]", (b["dq"][0][..., -1], b["dq"][1][..., -1]), zero, bb["dq"][..., -1], 0.0
    )


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", BITWISE)
def test_repeated_runs_are_bit_identical(name):
    target = BY_NAME[name]
    spec = Draw(
        (2, 3),
        7,
        9,
        5,
        3,
        4,
        distribution="normal",
        mask={"kind": "causal"},
        dropout_p=0.25,
        seed=11,
        data_seed=1,
    )
    case = held(target, build_case(spec))
    first, second = run(target, case), run(target, case)
    for out in first:
        assert_identical(out, first[out], second[out])
