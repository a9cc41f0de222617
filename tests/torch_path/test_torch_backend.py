"""TorchContext: the ctx protocol on torch tensors, its precision policy, every mask kind."""

from __future__ import annotations

import numpy as np
import pytest

from tests.optional import requires

torch = requires("torch")

from exactattn.backends import NumpyContext, backend_of
from exactattn.backends.torch_backend import TorchContext
from exactattn.core import algorithm, masks

from .helpers import assert_close, qkv


# --- the precision policy -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dtype", "compute", "p_cast"),
    [
        (torch.float16, torch.float32, torch.float16),
        (torch.bfloat16, torch.float32, torch.bfloat16),
        (torch.float32, torch.float32, None),
        (torch.float64, torch.float64, None),
    ],
)
def test_default_policy_is_flashattention2(dtype, compute, p_cast):
    ctx = TorchContext(dtype)
    assert (ctx.storage_dtype, ctx.compute_dtype, ctx.p_cast_dtype) == (dtype, compute, p_cast)


def test_explicit_policy_and_names():
    same = TorchContext(torch.bfloat16, compute=torch.bfloat16)
    assert same.p_cast_dtype is None and same.name == "torch[bfloat16,cpu]"
    no_cast = TorchContext("float16", p_cast="float32")
    assert no_cast.p_cast_dtype is None
    assert TorchContext("float16") == TorchContext(torch.float16, device="cpu")
    assert hash(TorchContext("float16")) == hash(TorchContext(torch.float16))
    assert TorchContext("float16") != TorchContext("float16", p_cast="float32")
    assert TorchContext("float16").name == "torch[float16,compute=float32,p_cast=float16,cpu]"


def test_bad_dtype_names_the_argument():
    with pytest.raises(TypeError, match="compute"):
        TorchContext(torch.float32, compute=torch.int32)
    with pytest.raises(TypeError, match="dtype"):
        TorchContext("int8")


def test_backend_of_picks_torch_in_the_tensor_dtype():
    q = torch.zeros(2, 3, dtype=torch.float16)
    ctx = backend_of(("q", q), ("k", q), ("v", q))
    assert ctx == TorchContext(torch.float16)
    with pytest.raises(TypeError, match="mix"):
        backend_of(("q", q), ("k", np.zeros((2, 3))))


def test_round_p_rounds_to_the_input_dtype():
    p = torch.rand(5, 7, dtype=torch.float32)
    got = TorchContext(torch.float16).round_p(p)
    assert got.dtype == torch.float32
    assert torch.equal(got, p.half().float())
    assert not torch.equal(got, p)  # it did round
    assert TorchContext(torch.float32).round_p(p) is p


def test_constants_round_like_numpy_in_the_compute_dtype():
    ctx, ref = TorchContext(torch.float32), NumpyContext("float32")
    for d in (3, 7, 64, 80, 96, 128):
        assert ctx.default_scale(d).item() == float(ref.default_scale(d))
    for x in (0.1, 1 / 3, 0.7):
        assert ctx.scalar(x).item() == float(ref.scalar(x))
        assert ctx.scalar(x).dtype == torch.float32
    assert ctx.scalar(0.1) is ctx.scalar(0.1)  # cached: no tensor per tile


def test_elementwise_protocol_matches_numpy():
    ctx, ref = TorchContext(torch.float64), NumpyContext("float64")
    x = np.array([[1.0, -np.inf, 3.0], [-np.inf, -np.inf, -np.inf]])
    t = torch.from_numpy(x.copy())
    assert torch.equal(ctx.rowmax(t), torch.from_numpy(ref.rowmax(x)))
    assert ctx.rowmax(torch.zeros(2, 0, dtype=torch.float64)).tolist() == [-np.inf, -np.inf]
    assert torch.equal(ctx.is_neg_inf(t), torch.from_numpy(ref.is_neg_inf(x)))
    assert torch.equal(ctx.nonfinite(t), torch.from_numpy(ref.nonfinite(x)))
    shift = torch.tensor([1.0, 0.0], dtype=torch.float64)
    want = ref.exp_shifted(x.copy(), shift.numpy())
    assert torch.equal(ctx.exp_shifted(t.clone(), shift), torch.from_numpy(want))
    idx = ctx.index(3, 7)
    assert idx.dtype == torch.int64 and idx.tolist() == [3, 4, 5, 6]


@pytest.mark.parametrize(
    ("shape", "target"),
    [((2, 3, 4, 5), (3, 1, 5)), ((2, 3, 4), (1, 3, 4)), ((2, 3), (2, 3)), ((4, 2, 3), (2, 1))],
)
def test_sum_to_matches_numpy(shape, target):
    x = np.random.default_rng(0).standard_normal(shape)
    want = NumpyContext("float64").sum_to(x, target)
    got = TorchContext(torch.float64).sum_to(torch.from_numpy(x), target)
    assert_close(got, want, atol=1e-13, what="sum_to")


# --- the algorithm over TorchContext, every mask kind ------------------------------------
def _mask_pair(kind: str, n_q: int, n_k: int):
    """The same mask for the NumPy run and for the torch run (torch arrays there)."""
    rng = np.random.default_rng(7)
    if kind == "causal":
        return masks.causal(), masks.causal()
    if kind == "causal-bottom-right":
        return masks.causal("bottom-right"), masks.causal("bottom-right")
    if kind == "sliding":
        return masks.sliding_window(2, 1), masks.sliding_window(2, 1)
    if kind == "key_padding":
        lengths = np.array([n_k, 3])
        return masks.key_padding(lengths), masks.key_padding(torch.from_numpy(lengths))
    if kind == "dense":
        allowed = rng.random((2, 1, n_q, n_k)) < 0.6
        allowed[..., 0] = True
        return masks.dense(allowed), masks.dense(torch.from_numpy(allowed))
    if kind == "predicate":
        return (
            masks.predicate(lambda i, j: (i + j) % 3 != 1),
            masks.predicate(lambda i, j: (i + j) % 3 != 1),
        )
    if kind == "and":
        lengths = np.array([n_k, 4])
        return (
            masks.and_masks(masks.causal(), masks.key_padding(lengths)),
            masks.and_masks(masks.causal(), masks.key_padding(torch.from_numpy(lengths))),
        )
    if kind == "or":
        return (
            masks.or_masks(masks.sliding_window(1, 0), masks.predicate(lambda i, j: j == 0)),
            masks.or_masks(masks.sliding_window(1, 0), masks.predicate(lambda i, j: j == 0)),
        )
    raise AssertionError(kind)


MASK_KINDS = [
    "causal",
    "causal-bottom-right",
    "sliding",
    "key_padding",
    "dense",
    "predicate",
    "and",
    "or",
]


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_masks_evaluate_on_torch_index_tensors(kind):
    _, mask = _mask_pair(kind, 6, 9)
    ctx = TorchContext(torch.float64)
    geometry = masks.Geometry(n_q=6, n_k=9, batch=(2, 3))
    allowed = masks.create_mask(mask, geometry, ctx)
    assert isinstance(allowed, torch.Tensor) and allowed.dtype == torch.bool


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("row_block", [None, 2])
def test_forward_and_reverse_match_numpy(kind, row_block):
    """The same algorithm over TorchContext and NumpyContext (float64) agrees to rounding."""
    n_q, n_k = 7, 9
    q, k, v = qkv((2, 3, n_q, 4), (2, 3, n_k, 4), (2, 3, n_k, 5), seed=3)
    g = torch.from_numpy(np.random.default_rng(9).standard_normal((2, 3, n_q, 5)))
    np_mask, torch_mask = _mask_pair(kind, n_q, n_k)
    runs = []
    for ctx, mask, convert in (
        (NumpyContext("float64"), np_mask, lambda x: x.numpy()),
        (TorchContext(torch.float64), torch_mask, lambda x: x),
    ):
        a = [convert(x) for x in (q, k, v, g)]
        keywords = dict(scale=ctx.scalar(0.6), block_size=4, mask=mask, row_block=row_block)
        y, state = algorithm.forward(ctx, *a[:3], **keywords)
        grads = algorithm.backward(ctx, *a[:3], y, state.m, state.l, a[3], **keywords)
        runs.append([torch.as_tensor(np.asarray(x)) for x in (y, state.m, *grads)])
    for name, got, want in zip(("y", "m", "dq", "dk", "dv"), runs[1], runs[0]):
        assert_close(got, want, atol=1e-13, what=name)


def test_half_precision_policy_matches_numpy_fa2():
    """fp16 storage, fp32 statistics, p cast to fp16: the NumPy FA-2 policy, to rounding."""
    q, k, v = qkv((2, 40, 16), (2, 40, 16), seed=5, dtype=torch.float16)
    runs = []
    for ctx, a in (
        (
            NumpyContext("float16", compute="float32", p_cast="float16"),
            [x.numpy() for x in (q, k, v)],
        ),
        (TorchContext(torch.float16), [q, k, v]),
    ):
        y, state = algorithm.forward(ctx, *a, scale=ctx.default_scale(16), block_size=16)
        runs.append([torch.as_tensor(np.asarray(x)) for x in (y, state.l, ctx.output(y))])
    (y_np, l_np, out_np), (y_t, l_t, out_t) = runs
    assert y_t.dtype == l_t.dtype == torch.float32 and out_t.dtype == torch.float16
    assert_close(l_t, l_np, atol=0, rtol=1e-5, what="l")
    # torch's vectorised exp and libm's differ by up to one fp32 ulp, so a p lying on an
    # fp16 rounding boundary may round to the neighbouring fp16 value on one side: the two
    # libraries agree to a few such flips (each moves y by < 2^-12·max|v|).
    assert_close(y_t, y_np, atol=2.0**-10 * float(v.abs().max()), what="y, NumPy vs torch")
    assert_close(out_t, out_np, atol=2e-3, what="y (one fp16 ulp at |y| < 2)")


def test_half_precision_policy_rounds_p_to_the_input_dtype():
    """One key block, FA-2 policy: y = fl16(p)·V / ℓ with p = e^{s−m} and ℓ in fp32."""
    q, k, v = qkv((2, 40, 16), (2, 40, 16), seed=5, dtype=torch.float16)
    ctx = TorchContext(torch.float16)
    y, _ = algorithm.forward(ctx, q, k, v, scale=ctx.default_scale(16), block_size=64)
    s = (q.float() @ k.float().transpose(-1, -2)) * ctx.default_scale(16)
    p = torch.exp(s - s.amax(-1, keepdim=True))
    want = (p.half().float() @ v.float()) / p.sum(-1, keepdim=True)
    # fp32 exp differs in its last bits between kernels (SLEEF on AVX2/AVX-512, scalar libm
    # under ATEN_CPU_CAPABILITY=default): where they decide p's fp16 rounding, either
    # neighbour is right, so such entries may differ by their fp16 spacing
    lo, hi = ((p * (1 + e)).half().float() for e in (-(2.0**-20), 2.0**-20))
    either = ((hi - lo) @ v.float().abs()) / p.sum(-1, keepdim=True)
    excess = (y.double() - want.double()).abs() - either.double()
    assert float(excess.max()) <= 1e-6, "y with p rounded to fp16"
    unrounded = (p @ v.float()) / p.sum(-1, keepdim=True)  # the check can tell the two apart
    assert float(((unrounded - want).abs() - either).max()) > 1e-5
