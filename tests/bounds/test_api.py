"""bounds(): shapes, checks, the worst-case block, chunking, input rounding, ratio()."""

from __future__ import annotations

import numpy as np
import pytest

import exactattn
from exactattn.error import bounds as B
from exactattn.error.bounds import Arith, bounds, ratio

from .runs import Case, distance, inputs, reference

FA2 = Arith.ieee("float16", "float32", p="float16", block=4)


def _qkvg(rng, q_shape, k_shape, dv=3):
    q = rng.standard_normal(q_shape)
    k = rng.standard_normal(k_shape)
    v = rng.standard_normal((*k_shape[:-1], dv))
    return q, k, v


def test_results_are_shaped_like_what_they_bound():
    rng = np.random.default_rng(0)
    q, k, v = _qkvg(rng, (2, 4, 5, 6), (2, 2, 7, 6))  # GQA: 4 query heads on 2 kv heads
    g = rng.standard_normal((2, 4, 5, 3))
    bias = rng.standard_normal((1, 7))  # one key bias for every head and query
    out = bounds(FA2, q, k, v, g, enable_gqa=True, bias=bias)
    shapes = {name: x.shape for name, x in out.items()}
    assert shapes == {
        "y": (2, 4, 5, 3),
        "lse": (2, 4, 5),
        "dq": q.shape,
        "dk": k.shape,
        "dv": v.shape,
        "dbias": bias.shape,
    }
    assert all(np.all(x > 0) and np.all(np.isfinite(x)) for x in out.values())
    broadcast = bounds(FA2, q[0, 0], k[:, :1], v[:, :1], g[:, :1])  # q shared by the batch
    assert broadcast["dq"].shape == q[0, 0].shape and broadcast["y"].shape == (2, 1, 5, 3)
    assert set(bounds(FA2, q, k, v, enable_gqa=True)) == {"y", "lse"}


def test_rows_with_no_allowed_key_are_exact():
    rng = np.random.default_rng(1)
    q, k, v = _qkvg(rng, (4, 3), (5, 3))
    allowed = np.ones((4, 5), dtype=bool)
    allowed[2] = False
    out = bounds(FA2, q, k, v, rng.standard_normal((4, 3)), allowed=allowed)
    assert np.all(out["y"][2] == 0) and out["lse"][2] == 0
    assert np.all(out["y"][[0, 1, 3]] > 0)


@pytest.mark.parametrize("acc", ["float32", "float16"])
def test_the_worst_case_block_bounds_every_block_size(acc):
    rng = np.random.default_rng(2)
    q, k, v = _qkvg(rng, (9, 4), (13, 4))
    g = rng.standard_normal((9, 3))
    allowed = rng.random((9, 13)) < 0.7
    arith = Arith.ieee("float16", acc=acc)
    worst = bounds(arith, q, k, v, g, allowed=allowed)
    for b in (1, 2, 5, 13, 40):
        at_b = bounds(arith.with_block(b), q, k, v, g, allowed=allowed)
        for name in worst:
            assert np.all(at_b[name] <= worst[name] * (1 + 1e-12)), (b, name)


def test_chunks_do_not_change_the_result(monkeypatch):
    rng = np.random.default_rng(3)
    q, k, v = _qkvg(rng, (2, 11, 4), (2, 9, 4))
    g = rng.standard_normal((2, 11, 3))
    rho = np.where(rng.random((2, 11, 9)) < 0.8, 1 / 0.8, 0.0)
    keywords = dict(rho=rho, bias=rng.standard_normal((11, 9)), softcap=5.0)
    whole = bounds(FA2, q, k, v, g, **keywords)
    monkeypatch.setattr(B, "CHUNK", 7)
    monkeypatch.setattr(B, "SPREAD", 5)
    pieces = bounds(FA2, q, k, v, g, **keywords)
    for name in whole:
        np.testing.assert_allclose(pieces[name], whole[name], rtol=1e-12, err_msg=name)


def test_inputs_rounded_on_the_way_in_are_covered_only_when_declared():
    """The sweep's setting: exact float64 inputs, the FA-2 policy rounds them to fp16."""
    case = Case(24, 24, 8, 8, dist="outliers", block=8, seed=4)
    data = inputs(case)
    q, k, v, g = (data[x] for x in "qkvg")
    ctx = exactattn.NumpyContext("float16", "float32", "float16")
    y, stats = exactattn.attention(q, k, v, block_size=8, backend=ctx, return_stats=True)
    grads = exactattn.attention_backward(q, k, v, y, stats, g, block_size=8, backend=ctx)
    ref = reference(case, data)  # on the unrounded inputs
    arith = Arith.of_context(ctx, block=8)
    for declared, holds in ((True, True), (False, False)):
        b = bounds(arith, q, k, v, g, row_block=24, input_rounding=declared)
        worst = max(
            ratio(distance(np.asarray(x, dtype=np.float64), ref[name])[0], b[name])
            for name, x in zip(("y", "dq", "dk", "dv"), (y, *grads))
        )
        assert (worst <= 1) is holds, (declared, worst)


def test_bad_arguments_are_named():
    rng = np.random.default_rng(5)
    q, k, v = _qkvg(rng, (4, 3), (5, 3))
    cases = [
        (dict(arith="fp16"), TypeError, "arith must be an Arith"),
        (dict(k=k[:, :2]), ValueError, "same last dim d"),
        (dict(v=v[:4]), ValueError, "same number of keys"),
        (dict(q=q.astype(complex)), TypeError, "must be real"),
        (dict(q=np.where(q > 1, np.nan, q)), ValueError, "q contains NaN"),
        (dict(g=np.ones((4, 2))), ValueError, "g of shape"),
        (dict(allowed=np.ones((4, 5))), TypeError, "boolean array"),
        (dict(rho=np.full((4, 5), 2.0) * [1, 1, 1, 1, 1.5]), ValueError, "one factor"),
        (dict(bias=np.full((4, 5), np.inf)), ValueError, "bias contains NaN or \\+inf"),
        (dict(softcap=-1.0), ValueError, "softcap must be finite and > 0"),
        (dict(scale=float("inf")), ValueError, "scale must be finite"),
        (dict(stats="m"), ValueError, "stats must be one of"),
        (dict(delta="p"), ValueError, "delta must be one of"),
        (dict(row_block=0), ValueError, "row_block must be"),
        (dict(enable_gqa=True), ValueError, "head axis"),
    ]
    for change, error, message in cases:
        args = dict(arith=FA2, q=q, k=k, v=v, g=None)
        args.update(change)
        positional = [args.pop(x) for x in ("arith", "q", "k", "v", "g")]
        with pytest.raises(error, match=message):
            bounds(*positional, **args)


def test_ratio_reads_zero_and_infinite_bounds():
    assert ratio([0.0, 1.0], [0.0, 2.0]) == 0.5
    assert ratio([1e-30], [0.0]) == np.inf
    assert ratio([5.0], [np.inf]) == 0.0
    assert ratio([np.nan], [1.0]) == np.inf
    assert np.isnan(ratio([], []))


def test_budgets_beyond_float64s_range_give_an_infinite_bound_not_nan():
    rng = np.random.default_rng(6)
    q, k, v = _qkvg(rng, (6, 64), (6, 64))
    out = bounds(Arith.bits(5), 40 * q, 40 * k, v, rng.standard_normal((6, 3)))
    assert not any(np.isnan(x).any() for x in out.values())
    assert np.isinf(out["y"]).any() and np.isinf(out["dk"]).any()
