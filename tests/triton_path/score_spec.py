"""The specification side of the score-modification tests, written from the definitions.

Nothing here calls exactattn: the masks are their predicates, the attention is the naive
formula, and the gradients are torch autograd's derivatives of that formula in float64::

    s_ij   = c * q_i . k_j
    s_ij  <- cap * tanh(s_ij / cap)                       (softcap)
    s_ij  <- s_ij + b_ij                                  (bias, broadcast to (B, H, n_q, n_k))
    s_ij  <- -inf   where j is not in A_i or b_ij = -inf  (mask)
    O_i    = sum_j exp(s_ij - lse_i) V_j,  lse_i = log sum_j exp(s_ij)
    O_i    = 0, lse_i = -inf                              (a row with no allowed key)
    L      = sum dO * O;   dQ, dK, dV, dbias = dL/d(q, k, v, b)

The bias is an autograd leaf of its own (broadcast) shape, so its gradient is summed over the
broadcast axes by autograd; under grouped-query attention query head h reads key/value head
h // (H / H_kv), and autograd sums the group's contributions back.

Tolerance (as in test_triton_kernels, with one more term): the kernels round to the input
format a fixed number of times and accumulate in float32, so the error is within
``LAMBDA * (u + sqrt(n) * u_acc) * max(|ref|, 1)``; the modified scores s'_ij also carry an
absolute error of a few u_acc * |s'_ij| (tanh within 3 units of 2^-24, one rounding for the
bias add), which moves each p_ij by that relative amount: ``+ LAMBDA * S * u_acc`` with S the
largest finite |s'_ij|.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
U_ACC = UNIT_ROUNDOFF[torch.float32]
LAMBDA = 8


def allowed_pairs(
    batch: int,
    n_q: int,
    n_k: int,
    *,
    causal: str | None = None,
    window: tuple[int | None, int | None] | None = None,
    alignment: str | None = None,
    kv_lengths: list[int] | torch.Tensor | None = None,
) -> torch.Tensor:
    """A_i as a bool (B, 1, n_q, n_k) array from the predicates.

    o = n_k - n_q for the bottom-right alignment, else 0; causal: j <= i + o;
    window (L, R): i + o - L <= j <= i + o + R; key padding: j < kv_lengths[b].
    """
    i = torch.arange(n_q)[:, None]
    j = torch.arange(n_k)[None, :]
    o = n_k - n_q if (causal or alignment) == "bottom-right" else 0
    ok = torch.ones(n_q, n_k, dtype=torch.bool)
    if causal is not None:
        ok &= j <= i + o
    if window is not None:
        left, right = window
        if left is not None:
            ok &= j >= i + o - left
        if right is not None:
            ok &= j <= i + o + right
    ok = ok.expand(batch, 1, n_q, n_k)
    if kv_lengths is not None:
        lengths = torch.as_tensor(kv_lengths).cpu().view(batch, 1, 1, 1)
        ok = ok & (j < lengths)
    return ok


@dataclass
class Expected:
    """The float64 reference: outputs, gradients and the largest finite modified score."""

    o: torch.Tensor
    lse: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dbias: torch.Tensor | None
    s_max: float


def f64(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to(device="cpu", dtype=torch.float64)


def expected(q, k, v, do, *, scale, bias=None, softcap=None, allowed=None) -> Expected:
    """The naive attention of the module docstring and its gradients, in float64."""
    q, k, v = (f64(x).requires_grad_() for x in (q, k, v))
    b = None if bias is None else f64(bias).requires_grad_()
    group = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = scale * (q @ kr.transpose(-1, -2))
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    excluded = torch.zeros(s.shape, dtype=torch.bool)
    if allowed is not None:
        excluded = excluded | ~allowed
    if b is not None:
        s = s + b
        excluded = excluded | torch.isneginf(b.detach())
    s = s.masked_fill(excluded, -math.inf)
    # softmax does not depend on the shift, so the max is a constant (never differentiated)
    m = s.detach().amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, 0.0)
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    empty = l == 0
    l_safe = torch.where(empty, 1.0, l)
    o = (e / l_safe) @ vr
    lse = torch.where(empty, -math.inf, m + torch.log(l_safe)).squeeze(-1)
    leaves = (q, k, v) if b is None else (q, k, v, b)
    grads = torch.autograd.grad((o * f64(do)).sum(), leaves)
    finite = s.detach()[torch.isfinite(s.detach())]
    s_max = float(finite.abs().max()) if finite.numel() else 0.0
    dbias = grads[3] if b is not None else None
    return Expected(o.detach(), lse.detach(), *grads[:3], dbias, s_max)


def tolerance(u: float, n: int, s_max: float, ref: np.ndarray) -> float:
    """LAMBDA * (u + (sqrt(n) + S) * u_acc) * max(|ref|_max, 1) over the finite entries."""
    finite = ref[np.isfinite(ref)]
    scale = max(float(np.abs(finite).max()) if finite.size else 0.0, 1.0)
    return LAMBDA * (u + (math.sqrt(n) + s_max) * U_ACC) * scale


def assert_close(name: str, got: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    """Same shape, the same -inf entries, no NaN or +inf, finite entries within tol."""
    got = f64(got).numpy()
    ref = ref.numpy()
    assert got.shape == ref.shape, f"{name}: shape {got.shape} != {ref.shape}"
    assert np.array_equal(np.isneginf(got), np.isneginf(ref)), f"{name}: -inf pattern"
    assert np.isfinite(got[~np.isneginf(got)]).all(), f"{name}: nan or +inf"
    both = np.isfinite(ref)
    err = float(np.abs(got[both] - ref[both]).max(initial=0.0))
    assert err <= tol, f"{name}: max error {err:.3g} > tolerance {tol:.3g}"
