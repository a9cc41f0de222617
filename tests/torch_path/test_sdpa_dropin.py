"""exactattn.torch.scaled_dot_product_attention against torch's SDPA, clause by clause.

The reference is ``torch.nn.functional.scaled_dot_product_attention`` itself on the CPU in
float64 (the function whose contract is copied), never exactattn code.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.optional import requires

torch = requires("torch")

import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

import exactattn.torch as et

from .helpers import assert_close, qkv, randn

TOL = {torch.float64: 1e-12, torch.float32: 3e-5}

SHAPES = {
    "4d-cross": ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 6)),
    "3d": ((3, 6, 4), (3, 6, 4), (3, 6, 4)),
    "2d": ((5, 4), (9, 4), (9, 3)),
    "broadcast-kv": ((2, 3, 6, 4), (1, 1, 6, 4), (1, 1, 6, 4)),
    "long-n_q": ((1, 2, 9, 4), (1, 2, 4, 4), (1, 2, 4, 5)),
}


def _bool_mask(shape, seed, p=0.6):
    allowed = np.random.default_rng(seed).random(shape) < p
    return torch.from_numpy(allowed)


def _float_mask(shape, seed, dtype=torch.float64, grad=False):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape)
    values[rng.random(shape) < 0.3] = -math.inf
    return torch.from_numpy(values).to(dtype).requires_grad_(grad)


def _run(fn, q, k, v, g, mask=None, **keywords):
    """``(y, dq, dk, dv[, dmask])`` of one call at the upstream gradient ``g``."""
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    if mask is not None and mask.requires_grad:
        mask = mask.detach().clone().requires_grad_(True)
        leaves.append(mask)
    y = fn(*leaves[:3], attn_mask=mask, **keywords)
    return (y.detach(), *torch.autograd.grad(y, leaves, g))


def _compare(shapes, dtype=torch.float64, mask=None, seed=0, **keywords):
    q, k, v = qkv(*shapes, seed=seed, dtype=dtype)
    out_shape = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **keywords).shape
    g = randn(*out_shape, seed=seed + 9, dtype=dtype)
    got = _run(et.scaled_dot_product_attention, q, k, v, g, mask, **keywords)
    want = _run(F.scaled_dot_product_attention, q, k, v, g, mask, **keywords)
    assert len(got) == len(want)
    for name, a, b in zip(("y", "dq", "dk", "dv", "dmask"), got, want):
        assert a.dtype == b.dtype, name
        assert_close(a, b, atol=TOL[dtype], rtol=TOL[dtype], what=name)
    return got


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("option", ["plain", "is_causal", "scale", "bool", "float", "float-grad"])
def test_matches_sdpa(shape, option, dtype):
    shapes = SHAPES[shape]
    weights = (*np.broadcast_shapes(shapes[0][:-2], shapes[1][:-2]), shapes[0][-2], shapes[1][-2])
    keywords = {}
    if option == "is_causal":
        keywords["is_causal"] = True
    elif option == "scale":
        keywords["scale"] = 0.37
    elif option == "bool":
        keywords["mask"] = _bool_mask(weights, seed=1)
    elif option in ("float", "float-grad"):
        keywords["mask"] = _float_mask(weights, 2, dtype, grad=option == "float-grad")
    _compare(shapes, dtype, **keywords)


@pytest.mark.parametrize(
    "mask_shape", [(7,), (5, 7), (1, 7), (5, 1), (3, 1, 7), (2, 1, 5, 7), (2, 3, 5, 7)]
)
@pytest.mark.parametrize("kind", ["bool", "float-grad"])
def test_mask_broadcasting_and_mask_gradient(mask_shape, kind):
    """Masks of every broadcast shape; the gradient of a broadcast float mask is summed."""
    shapes = SHAPES["4d-cross"]
    if len(mask_shape) == 1:  # SDPA refuses a 1-d mask; so must we
        with pytest.raises(RuntimeError, match="attn_mask"):
            et.scaled_dot_product_attention(*qkv(*shapes), attn_mask=torch.ones(mask_shape) > 0)
        return
    mask = _bool_mask(mask_shape, 3) if kind == "bool" else _float_mask(mask_shape, 4, grad=True)
    got = _compare(shapes, mask=mask)
    if kind == "float-grad":
        assert got[-1].shape == mask.shape


def test_float32_mask_with_float64_inputs_is_added_exactly():
    """SDPA takes a float32 mask with any query dtype (float32 is exact in float64)."""
    mask = _float_mask((5, 7), 5, torch.float32, grad=True)
    got = _compare(SHAPES["4d-cross"], mask=mask)
    assert got[-1].dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("option", ["plain", "is_causal", "bool", "float-grad"])
def test_enable_gqa_matches_sdpa(option, dtype):
    shapes = ((2, 6, 5, 8), (2, 2, 5, 8), (2, 2, 5, 4))
    keywords = {"enable_gqa": True}
    if option == "is_causal":
        keywords["is_causal"] = True
    elif option == "bool":
        keywords["mask"] = _bool_mask((2, 6, 5, 5), 6)
    elif option == "float-grad":
        keywords["mask"] = _float_mask((6, 5, 5), 7, dtype, grad=True)
    _compare(shapes, dtype, **keywords)


@pytest.mark.parametrize(
    "scale", [torch.tensor(0.3), torch.tensor(0.3, dtype=torch.float64), 0.0, -2, 1]
)
def test_scale_forms_sdpa_accepts(scale):
    """A 0-dim tensor, zero, negative and int scales: as SDPA computes them."""
    _compare(SHAPES["4d-cross"], scale=scale)


def test_fully_masked_rows_give_zero_and_zero_gradients():
    """SDPA >= 2.5: a row with no allowed key gives 0, and no gradient flows through it."""
    bool_mask = _bool_mask((2, 3, 5, 7), 8)
    bool_mask[0, 1, 2] = False
    bool_mask[1, :, 4] = False
    float_mask = _float_mask((5, 7), 9, grad=True)
    float_mask.data[3] = -math.inf
    for mask in (bool_mask, float_mask):
        y, dq = _compare(SHAPES["4d-cross"], mask=mask)[:2]
        empty = ~mask.any(-1) if mask.dtype == torch.bool else mask.detach().isneginf().all(-1)
        rows = torch.broadcast_to(empty, y.shape[:-1])
        assert rows.any()
        assert torch.equal(y[rows], torch.zeros_like(y[rows]))
        assert torch.equal(dq[rows], torch.zeros_like(dq[rows]))


def test_empty_key_set_and_empty_queries():
    q, k, v = qkv((2, 3, 5, 4), (2, 3, 0, 4), (2, 3, 0, 6))
    assert torch.equal(
        et.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v)
    )
    q, k, v = qkv((2, 3, 0, 4), (2, 3, 5, 4), (2, 3, 5, 6))
    assert et.scaled_dot_product_attention(q, k, v).shape == (2, 3, 0, 6)


def test_zero_head_dim_gives_the_mean_of_v_as_sdpa():
    q, k, v = qkv((2, 3, 5, 0), (2, 3, 7, 0), (2, 3, 7, 6))
    got = et.scaled_dot_product_attention(q, k, v)
    assert_close(got, F.scaled_dot_product_attention(q, k, v), atol=1e-15, what="y")
    assert_close(got, v.mean(-2, keepdim=True).expand_as(got), atol=1e-15, what="mean")


def test_nan_propagates_along_attended_pairs_as_in_sdpa():
    """No finiteness check: NaN in a query row, or in a key every row attends, reaches y."""
    q, k, v = qkv(*SHAPES["4d-cross"])
    q[0, 1, 2, 0] = math.nan
    k[1, 0, 3, 1] = math.nan
    v[1, 2, 5, 0] = math.nan
    for keywords in ({}, {"attn_mask": torch.zeros(5, 7, dtype=torch.float64)}):
        got = et.scaled_dot_product_attention(q, k, v, **keywords)
        want = F.scaled_dot_product_attention(q, k, v, **keywords)
        assert torch.equal(got.isnan(), want.isnan())
        assert got.isnan().any() and not got.isnan().all()
        finite = ~want.isnan()
        assert_close(got[finite], want[finite], atol=1e-12, what="finite entries")


def test_dropout_p_one_gives_zeros_and_zero_gradients():
    q, k, v = qkv(*SHAPES["4d-cross"])
    g = randn(2, 3, 5, 6, seed=11)
    got = _run(et.scaled_dot_product_attention, q, k, v, g, dropout_p=1.0)
    want = _run(F.scaled_dot_product_attention, q, k, v, g, dropout_p=1.0)
    for a, b in zip(got, want):
        assert torch.equal(a, b) and not a.any()


def test_negative_dropout_p_is_no_dropout_as_in_sdpa():
    q, k, v = qkv(*SHAPES["4d-cross"])
    assert torch.equal(
        et.scaled_dot_product_attention(q, k, v, dropout_p=-0.2),
        et.scaled_dot_product_attention(q, k, v),
    )


def _dropped(seed, q, k, v, **keywords):
    torch.manual_seed(seed)
    return et.scaled_dot_product_attention(q, k, v, dropout_p=0.4, **keywords)


def test_dropout_follows_torchs_generator():
    q, k, v = qkv(*SHAPES["4d-cross"])
    assert torch.equal(_dropped(3, q, k, v), _dropped(3, q, k, v))
    assert not torch.equal(_dropped(3, q, k, v), _dropped(4, q, k, v))
    torch.manual_seed(3)
    first = et.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    second = et.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    assert not torch.equal(first, second)  # each call draws a new seed


def test_dropout_keeps_the_expectation_of_sdpa():
    """Mean over many seeds of the dropped-out y approaches the undropped y (unbiased ρ)."""
    q, k, v = qkv((1, 2, 4, 4), (1, 2, 6, 4), (1, 2, 6, 3))
    torch.manual_seed(0)
    runs = torch.stack(
        [et.scaled_dot_product_attention(q, k, v, dropout_p=0.5) for _ in range(400)]
    )
    want = F.scaled_dot_product_attention(q, k, v)
    standard_error = runs.std(0) / math.sqrt(len(runs))
    assert (standard_error > 0).all()  # it does drop
    assert ((runs.mean(0) - want).abs() <= 5 * standard_error).all()  # a 5-sigma z-test


def test_dropout_backward_replays_the_forward_bits():
    """gradcheck passes only if the backward uses the forward's keep-bits (and float mask)."""
    q, k, v = qkv((1, 2, 4, 3), (1, 2, 5, 3), seed=12, grad=True)
    mask = _float_mask((4, 5), 13, grad=True)
    mask.data[:, 0] = 0.0  # no empty rows: the zero-row gradient is a one-sided limit
    assert torch.autograd.gradcheck(
        lambda q, k, v, m: _dropped(5, q, k, v, attn_mask=m), (q, k, v, mask)
    )


@pytest.mark.filterwarnings("ignore:Lower right causal bias")  # n_q > n_k: empty rows
def test_causal_bias_objects_give_the_band_sdpa_gives():
    for n_q, n_k in ((3, 7), (7, 7), (6, 4)):
        shapes = ((2, 2, n_q, 4), (2, 2, n_k, 4), (2, 2, n_k, 5))
        for factory in (causal_upper_left, causal_lower_right):
            bias = factory(n_q, n_k)
            q, k, v = qkv(*shapes, seed=n_q)
            got = et.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias._materialize())
            assert_close(got, want, atol=1e-12, what=f"{factory.__name__}({n_q}, {n_k})")


def test_lower_right_equals_the_strict_api_bottom_right_causal():
    q, k, v = qkv((1, 2, 3, 4), (1, 2, 8, 4), (1, 2, 8, 4))
    got = et.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(3, 8))
    want = et.attention(q, k, v, is_causal=True, alignment="bottom-right")
    assert_close(got, want, atol=0, what="y")
    top = et.attention(q, k, v, is_causal=True)
    assert (top - want).abs().max() > 1e-3  # the alignment matters at these sizes


# --- bad input: SDPA's verdict, and a message naming the argument -------------------------------
def _inputs(q=(2, 3, 5, 8), k=(2, 3, 7, 8), v=(2, 3, 7, 6), dtype=torch.float64):
    return qkv(q, k, v, dtype=dtype)


REFUSED = {
    "attn_mask and is_causal": (
        lambda: (*_inputs(),),
        {"attn_mask": torch.ones(5, 7) > 0, "is_causal": True},
        "is_causal",
    ),
    "int mask": (
        lambda: (*_inputs(),),
        {"attn_mask": torch.ones(5, 7, dtype=torch.int32)},
        "attn_mask",
    ),
    "float16 mask, float64 query": (
        lambda: (*_inputs(),),
        {"attn_mask": torch.zeros(5, 7, dtype=torch.float16)},
        "attn_mask",
    ),
    "float64 mask, float32 query": (
        lambda: (*_inputs(dtype=torch.float32),),
        {"attn_mask": torch.zeros(5, 7, dtype=torch.float64)},
        "attn_mask",
    ),
    "bool mask of the wrong shape": (
        lambda: (*_inputs(),),
        {"attn_mask": torch.ones(3, 7) > 0},
        r"attn_mask has shape \(3, 7\)",
    ),
    "float mask of the wrong shape": (
        lambda: (*_inputs(),),
        {"attn_mask": torch.zeros(5, 6, dtype=torch.float64)},
        r"attn_mask has shape \(5, 6\)",
    ),
    "mask with more dims than the weights": (
        lambda: (*_inputs(),),
        {"attn_mask": torch.ones(1, 2, 3, 5, 7) > 0},
        "attn_mask",
    ),
    "0-d mask": (lambda: (*_inputs(),), {"attn_mask": torch.tensor(True)}, "attn_mask"),
    "mask on another device": (
        lambda: (*_inputs(),),
        {"attn_mask": torch.zeros(5, 7, dtype=torch.float64, device="meta")},
        "attn_mask",
    ),
    "mixed dtypes": (lambda: (_inputs()[0], _inputs()[1].float(), _inputs()[2]), {}, "dtype"),
    "head dims differ": (
        lambda: (*_inputs(k=(2, 3, 7, 4)),),
        {},
        r"query \(2, 3, 5, 8\), key \(2, 3, 7, 4\)",
    ),
    "key and value lengths differ": (lambda: (*_inputs(v=(2, 3, 6, 6)),), {}, "key and value"),
    "gqa heads do not divide": (
        lambda: (*_inputs(k=(2, 2, 7, 8), v=(2, 2, 7, 6)),),
        {"enable_gqa": True},
        "enable_gqa",
    ),
    "heads differ without gqa": (
        lambda: (*_inputs(q=(2, 4, 5, 8), k=(2, 2, 7, 8), v=(2, 2, 7, 6)),),
        {},
        "broadcast",
    ),
    "integer inputs": (lambda: tuple(x.long() for x in _inputs()), {}, "floating point"),
    "1-d query": (lambda: (_inputs()[0][0, 0, 0], *_inputs(q=(2, 3, 1, 8))[1:]), {}, "2 dims"),
    "dropout_p above 1": (lambda: (*_inputs(),), {"dropout_p": 1.5}, "dropout_p"),
    "causal bias of other sizes": (
        lambda: (*_inputs(),),
        {"attn_mask": causal_lower_right(4, 7)},
        r"\(4, 7\)",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refuses_what_sdpa_refuses(case):
    make, keywords, message = REFUSED[case]
    with pytest.raises((RuntimeError, ValueError, IndexError)):
        F.scaled_dot_product_attention(*make(), **keywords)
    with pytest.raises((RuntimeError, ValueError), match=message):
        et.scaled_dot_product_attention(*make(), **keywords)


TYPE_ERRORS = {
    "is_causal an int": {"is_causal": 1},
    "scale a tensor that requires grad": {"scale": torch.tensor(0.3, requires_grad=True)},
}


@pytest.mark.parametrize("case", sorted(TYPE_ERRORS))
def test_type_errors_as_sdpa(case):
    keywords = TYPE_ERRORS[case]
    with pytest.raises(TypeError):
        F.scaled_dot_product_attention(*_inputs(), **keywords)
    with pytest.raises(TypeError, match=next(iter(keywords))):
        et.scaled_dot_product_attention(*_inputs(), **keywords)


def test_causal_bias_with_is_causal_is_refused_as_sdpa():
    mask = causal_upper_left(5, 7)
    with pytest.raises(ValueError, match="causal"):
        F.scaled_dot_product_attention(*_inputs(), attn_mask=mask, is_causal=True)
    with pytest.raises(ValueError, match="causal"):
        et.scaled_dot_product_attention(*_inputs(), attn_mask=mask, is_causal=True)


def test_the_input_error_is_both_value_and_runtime_error():
    assert issubclass(et.SDPAInputError, ValueError) and issubclass(et.SDPAInputError, RuntimeError)


def test_exact_sdpa_catches_every_import_path_and_only_inside():
    from torch.nn.functional import scaled_dot_product_attention as imported_early

    q, k, v = _inputs()
    want = et.scaled_dot_product_attention(q, k, v, is_causal=True)
    with et.exact_sdpa() as routed:
        got = [
            imported_early(q, k, v, is_causal=True),
            F.scaled_dot_product_attention(q, k, v, is_causal=True),
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
        ]
        assert torch.equal(torch.ones(2) + 1, torch.full((2,), 2.0))  # others pass through
    assert routed.calls == 3
    for y in got:
        assert torch.equal(y, want)
    F.scaled_dot_product_attention(q, k, v)
    assert routed.calls == 3  # nothing routed once the block has ended
