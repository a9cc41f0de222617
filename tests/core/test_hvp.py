"""attention_hvp: the directional derivative of the reverse, against the definition.

The reference is written here from the definition and calls nothing of exactattn: naive
attention ``P = softmax(mod(c·QKᵀ) on A_i)``, ``Y = (P∘ρ)V``, its VJP by the softmax
Jacobian (``dS = P∘(dP − Σ_j P dP)``, ``dP = ρ∘GVᵀ``, times ``mod′``), and the derivative
of that VJP along the tangents by the complex step: every step is analytic, so
``Im F(x + i·h·ẋ)/h`` is ``F′(x)·ẋ`` to rounding for ``h = 1e-30`` (no cancellation, unlike
a finite difference). Dropout's keep-bits are the documented hash, restated below.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import exactattn as ea
from exactattn.backends import NumpyContext
from exactattn.core import hvp, masks, ops
from tests.optional import requires

from . import definition
from .helpers import inputs

H = 1e-30  # the complex step
ATOL = 1e-11


# --- the definition, on complex numbers -----------------------------------------------------
def _lowbias32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def keep_factors(p: float, seed: int, batch: tuple[int, ...], n_q: int, n_k: int) -> np.ndarray:
    """``ρ = r/(1 − p)``, ``r`` the top 24 bits of the chained hash against ``round(p·2^24)``."""
    out = np.empty((int(np.prod(batch)), n_q, n_k))
    key0 = _lowbias32(_lowbias32(seed & 0xFFFFFFFF) ^ (seed >> 32))
    for b, i, j in np.ndindex(out.shape):
        key = _lowbias32(_lowbias32(key0 ^ b) ^ i)
        top = _lowbias32(key ^ _lowbias32(j)) >> 8
        out[b, i, j] = (top >= round(p * (1 << 24))) / (1 - p)
    return out.reshape((*batch, n_q, n_k))


def reverse(q, k, v, g, c, *, allowed=None, rho=None, bias=None, softcap=None, mod=None, lam=None):
    """``(dQ, dK, dV, dB)`` of ``Σ G∘Y`` (+ ``Σ λ_i lse_i`` with ``lam``; complex-safe: no
    max shift, every step analytic).

    ``mod``: ``(f, f′)`` applied after the soft-cap and the bias; ``∂lse_i/∂s_ij = p_ij``.
    """
    u = c * np.einsum("...id,...jd->...ij", q, k)
    s, slope = u, np.ones_like(u)
    if softcap is not None:
        t = np.tanh(u / softcap)
        s, slope = softcap * t, 1 - t * t
    if bias is not None:
        s = s + bias
    if mod is not None:
        f, df = mod
        s, slope = f(s), slope * df(s)
    e = np.exp(s)
    if allowed is not None:
        e = np.where(allowed, e, 0)
    p = e / e.sum(axis=-1, keepdims=True)
    r = 1 if rho is None else rho
    dp = np.einsum("...iv,...jv->...ij", g, v) * r
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    if lam is not None:
        ds = ds + lam[..., None] * p
    du = ds * slope
    dq = c * np.einsum("...ij,...jd->...id", du, k)
    dk = c * np.einsum("...ij,...id->...jd", du, q)
    dv = np.einsum("...ij,...iv->...jv", p * r, g)
    return dq, dk, dv, ds


def sum_to(x, shape):
    x = x.sum(axis=tuple(range(x.ndim - len(shape)))) if x.ndim > len(shape) else x
    axes = tuple(a for a, n in enumerate(shape) if n == 1 and x.shape[a] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def reference_hvp(q, k, v, g, tangents, c, *, group=1, bias=None, **spec):
    """``d/dε reverse(x + εẋ)`` by the complex step, summed to the inputs' shapes (GQA: the
    key/value heads repeated ``group`` times, their gradients summed over the group)."""
    t = [np.zeros_like(x) if d is None else d for x, d in zip((q, k, v, g), tangents[:4])]
    z = [x + 1j * H * d for x, d in zip((q, k, v, g), t)]
    if group != 1:
        z[1], z[2] = (np.repeat(x, group, axis=-3) for x in z[1:3])
    b = None
    if bias is not None:
        b_dot = tangents[4] if len(tangents) > 4 and tangents[4] is not None else 0
        b = bias + 1j * H * b_dot
    dq, dk, dv, ds = (x.imag / H for x in reverse(*z, c, bias=b, **spec))
    if group != 1:
        dk, dv = (x.reshape((*x.shape[:-3], -1, group, *x.shape[-2:])).sum(-3) for x in (dk, dv))
    out = [sum_to(dq, q.shape), sum_to(dk, k.shape), sum_to(dv, v.shape)]
    return out if bias is None else [*out, sum_to(ds, bias.shape)]


def random_tangents(rng, *arrays):
    return tuple(rng.standard_normal(x.shape) for x in arrays)


def assert_hvp(got, want, what):
    assert len(got) == len(want), what
    for name, a, b in zip(("dq̇", "dk̇", "dv̇", "dḃ"), got, want):
        assert a.shape == b.shape, f"{what} {name}: shape {a.shape} vs {b.shape}"
        err = np.abs(a - b).max()
        assert err < ATOL * max(1.0, np.abs(b).max()), f"{what} {name}: max error {err:.3g}"


def library_hvp(q, k, v, g, tangents, **keywords):
    y, stats = ea.attention(q, k, v, return_stats=True, **keywords)
    return ea.attention_hvp(q, k, v, y, stats, g, tangents, **keywords)


# --- the claims -------------------------------------------------------------------------------
BATCH, N_Q, N_K = (2, 2), 5, 7


def masks_with_definitions(rng, batch, n_q, n_k):
    """Each mask kind beside its allowed set written from the definition
    (:mod:`tests.core.definition`, not the library's masks), shaped ``(*batch, n_q, n_k)``;
    kinds that leave a row with an empty ``A_i`` are dropped. ``batch`` is ``(B, H)``."""
    i, j = definition.grid(n_q, n_k)
    dense = rng.random((*batch, n_q, n_k)) < 0.5
    dense[..., 0] = True
    lengths = rng.integers(1, n_k + 1, size=batch[:1])
    padded = definition.padding(n_q, n_k, lengths)
    cases = {
        "none": (None, np.ones((n_q, n_k), dtype=bool)),
        "causal": (masks.causal(), definition.causal(n_q, n_k)),
        "causal-bottom-right": (
            masks.causal("bottom-right"), definition.causal(n_q, n_k, "bottom-right"),
        ),
        "window": (masks.sliding_window(left=2, right=1), definition.window(n_q, n_k, 2, 1)),
        "window-bottom-right": (
            masks.sliding_window(left=1, right=0, alignment="bottom-right"),
            definition.window(n_q, n_k, 1, 0, "bottom-right"),
        ),
        "padding": (masks.key_padding(lengths), padded),
        "dense": (dense, dense),
        "predicate": (masks.predicate(lambda i, j: (i + j) % 3 != 1), (i + j) % 3 != 1),
        "and": (
            masks.and_masks(masks.key_padding(lengths), masks.causal()),
            padded & definition.causal(n_q, n_k),
        ),
        "or": (
            masks.or_masks(masks.sliding_window(0, 0), masks.predicate(lambda i, j: j == 0)),
            definition.window(n_q, n_k, 0, 0) | (j == 0),
        ),
    }  # fmt: skip
    out = {}
    for name, (mask, allowed) in cases.items():
        allowed = np.broadcast_to(allowed, (*batch, n_q, n_k))
        if allowed.any(axis=-1).all():
            out[name] = (mask, allowed)
    return out


@pytest.mark.parametrize("block_size", [1, 3, 8])
def test_hvp_is_the_derivative_of_the_reverse_under_every_mask(block_size):
    rng = np.random.default_rng(block_size)
    q, k, v = inputs(rng, BATCH, N_Q, N_K, 3, 2)
    g = rng.standard_normal((*BATCH, N_Q, 2))
    t = random_tangents(rng, q, k, v, g)
    for name, (mask, allowed) in masks_with_definitions(rng, BATCH, N_Q, N_K).items():
        want = reference_hvp(q, k, v, g, t, 0.7, allowed=allowed)
        got = library_hvp(q, k, v, g, t, scale=0.7, mask=mask, block_size=block_size)
        assert_hvp(got, want, f"mask {name}, b={block_size}")


def test_score_modifications_enter_with_their_second_derivative():
    rng = np.random.default_rng(1)
    q, k, v = inputs(rng, BATCH, N_Q, N_K, 3, 2)
    g = rng.standard_normal((*BATCH, N_Q, 2))
    t = random_tangents(rng, q, k, v, g)
    bias = rng.standard_normal((N_Q, N_K))
    mod = (lambda s: 3 * np.tanh(s / 3) + 0.1 * s * s, lambda s: 1 - np.tanh(s / 3) ** 2 + 0.2 * s)
    causal = np.broadcast_to(definition.causal(N_Q, N_K, "bottom-right"), (*BATCH, N_Q, N_K))

    def score_mod(s, b, h, i, j):
        return ops.tanh(s / 3) * 3 + s * s * 0.1

    cases = {
        "softcap": (dict(softcap=1.5), dict(softcap=1.5)),
        "bias": (dict(bias=bias), dict(bias=bias)),
        "softcap then bias, causal": (
            dict(softcap=2.0, bias=bias, mask=masks.causal("bottom-right")),
            dict(softcap=2.0, bias=bias, allowed=causal),
        ),
        "score_mod": (dict(score_mod=score_mod), dict(mod=mod)),
        "softcap, bias and score_mod": (
            dict(softcap=2.5, bias=bias, score_mod=score_mod),
            dict(softcap=2.5, bias=bias, mod=mod),
        ),
    }
    for name, (keywords, spec) in cases.items():
        want = reference_hvp(q, k, v, g, t, 0.5, **spec)[:3]
        for b in (2, 8):
            got = library_hvp(q, k, v, g, t, scale=0.5, block_size=b, **keywords)
            assert_hvp(got, want, f"{name}, b={b}")


def test_a_score_mod_with_branches_and_abs():
    """``where``, comparisons and ``abs`` on the nested dual the second derivative uses."""
    rng = np.random.default_rng(2)
    q, k, v = inputs(rng, (), 4, 6, 2, 2)
    g = rng.standard_normal((4, 2))
    t = random_tangents(rng, q, k, v, g)

    def score_mod(s, b, h, i, j):
        return ops.where(s > 0, s * s, s * 0.5) + ops.abs(s) * 0.25

    mod = (
        lambda s: np.where(s.real > 0, s * s, s * 0.5) + np.where(s.real > 0, s, -s) * 0.25,
        lambda s: np.where(s.real > 0, 2 * s, 0.5) + np.where(s.real > 0, 0.25, -0.25),
    )
    want = reference_hvp(q, k, v, g, t, 1.0, mod=mod)[:3]
    assert_hvp(library_hvp(q, k, v, g, t, scale=1.0, block_size=2, score_mod=score_mod), want, "")


def test_bias_tangent_and_the_tangent_of_dbias():
    rng = np.random.default_rng(3)
    q, k, v = inputs(rng, BATCH, N_Q, N_K, 3, 2)
    g = rng.standard_normal((*BATCH, N_Q, 2))
    bias = rng.standard_normal((2, 1, N_Q, N_K))  # broadcast over heads: dḃ sums them
    t = (*random_tangents(rng, q, k, v, g), rng.standard_normal(bias.shape))
    want = reference_hvp(q, k, v, g, t, 0.6, bias=bias, softcap=2.0)
    y, stats = ea.attention(q, k, v, return_stats=True, scale=0.6, bias=bias, softcap=2.0)
    got = ea.attention_hvp(
        q, k, v, y, stats, g, ea.Tangents(*t), scale=0.6, bias=bias, softcap=2.0,
        bias_grad=True, block_size=3,
    )  # fmt: skip
    assert_hvp(got, want, "bias tangent")


def test_grouped_heads_broadcast_batch_and_zero_tangents():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 4, N_Q, 3))
    k, v = rng.standard_normal((2, 2, N_K, 3)), rng.standard_normal((2, 2, N_K, 2))
    g = rng.standard_normal((2, 4, N_Q, 2))
    t = (None, rng.standard_normal(k.shape), None, rng.standard_normal(g.shape))
    causal = np.broadcast_to(definition.causal(N_Q, N_K), (2, 4, N_Q, N_K))
    want = reference_hvp(q, k, v, g, t, 0.4, group=2, allowed=causal)
    keywords = dict(scale=0.4, mask=masks.causal(), enable_gqa=True)
    for b in (1, 4):
        assert_hvp(library_hvp(q, k, v, g, t, block_size=b, **keywords), want, f"GQA b={b}")
    kb, vb = k[:1, :1], v[:1, :1]  # broadcast over batch and heads: dk̇, dv̇ summed
    want = reference_hvp(q, kb, vb, g, (t[0], t[1][:1, :1], None, t[3]), 0.4)
    got = library_hvp(q, kb, vb, g, (t[0], t[1][:1, :1], None, t[3]), scale=0.4, block_size=3)
    assert_hvp(got, want, "broadcast")


def test_dropout_replays_the_same_keep_bits():
    rng = np.random.default_rng(5)
    q, k, v = inputs(rng, BATCH, N_Q, N_K, 3, 2)
    g = rng.standard_normal((*BATCH, N_Q, 2))
    t = random_tangents(rng, q, k, v, g)
    rho = keep_factors(0.3, 11, BATCH, N_Q, N_K)
    want = reference_hvp(q, k, v, g, t, 0.5, rho=rho)
    for b in (2, 7):
        got = library_hvp(q, k, v, g, t, scale=0.5, dropout_p=0.3, seed=11, block_size=b)
        assert_hvp(got, want, f"dropout b={b}")


def test_grad_lse_is_held_fixed():
    """``δ = G·Y − λ`` with ``λ = ∂L/∂lse`` given and untouched by the tangents: the reverse
    of ``Σ G∘Y + Σ λ·lse``, whose second derivative adds ``λ·∂²lse``."""
    rng = np.random.default_rng(6)
    q, k, v = inputs(rng, (), 4, 5, 2, 2)
    g, lam = rng.standard_normal((4, 2)), rng.standard_normal(4)
    t = random_tangents(rng, q, k, v, g)
    y, stats = ea.attention(q, k, v, return_stats=True, block_size=2)
    got = ea.attention_hvp(q, k, v, y, stats, g, t, grad_lse=lam, block_size=2)
    assert_hvp(got, reference_hvp(q, k, v, g, t, 1 / np.sqrt(2), lam=lam), "grad_lse")


@pytest.mark.parametrize("backend", ["mpmath", "flint"])
def test_other_number_systems_agree(backend):
    if backend == "flint":  # mpmath is a core dependency
        requires("flint")
    rng = np.random.default_rng(7)
    q, k, v = inputs(rng, (), 3, 4, 2, 2)
    g = rng.standard_normal((3, 2))
    t = random_tangents(rng, q, k, v, g)
    want = reference_hvp(q, k, v, g, t, 0.5, softcap=2.0)
    got = library_hvp(q, k, v, g, t, scale=0.5, softcap=2.0, block_size=2, backend=backend)
    as_float = [np.array([[float(x.mid()) if hasattr(x, "mid") else float(x) for x in row]
                          for row in a]) for a in got]  # fmt: skip
    assert_hvp(as_float, want, backend)


def _peak(n: int) -> int:
    """tracemalloc's peak of one attention_hvp call at ``n_q = n_k = n`` (b = 32, d = 8)."""
    rng = np.random.default_rng(8)
    q, k, v = inputs(rng, (), n, n, 8, 8)
    g = rng.standard_normal((n, 8))
    t = random_tangents(rng, q, k, v, g)
    y, stats = ea.attention(q, k, v, return_stats=True, block_size=32)
    tracemalloc.start()
    try:
        ea.attention_hvp(q, k, v, y, stats, g, t, block_size=32)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_peak_memory_grows_linearly_in_n():
    """Doubling n doubles the peak (tiles n×b, per-row σ, δ̇, Ẏ); an n² array would
    quadruple it."""
    small, large = _peak(256), _peak(512)
    assert large < 2.6 * small, f"peak {small} B at n = 256, {large} B at n = 512"


@pytest.mark.parametrize("row_block", [1, 2, 3])
def test_row_runs_finish_in_any_order_under_every_mask(row_block):
    """Rows split into runs that do not line up across key blocks (causal spans start at
    each block's first key; runs of 1–3 rows against blocks of 2 and 3, n_q ≠ n_k): each
    tile's second visit waits for its rows' σ, δ̇ (:func:`hvp.row_schedule`)."""
    rng = np.random.default_rng(20 + row_block)
    n_q, n_k = 7, 9
    q, k, v = inputs(rng, BATCH, n_q, n_k, 3, 2)
    g = rng.standard_normal((*BATCH, n_q, 2))
    t = random_tangents(rng, q, k, v, g)
    ctx = NumpyContext("float64")
    for name, (mask, allowed) in masks_with_definitions(rng, BATCH, n_q, n_k).items():
        want = reference_hvp(q, k, v, g, t, 0.7, allowed=allowed)
        for b in (2, 3):
            y, stats = ea.attention(q, k, v, return_stats=True, scale=0.7, mask=mask, block_size=b)
            out = hvp.hvp(
                ctx, q, k, v, y, stats.m, stats.l, g, hvp.Tangents(*t), scale=0.7,
                block_size=b, mask=masks.as_mask(mask), row_block=row_block,
            )  # fmt: skip
            assert_hvp([out.q, out.k, out.v], want, f"mask {name}, b={b}, rows {row_block}")


def _runs(draw_starts: list[int], widths: list[int]) -> list[range]:
    return [range(s, s + w) for s, w in zip(draw_starts, widths)]


@pytest.mark.parametrize("seed", range(20))
def test_the_schedule_visits_each_tile_twice_and_waits_for_its_rows(seed):
    """Each tile is first-visited once and second-visited once, after the first visit of
    every tile that shares a row with it (random runs of rows, in a random order)."""
    rng = np.random.default_rng(seed)
    count = int(rng.integers(1, 30))
    rows = _runs(list(rng.integers(0, 12, count)), list(rng.integers(1, 6, count)))
    firsts, seconds, seen = [], [], set()
    for step_firsts, step_seconds in hvp.row_schedule(rows):
        firsts += step_firsts
        seen |= set(step_firsts)
        for tile in step_seconds:
            sharing = [u for u in range(count) if set(rows[u]) & set(rows[tile])]
            assert set(sharing) <= seen, (rows, tile)
        seconds += step_seconds
    assert sorted(firsts) == sorted(seconds) == list(range(count))
    held_rows = [rows[t].start for t in firsts]
    assert held_rows == sorted(held_rows)  # by first row, stably: a row's blocks in order


# --- bad input ------------------------------------------------------------------------------
def test_bad_tangents_are_refused_by_name():
    rng = np.random.default_rng(9)
    q, k, v = inputs(rng, (), 3, 4, 2, 2)
    g = rng.standard_normal((3, 2))
    y, stats = ea.attention(q, k, v, return_stats=True)
    with pytest.raises(TypeError, match="tangents must be a Tangents"):
        ea.attention_hvp(q, k, v, y, stats, g, q)
    with pytest.raises(TypeError, match="of length 3"):
        ea.attention_hvp(q, k, v, y, stats, g, (q, k, v))
    with pytest.raises(ValueError, match=r"tangents\.k must have shape \(4, 2\); got \(3, 2\)"):
        ea.attention_hvp(q, k, v, y, stats, g, (None, q, None, None))
    with pytest.raises(ValueError, match=r"tangents\.bias needs bias="):
        ea.attention_hvp(q, k, v, y, stats, g, (None, None, None, None, np.zeros((3, 4))))
    with pytest.raises(ValueError, match=r"tangents\.v contains NaN"):
        ea.attention_hvp(q, k, v, y, stats, g, (None, None, v * np.nan, None))
    with pytest.raises(ValueError, match="takes no sinks"):
        ea.attention_hvp(q, k, v, y, stats, g, (q, k, v, g), sinks=np.zeros(1))


# --- broken twins: the reference catches them ---------------------------------------------------
def _delta_dot_without_sigma(ctx, sigma, p_dp, p_ds):
    return p_ds  # the −σ_i Σ_j p_ij dP_ij of ṗ = p(ṡ − σ) dropped


def _first_tile_skipped(original):
    seen = []

    def broken(ctx, gamma, gamma_dot, k, k_dot, scale):
        out = original(ctx, gamma, gamma_dot, k, k_dot, scale)
        seen.append(1)
        return out * 0 if len(seen) == 1 else out

    return broken


@pytest.mark.parametrize("twin", ["δ̇ without σ's term", "one tile's dQ̇ dropped", "σ dropped"])
def test_broken_twins_are_caught(monkeypatch, twin):
    rng = np.random.default_rng(10)
    q, k, v = inputs(rng, (), 4, 6, 2, 2)
    g = rng.standard_normal((4, 2))
    t = random_tangents(rng, q, k, v, g)
    want = reference_hvp(q, k, v, g, t, 1.0)
    if twin == "δ̇ without σ's term":
        monkeypatch.setattr(hvp, "delta_tangent", _delta_dot_without_sigma)
    elif twin == "one tile's dQ̇ dropped":
        broken = _first_tile_skipped(hvp.query_gradient_tangent)
        monkeypatch.setattr(hvp, "query_gradient_tangent", broken)
    else:
        monkeypatch.setattr(hvp, "probability_tangent", lambda ctx, p, s_dot, sigma: p * s_dot)
    with pytest.raises(AssertionError, match="max error"):
        assert_hvp(library_hvp(q, k, v, g, t, scale=1.0, block_size=2), want, twin)


def test_a_materialising_twin_fails_the_memory_check(monkeypatch):
    """The same visits over one (n_q, n_k) tile (b = n_k, rows whole): the peak quadruples
    with 2n."""
    original = hvp.tiles

    def whole(ctx, mask, geometry, block_size, row_block=None):
        return original(ctx, mask, geometry, geometry.n_k, None)

    monkeypatch.setattr(hvp, "tiles", whole)
    with pytest.raises(AssertionError, match="peak"):
        test_peak_memory_grows_linearly_in_n()
