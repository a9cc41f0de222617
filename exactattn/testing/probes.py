"""The dropout probe: a foreign kernel's dropout, checked statistically.

A kernel that draws its own keep-bits cannot be compared element by element with a
reference that uses ours, so its dropout is checked for the two properties that define
inverted dropout (weights kept with probability ``1 − p`` and scaled by ``1/(1 − p)``):

* **keep-rate and factor.** With ``Q = 0`` every weight is ``p_ij = 1/n_k`` and with
  ``V = I`` (``v = n_k``) the output *is* the weight matrix: ``Y_ij = ρ_ij / n_k``, so
  each kept weight is read directly. The share of nonzero entries over all draws must be
  ``1 − p`` within 5 binomial standard deviations, and every nonzero entry must equal
  ``1/((1 − p)·n_k)`` within a few roundings (``8u``, ``u`` of the coarsest format the
  target claims).
* **unbiasedness.** Over ``draws`` independent draws on random inputs, the mean of
  ``Y`` and of the gradients must equal the exact no-dropout values: ``E[ρ] = 1`` and
  every output is linear in ``ρ`` (``dQ``, ``dK`` through ``γ = p(ρ∘dP − δ)`` with
  ``δ = Σ_j p ρ dP`` linear too). Each entry's mean must lie within 6 standard errors
  (estimated from the draws) plus the derived no-dropout tolerance of the exact value.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from ..cases import Case
from ..cases.exact import certified
from ..error.bounds import number_format
from .tolerance import bounds

KEEP_SIGMAS = 5.0
MEAN_SIGMAS = 6.0


@dataclass
class ProbeResult:
    target: str
    p: float
    keep_rate: float = math.nan
    keep_z: float = math.nan
    factor_error: float = math.nan  # max relative error of a kept entry vs 1/((1−p)n_k)
    mean_z: dict[str, float] = field(default_factory=dict)
    ok: bool = True
    detail: str = ""
    ran: bool = True  # False: the target does not support dropout (``detail`` says why)


def probe(variant, p: float = 0.3, draws: int = 200, grads: bool = True) -> ProbeResult:
    """Run both checks on ``variant`` (its dtype, its device)."""
    import torch

    result = ProbeResult(variant.name, p)
    dtype = variant.dtype
    claim = variant.claim
    u = max(2.0 ** -number_format(f).p for f in (claim.input, claim.scores, claim.stats, claim.p))
    n = 48
    eye = np.eye(n)[None, None]
    case = Case(
        q=np.zeros((1, 1, n, 8)),
        k=np.random.default_rng(0).standard_normal((1, 1, n, 8)),
        v=eye,
        g=np.zeros((1, 1, n, n)),
        block_size=n,
        dropout_p=p,
        seed=0,
        dtype=dtype,
    )
    held = {x: variant.hold(getattr(case, x)) for x in "qkvg"}
    kept, total, worst = 0, 0, 0.0
    for draw in range(max(4, draws // 20)):
        torch.manual_seed(1000 + draw)
        y = variant.run(case, held, False)["y"]
        nonzero = y != 0
        kept += int(nonzero.sum())
        total += y.size
        expected = 1 / ((1 - p) * n)
        worst = max(worst, float(np.max(np.abs(y[nonzero] / expected - 1), initial=0.0)))
    result.keep_rate = kept / total
    result.keep_z = (result.keep_rate - (1 - p)) / math.sqrt(p * (1 - p) / total)
    result.factor_error = worst
    problems = []
    if abs(result.keep_z) > KEEP_SIGMAS:
        problems.append(
            f"keep-rate {result.keep_rate:.4f} vs {1 - p:.4f} ({result.keep_z:+.1f} sigma)"
        )
    if worst > 8 * u + 2 * n * 2.0**-53:
        problems.append(f"a kept weight is off 1/((1-p) n_k) by {worst:.2e} relative")
    problems += _unbiased(variant, p, draws, grads, result)
    result.ok = not problems
    result.detail = "; ".join(problems)
    return result


def _unbiased(variant, p: float, draws: int, grads: bool, result: ProbeResult) -> list[str]:
    import torch

    rng = np.random.default_rng(1)
    shape_q, shape_kv = (1, 2, 12, 8), (1, 2, 12, 8)
    case = Case(
        q=rng.standard_normal(shape_q),
        k=rng.standard_normal(shape_kv),
        v=rng.standard_normal(shape_kv),
        g=rng.standard_normal(shape_q),
        block_size=12,
        dtype=variant.dtype,
    )
    held = {x: variant.hold(getattr(case, x)) for x in "qkvg"}
    ref = certified(case, held)
    allowed = bounds(variant, ref).bound
    dropped = dataclasses.replace(case, dropout_p=p, seed=0)
    names = ("y", "dq", "dk", "dv") if grads else ("y",)
    samples: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for draw in range(draws):
        torch.manual_seed(draw)
        out = variant.run(dropped, held, grads)
        for name in names:
            samples[name].append(out[name])
    problems = []
    for name in names:
        stack = np.stack(samples[name])
        mean, stderr = stack.mean(axis=0), stack.std(axis=0, ddof=1) / math.sqrt(draws)
        gap = np.abs(mean - ref.near[name]) - allowed[name]
        z = np.where(gap > 0, gap / np.maximum(stderr, 1e-300), 0.0)
        result.mean_z[name] = float(z.max(initial=0.0))
        if result.mean_z[name] > MEAN_SIGMAS:
            problems.append(f"mean of {name} over {draws} draws is biased ({z.max():.1f} sigma)")
    return problems
