"""The Triton kernels against the float64 naive reference (exactattn.naive_attention).

Every test runs the fused forward and backward on quantised inputs and compares O, lse,
dQ, dK and dV with the materialising reference evaluated in float64 on the *same*
(already rounded) inputs, so only the kernels' own rounding is measured.

Tolerance. The kernels round to the input format a fixed number of times on every path
(P and gamma before their dot products, the stored outputs), and accumulate every sum of n
terms in float32, whose error grows like sqrt(n) u_acc (probabilistic rounding-error
analysis, Higham & Mary, SIAM J. Sci. Comput. 2019). Hence::

    |x - x_ref|_max <= LAMBDA * (u + sqrt(n) * u_acc) * max(|x_ref|_max, 1)

with u the unit roundoff of the input format (2^-24 float32, 2^-11 float16, 2^-8
bfloat16), u_acc = 2^-24 (float32 accumulation and statistics; lse uses u = u_acc for every
input dtype), n = n_q + n_k + d the problem size and LAMBDA = 8, which leaves room for the
cancellation in dO.V - delta when a row has a single allowed key. The tests use 16 x 16
tiles so that every size below spans several blocks, ragged last blocks and partially
masked tiles.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import exactattn
from exactattn.core import masks
from tests.optional import requires

torch, _ = requires("torch", "triton")

UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
U_ACC = UNIT_ROUNDOFF[torch.float32]
LAMBDA = 8
BLOCKS = {"block_m": 16, "block_n": 16}


def tolerance(u: float, n: int, ref: np.ndarray) -> float:
    """LAMBDA * (u + sqrt(n) * u_acc) * max(|ref|_max, 1), over the finite entries of ref."""
    finite = ref[np.isfinite(ref)]
    scale = max(float(np.abs(finite).max()) if finite.size else 0.0, 1.0)
    return LAMBDA * (u + math.sqrt(n) * U_ACC) * scale


def reference_mask(causal=None, window=None, alignment=None, kv_lengths=None):
    """The same mask built from exactattn.core.masks, independently of the kernels' code."""
    align = causal or alignment or "top-left"
    pieces = []
    if causal is not None:
        pieces.append(masks.causal(alignment=causal))
    if window is not None:
        pieces.append(masks.sliding_window(window[0], window[1], alignment=align))
    if kv_lengths is not None:
        pieces.append(masks.key_padding(torch.as_tensor(kv_lengths).cpu().numpy()))
    if not pieces:
        return None
    return pieces[0] if len(pieces) == 1 else masks.and_masks(*pieces)


def make_inputs(shape_q, shape_k, dv, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    batch, heads_kv, n_k, _ = shape_k
    q = torch.randn(shape_q, generator=gen).to(dtype)
    k = torch.randn(shape_k, generator=gen).to(dtype)
    v = torch.randn((batch, heads_kv, n_k, dv), generator=gen).to(dtype)
    do = torch.randn((*shape_q[:3], dv), generator=gen).to(dtype)
    return tuple(x.to(device) for x in (q, k, v, do))


def f64(x: torch.Tensor) -> np.ndarray:
    return x.detach().to(device="cpu", dtype=torch.float64).numpy()


def run_and_compare(tk, q, k, v, do, *, scale=None, blocks=BLOCKS, **mask_kw):
    """Run both kernels and the reference; assert every output is within tolerance."""
    batch, heads, n_q, d = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    group = heads // heads_kv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    o, lse = tk.triton_forward(q, k, v, scale=scale, **mask_kw, **blocks)
    dq, dk, dv = tk.triton_backward(q, k, v, o, lse, do, scale=scale, **mask_kw, **blocks)

    # reference: GQA by repeating each key/value head for its group, then summing back
    kr = np.repeat(f64(k), group, axis=1)
    vr = np.repeat(f64(v), group, axis=1)
    mask = reference_mask(**mask_kw)
    y, stats = exactattn.naive_attention(
        f64(q), kr, vr, scale=scale, mask=mask, return_stats=True, empty_rows="zero"
    )
    rq, rk, rv = exactattn.naive_attention_backward(
        f64(q), kr, vr, y, stats, f64(do), scale=scale, mask=mask, empty_rows="zero"
    )
    rk = rk.reshape(batch, heads_kv, group, n_k, d).sum(2)
    rv = rv.reshape(batch, heads_kv, group, n_k, v.shape[-1]).sum(2)

    n = n_q + n_k + d
    u = UNIT_ROUNDOFF[q.dtype]
    checks = {"o": (o, y, u), "lse": (lse, stats.lse, U_ACC)}
    checks.update({"dq": (dq, rq, u), "dk": (dk, rk, u), "dv": (dv, rv, u)})
    for name, (got, ref, unit) in checks.items():
        got = f64(got)
        ref = np.asarray(ref, dtype=np.float64)
        assert got.shape == ref.shape, f"{name}: shape {got.shape} != {ref.shape}"
        assert np.array_equal(np.isneginf(got), np.isneginf(ref)), f"{name}: -inf pattern"
        assert np.isfinite(got[~np.isneginf(got)]).all(), f"{name}: nan or +inf"
        both = np.isfinite(ref)
        err = float(np.abs(got[both] - ref[both]).max(initial=0.0))
        tol = tolerance(unit, n, ref)
        assert err <= tol, f"{name}: max error {err:.3g} > tolerance {tol:.3g}"
    return o, lse, dq, dk, dv


MASK_CASES = {
    "none": {},
    "causal-top-left": {"causal": "top-left"},
    "causal-bottom-right": {"causal": "bottom-right"},
    "window-top-left": {"window": (5, 3)},
    "window-left-only-bottom-right": {"window": (9, None), "alignment": "bottom-right"},
    "window-right-only": {"window": (None, 4)},
    "key-padding": {"kv_lengths": [53, 20]},
    "causal-window-padding": {"causal": "bottom-right", "window": (20, 7), "kv_lengths": [41, 30]},
}


@pytest.mark.parametrize("case", list(MASK_CASES))
@pytest.mark.parametrize("n_q,n_k", [(37, 53), (53, 37)], ids=["nq<nk", "nq>nk"])
def test_masks_cross_attention_ragged(tk, device, case, n_q, n_k):
    """Each mask kind and a combination, n_q != n_k both ways, ragged last blocks."""
    mask_kw = dict(MASK_CASES[case])
    if "kv_lengths" in mask_kw:
        mask_kw["kv_lengths"] = torch.tensor([min(x, n_k) for x in mask_kw["kv_lengths"]])
    q, k, v, do = make_inputs((2, 2, n_q, 16), (2, 2, n_k, 16), 16, torch.float32, device)
    run_and_compare(tk, q, k, v, do, **mask_kw)


@pytest.mark.parametrize("causal", [None, "top-left", "bottom-right"])
def test_self_attention_blocks_of_32_by_16(tk, device, causal):
    """n_q = n_k with unequal tiles (BLOCK_M = 32, BLOCK_N = 16): the skip bounds differ."""
    q, k, v, do = make_inputs((1, 2, 48, 16), (1, 2, 48, 16), 16, torch.float32, device)
    run_and_compare(tk, q, k, v, do, causal=causal, blocks={"block_m": 32, "block_n": 16})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_default_tiles(tk, device, dtype):
    """The default GPU tiles (32 x 32 float32, 64 x 64 16-bit at d = 16) on ragged sizes."""
    q, k, v, do = make_inputs((2, 1, 70, 16), (2, 1, 90, 16), 16, dtype, device)
    run_and_compare(tk, q, k, v, do, causal="bottom-right", kv_lengths=[90, 61], blocks={})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dtypes(tk, device, dtype):
    """float32 stays float32; 16-bit inputs are accurate to their own unit roundoff."""
    q, k, v, do = make_inputs((2, 2, 40, 64), (2, 2, 33, 64), 64, dtype, device)
    o, *_ = run_and_compare(tk, q, k, v, do, causal="bottom-right", window=(12, 0))
    assert o.dtype == dtype


@pytest.mark.parametrize("d", [16, 64, 256])
def test_head_dims(tk, device, d):
    n = 20 if d == 256 else 36
    q, k, v, do = make_inputs((1, 1, n, d), (1, 1, n + 3, d), d, torch.float32, device)
    run_and_compare(tk, q, k, v, do, causal="top-left")


def test_padded_head_dims_with_v_different_from_d(tk, device):
    """d = 24 and dv = 40 are padded to 32 and 64 with masked loads; d != dv is allowed."""
    q, k, v, do = make_inputs((2, 1, 30, 24), (2, 1, 45, 24), 40, torch.float32, device)
    run_and_compare(tk, q, k, v, do, window=(None, 2), kv_lengths=[45, 17])


@pytest.mark.parametrize("heads_kv", [1, 2])
def test_grouped_query_attention(tk, device, heads_kv):
    """H = 4 query heads over H_kv key/value heads; dK, dV sum over each group."""
    q, k, v, do = make_inputs((2, 4, 33, 16), (2, heads_kv, 41, 16), 16, torch.float16, device)
    run_and_compare(tk, q, k, v, do, causal="bottom-right")


def test_arbitrary_strides(tk, device):
    """(B, N, H, D) storage viewed as (B, H, N, D), and a sliced (non-unit last stride) v."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 29, 3, 16, generator=gen).to(device).transpose(1, 2)
    k = torch.randn(2, 35, 3, 16, generator=gen).to(device).transpose(1, 2)
    v = torch.randn(2, 3, 35, 32, generator=gen).to(device)[..., ::2]
    do = torch.randn(2, 29, 3, 16, generator=gen).to(device).transpose(1, 2)
    assert not q.is_contiguous() and v.stride(-1) == 2
    run_and_compare(tk, q, k, v, do, causal="top-left", scale=0.3)


def test_fully_masked_rows_give_zero_output_and_gradients(tk, device):
    """Empty A_i: O = 0, lse = -inf, no gradient, and no nan anywhere.

    Batch 0 has kv_length 0 (every row empty); in batch 1 the bottom-right causal mask
    with n_q > n_k leaves the first n_q - n_k rows without a key.
    """
    n_q, n_k = 45, 23
    q, k, v, do = make_inputs((2, 2, n_q, 16), (2, 2, n_k, 16), 16, torch.float32, device)
    mask_kw = {"causal": "bottom-right", "kv_lengths": torch.tensor([0, n_k])}
    o, lse, dq, dk, dv = run_and_compare(tk, q, k, v, do, **mask_kw)
    empty_rows = n_q - n_k
    assert torch.isneginf(lse[0]).all() and torch.isneginf(lse[1, :, :empty_rows]).all()
    assert torch.isfinite(lse[1, :, empty_rows:]).all()
    for x in (o[0], o[1, :, :empty_rows], dq[0], dq[1, :, :empty_rows], dk[0], dv[0]):
        assert torch.equal(x, torch.zeros_like(x))


def test_rows_whose_window_lies_beyond_the_last_key(tk, device):
    """window (0, 0) top-left with n_q > n_k: rows i >= n_k have no key j = i."""
    n_q, n_k = 40, 18
    q, k, v, do = make_inputs((1, 1, n_q, 16), (1, 1, n_k, 16), 16, torch.float32, device)
    o, lse, dq, _, _ = run_and_compare(tk, q, k, v, do, window=(0, 0))
    assert torch.isneginf(lse[..., n_k:]).all() and torch.isfinite(lse[..., :n_k]).all()
    assert not o[..., n_k:, :].abs().sum() and not dq[..., n_k:, :].abs().sum()


def bad_calls(q, k, v):
    """Invalid calls of triton_forward: name -> ((q, k, v), keywords, error, message)."""
    ok = (q, k, v)
    return {
        "float64": ((q.double(), k.double(), v.double()), {}, TypeError, "float16"),
        "mixed-dtypes": ((q, k.half(), v), {}, TypeError, "share one dtype"),
        "3d-q": ((q[0], k, v), {}, ValueError, "4 dimensions"),
        "k-v-lengths": ((q, k[:, :, :5], v), {}, ValueError, "H_kv and n_k"),
        "q-k-head-dims": ((q, k[..., :8], v), {}, ValueError, "head dimension d"),
        "heads-not-a-multiple": ((torch.cat([q, q[:, :1]], 1), k, v), {}, ValueError, "multiple"),
        "causal-name": (ok, {"causal": "upper"}, ValueError, "causal"),
        "alignments-disagree": (
            ok,
            {"causal": "top-left", "alignment": "bottom-right"},
            ValueError,
            "disagree",
        ),
        "window-not-a-pair": (ok, {"window": (1,)}, ValueError, "window"),
        "window-negative": (ok, {"window": (-1, 2)}, ValueError, "left"),
        "kv-lengths-shape": (ok, {"kv_lengths": [3]}, ValueError, r"\(B,\)"),
        "kv-lengths-float": (ok, {"kv_lengths": [1.5, 2.0]}, TypeError, "integ"),
        "block-not-power-of-two": (ok, {"block_m": 24}, ValueError, "power of two"),
        "scale-nan": (ok, {"scale": float("nan")}, ValueError, "finite"),
    }


BAD_CALLS = list(bad_calls(*(torch.zeros(2, 2, 8, 16),) * 3))


@pytest.mark.parametrize("case", BAD_CALLS)
def test_invalid_arguments_raise_clear_errors(tk, device, case):
    q, k, v, _ = make_inputs((2, 2, 8, 16), (2, 2, 8, 16), 16, torch.float32, device)
    args, keywords, error, match = bad_calls(q, k, v)[case]
    with pytest.raises(error, match=match):
        tk.triton_forward(*args, **{"scale": 0.25, **keywords})


def test_head_dim_above_256_is_rejected(tk, device):
    q, k, v, _ = make_inputs((1, 1, 4, 16), (1, 1, 4, 16), 320, torch.float32, device)
    with pytest.raises(ValueError, match=r"1\.\.256"):
        tk.triton_forward(q, k, v, scale=1.0)


def test_backward_checks_forward_outputs(tk, device):
    q, k, v, do = make_inputs((1, 2, 8, 16), (1, 2, 8, 16), 16, torch.float32, device)
    o, lse = tk.triton_forward(q, k, v, scale=0.25)
    with pytest.raises(ValueError, match="lse must have shape"):
        tk.triton_backward(q, k, v, o, lse[:, :1], do, scale=0.25)
    with pytest.raises(TypeError, match="o must have q's dtype"):
        tk.triton_backward(q, k, v, o.half(), lse, do, scale=0.25)
