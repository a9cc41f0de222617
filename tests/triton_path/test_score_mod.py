"""Bias tensors and soft-capping in the Triton kernels, against the float64 definitions.

Every comparison runs triton_forward and triton_backward (with bias_grad when there is a bias)
and checks O, lse, dQ, dK, dV and dbias against ``score_spec.expected``, the naive formula
written from the definitions, on the same (already rounded) inputs. The tests use 16 x 16
tiles at n_q, n_k = 21, 35 (or swapped) so that every run spans several blocks, ragged last
blocks, full blocks (no predicate) and partial ones. The interpreter is slow: the default
run takes one orientation of each mask case, the slow run both.
"""

from __future__ import annotations

import math

import pytest

from tests.optional import requires

torch, _ = requires("torch", "triton")

from .score_spec import U_ACC, UNIT_ROUNDOFF, allowed_pairs, assert_close, expected, tolerance

BLOCKS = {"block_m": 16, "block_n": 16}
B, H, NQ, NK, D = 2, 2, 21, 35, 16


def make_inputs(shape_q, shape_k, dv, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    batch, heads_kv, n_k, _ = shape_k
    q = torch.randn(shape_q, generator=gen).to(dtype)
    k = torch.randn(shape_k, generator=gen).to(dtype)
    v = torch.randn((batch, heads_kv, n_k, dv), generator=gen).to(dtype)
    do = torch.randn((*shape_q[:3], dv), generator=gen).to(dtype)
    return tuple(x.to(device) for x in (q, k, v, do))


def make_bias(shape, dtype, device, *, neg_inf=0.15, seed=1):
    """2 * N(0, 1) entries, a fraction neg_inf of them -inf, rounded to dtype."""
    gen = torch.Generator().manual_seed(seed)
    bias = 2.0 * torch.randn(shape, generator=gen)
    bias[torch.rand(shape, generator=gen) < neg_inf] = -math.inf
    return bias.to(dtype).to(device)


def check(tk, q, k, v, do, *, scale=None, bias=None, softcap=None, blocks=BLOCKS, **mask_kw):
    """Run both kernels and the reference; assert every output is within tolerance."""
    batch, _, n_q, d = q.shape
    n_k = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    mod = {"bias": bias, "softcap": softcap}
    o, lse = tk.triton_forward(q, k, v, scale=scale, **mod, **mask_kw, **blocks)
    grads = tk.triton_backward(
        q, k, v, o, lse, do, scale=scale, **mod, bias_grad=bias is not None, **mask_kw, **blocks
    )
    allowed = allowed_pairs(batch, n_q, n_k, **mask_kw) if mask_kw else None
    ref = expected(q, k, v, do, scale=scale, bias=bias, softcap=softcap, allowed=allowed)

    n = n_q + n_k + d
    u = UNIT_ROUNDOFF[q.dtype]
    pairs = {"o": (o, ref.o, u), "lse": (lse, ref.lse, U_ACC)}
    pairs.update({"dq": (grads[0], ref.dq, u), "dk": (grads[1], ref.dk, u)})
    pairs["dv"] = (grads[2], ref.dv, u)
    if bias is not None:
        dbias = grads[3]
        assert dbias.dtype == bias.dtype, f"dbias dtype {dbias.dtype} != bias {bias.dtype}"
        pairs["dbias"] = (dbias, ref.dbias, UNIT_ROUNDOFF[bias.dtype] + u)
    for name, (got, want, unit) in pairs.items():
        assert_close(name, got, want, tolerance(unit, n, ref.s_max, want.numpy()))
    return o, lse, grads


# The bias shapes: shared by batch and heads, per head, per batch, full; then size-1 query
# and key axes and a scalar, so that each way dbias is reduced runs: written once per entry,
# summed over the rows in registers, added atomically across heads, batches and key blocks.
BIAS_SHAPES = {
    "(n_q,n_k)": (NQ, NK),
    "(1,H,n_q,n_k)": (1, H, NQ, NK),
    "(B,1,n_q,n_k)": (B, 1, NQ, NK),
    "(B,H,n_q,n_k)": (B, H, NQ, NK),
    "(B,1,1,n_k)": (B, 1, 1, NK),
    "(B,H,1,n_k)": (B, H, 1, NK),
    "(1,H,n_q,1)": (1, H, NQ, 1),
    "(1,1)": (1, 1),
}


@pytest.mark.parametrize("shape", list(BIAS_SHAPES))
def test_bias_shapes_with_neg_inf_entries(tk, device, shape):
    """Every broadcast shape, with -inf entries (the (1,H,n_q,1) ones empty whole rows)."""
    q, k, v, do = make_inputs((B, H, NQ, D), (B, H, NK, D), D, torch.float32, device)
    neg_inf = 0.0 if shape == "(1,1)" else 0.15
    bias = make_bias(BIAS_SHAPES[shape], torch.float32, device, neg_inf=neg_inf)
    check(tk, q, k, v, do, bias=bias)


@pytest.mark.parametrize("causal", [None, "top-left"])
def test_softcap_alone(tk, device, causal):
    """scale 1 makes |s| up to ~15, so the cap 4 bites and tanh runs on both of its branches."""
    q, k, v, do = make_inputs((B, H, NQ, D), (B, H, NK, D), D, torch.float32, device)
    check(tk, q, k, v, do, scale=1.0, softcap=4.0, causal=causal)


# mask keywords and the bias shape paired with them (names are the sizes of the test)
MASK_CASES = {
    "causal-top-left": ({"causal": "top-left"}, ("B", "H", "n_q", "n_k")),
    "causal-bottom-right": ({"causal": "bottom-right"}, ("n_q", "n_k")),
    "window": ({"window": (5, 3)}, (1, "H", "n_q", "n_k")),
    "window-left-bottom-right": (
        {"window": (9, None), "alignment": "bottom-right"},
        ("B", 1, 1, "n_k"),
    ),
    "key-padding": ({"kv_lengths": [19, 30]}, ("B", 1, "n_q", "n_k")),
    "causal-window-padding": (
        {"causal": "bottom-right", "window": (11, 7), "kv_lengths": [33, 19]},
        ("B", "H", 1, "n_k"),
    ),
}


@pytest.mark.parametrize(
    "case,swap",
    [
        pytest.param(case, swap, id=f"{case}-{'nq>nk' if swap else 'nq<nk'}", marks=marks)
        for number, case in enumerate(MASK_CASES)
        for swap in (False, True)
        for marks in [() if swap == bool(number % 2) else pytest.mark.slow]
    ],
)
def test_softcap_and_bias_with_masks_and_gqa(tk, device, case, swap):
    """Softcap, bias and a mask together under GQA (H = 2 over H_kv = 1), n_q != n_k."""
    mask_kw, shape = MASK_CASES[case]
    n_q, n_k = (NK, NQ) if swap else (NQ, NK)
    q, k, v, do = make_inputs((B, H, n_q, D), (B, 1, n_k, D), D, torch.float32, device)
    sizes = {"B": B, "H": H, "n_q": n_q, "n_k": n_k}
    bias = make_bias(tuple(sizes.get(x, x) for x in shape), torch.float32, device)
    check(tk, q, k, v, do, scale=0.7, bias=bias, softcap=3.0, **mask_kw)


@pytest.mark.parametrize(
    "dtype,bias_dtype",
    [
        (torch.float32, torch.bfloat16),
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float16),
        (torch.float16, torch.float16),
    ],
    ids=["q32-b16bf", "q16-b32", "q16bf-b16", "q16-b16"],
)
def test_dtypes_of_inputs_and_bias(tk, device, dtype, bias_dtype):
    """The kernels trace and stay accurate for every input dtype and bias dtype pairing;
    dbias comes back in the bias's dtype (through a float32 buffer when shared)."""
    q, k, v, do = make_inputs((B, H, NQ, 32), (B, H, NK, 32), 32, dtype, device)
    shape = (1, H, NQ, NK) if bias_dtype == torch.float16 else (B, H, NQ, NK)
    bias = make_bias(shape, bias_dtype, device)
    check(tk, q, k, v, do, bias=bias, softcap=2.5, causal="bottom-right")


def test_rows_excluded_by_the_bias_give_zero_output_and_gradients(tk, device):
    """A row whose every key has bias -inf: O = 0, lse = -inf, zero dQ and dbias, no NaN;
    a key column of -inf for every row gets zero dK, dV and dbias."""
    q, k, v, do = make_inputs((B, H, NQ, D), (B, H, NK, D), D, torch.float32, device)
    bias = make_bias((B, H, NQ, NK), torch.float32, device, neg_inf=0.0)
    bias[0, 1, 5] = -math.inf
    bias[1, :, :, 20] = -math.inf
    o, lse, (dq, dk, dv, dbias) = check(tk, q, k, v, do, bias=bias, softcap=6.0)
    assert torch.isneginf(lse[0, 1, 5]) and torch.isfinite(lse[0, 1, :5]).all()
    for x in (o[0, 1, 5], dq[0, 1, 5], dbias[0, 1, 5], dk[1, :, 20], dv[1, :, 20]):
        assert torch.equal(x, torch.zeros_like(x))


def test_bias_with_arbitrary_strides(tk, device):
    """A transposed (n_k, n_q) storage and a user's stride-0 view are read in place."""
    q, k, v, do = make_inputs((B, H, NQ, D), (B, H, NK, D), D, torch.float32, device)
    transposed = make_bias((B, H, NK, NQ), torch.float32, device).transpose(-1, -2)
    assert not transposed.is_contiguous()
    check(tk, q, k, v, do, bias=transposed, causal="top-left")
    rows = make_bias((NQ, 1), torch.float32, device, neg_inf=0.0).expand(NQ, NK)
    assert rows.stride() == (1, 0)
    check(tk, q, k, v, do, bias=rows, softcap=2.0)


@pytest.mark.slow
def test_default_tiles_with_bias_and_softcap(tk, device):
    """The default GPU tiles (64 x 64 at d = 16 for float16) over several blocks."""
    q, k, v, do = make_inputs((2, 2, 70, 16), (2, 1, 150, 16), 16, torch.float16, device)
    bias = make_bias((2, 1, 70, 150), torch.float16, device)
    check(tk, q, k, v, do, bias=bias, softcap=5.0, causal="bottom-right", blocks={})


@pytest.mark.slow
@pytest.mark.parametrize("d", [64, 256])
def test_head_dims_with_bias_and_softcap(tk, device, d):
    n = 20 if d == 256 else 36
    q, k, v, do = make_inputs((1, 2, n, d), (1, 1, n + 11, d), d, torch.float32, device)
    bias = make_bias((1, 2, n, n + 11), torch.float32, device)
    check(tk, q, k, v, do, bias=bias, softcap=1.5, causal="top-left")


def bad_calls():
    """Invalid score modifications for (2, 2, 8, 16) q, k, v: name -> (keywords, error, message)."""
    full = torch.zeros(2, 2, 8, 8)
    return {
        "bias-not-a-tensor": ({"bias": [[0.0]]}, TypeError, "bias must be a torch.Tensor"),
        "bias-float64": ({"bias": full.double()}, TypeError, "float16, bfloat16 or float32"),
        "bias-bool": ({"bias": full.bool()}, TypeError, "got torch.bool"),
        "bias-wrong-key-axis": ({"bias": full[..., :5]}, ValueError, r"\(2, 2, 8, 8\)"),
        "bias-wrong-batch": ({"bias": torch.zeros(3, 1, 8, 8)}, ValueError, r"shape \(3, 1"),
        "bias-1d": ({"bias": torch.zeros(8)}, ValueError, "2 to 4 dims"),
        "bias-5d": ({"bias": full[None]}, ValueError, "2 to 4 dims"),
        "softcap-zero": ({"softcap": 0.0}, ValueError, "positive"),
        "softcap-inf": ({"softcap": math.inf}, ValueError, "finite"),
        "softcap-bool": ({"softcap": True}, TypeError, "softcap"),
        "softcap-str": ({"softcap": "30"}, TypeError, "softcap"),
    }


@pytest.mark.parametrize("case", list(bad_calls()))
def test_invalid_score_modifications_raise_clear_errors(tk, device, case):
    q, k, v, do = make_inputs((2, 2, 8, 16), (2, 2, 8, 16), 16, torch.float32, device)
    keywords, error, match = bad_calls()[case]
    keywords = {key: x.to(device) if torch.is_tensor(x) else x for key, x in keywords.items()}
    with pytest.raises(error, match=match):
        tk.triton_forward(q, k, v, scale=0.25, **keywords)
    o, lse = tk.triton_forward(q, k, v, scale=0.25)
    with pytest.raises(error, match=match):
        tk.triton_backward(q, k, v, o, lse, do, scale=0.25, **keywords)


def test_bias_grad_needs_a_bias(tk, device):
    q, k, v, do = make_inputs((1, 1, 8, 16), (1, 1, 8, 16), 16, torch.float32, device)
    o, lse = tk.triton_forward(q, k, v, scale=0.25)
    with pytest.raises(ValueError, match="bias_grad=True needs a bias"):
        tk.triton_backward(q, k, v, o, lse, do, scale=0.25, bias_grad=True)
    with pytest.raises(TypeError, match="bias_grad must be a bool"):
        tk.triton_backward(q, k, v, o, lse, do, scale=0.25, bias=o[..., :8], bias_grad=1)


def test_no_keys_with_bias_and_softcap(tk, device):
    """n_k = 0: every row is empty (O = 0, lse = -inf) and dbias is the empty (H, n_q, 0)."""
    q, k, v, do = make_inputs((1, H, 5, D), (1, H, 0, D), D, torch.float32, device)
    bias = torch.zeros(H, 5, 0, device=device)
    mod = {"bias": bias, "softcap": 3.0}
    o, lse = tk.triton_forward(q, k, v, scale=0.25, **mod)
    assert torch.isneginf(lse).all() and not o.abs().sum()
    dq, _, _, dbias = tk.triton_backward(q, k, v, o, lse, do, scale=0.25, **mod, bias_grad=True)
    assert not dq.abs().sum() and dbias.shape == (H, 5, 0)
