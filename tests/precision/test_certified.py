"""The certified reference encloses attention and its VJP as the mathematics defines them.

The witness is written here from the definitions (scores, softcap, bias, mask, softmax,
dropout factors ``keep/(1 − p)``, ``δ = Σ_j P ρ dP``, the VJP) in mpmath at 300 bits, one
row at a time, and never calls the code it judges; its own rounding (~2^-290) is far inside
the balls. Every witness value must lie inside the corresponding enclosure, and broken
variants of the reference (radius dropped, δ perturbed) must be caught.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

import exactattn
from tests.optional import requires

requires("flint")

from exactattn.oracle import certified, problem
from exactattn.oracle.certified import certified_attention
from exactattn.precision.timing import time_reference

WITNESS_PREC = 300
NAMES = ("y", "lse", "dq", "dk", "dv", "dbias")


def _sum_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum an object array over the axes that broadcasting added or stretched."""
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def witness(
    q, k, v, g, *, scale=None, allowed=None, keep=None, p=0.0, bias=None, cap=None, group=1
):
    """Attention and its VJP from the definitions, in mpmath at 300 bits (``group > 1``:
    grouped-query attention, query head h reads key/value head h // group)."""
    mpf = mpmath.mpf
    k_in, v_in = k, v
    k, v = (np.repeat(x, group, axis=-3) for x in (k, v)) if group > 1 else (k, v)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n_q, d, n_k, dv = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    grid = (*batch, n_q, n_k)
    with mpmath.workprec(WITNESS_PREC):
        as_mpf = np.frompyfunc(lambda x: mpf(float(x)), 1, 1)
        Q, K, V, G = (as_mpf(np.broadcast_to(x, (*batch, *x.shape[-2:]))) for x in (q, k, v, g))
        A = np.ones(grid, bool) if allowed is None else np.broadcast_to(allowed, grid)
        R = np.ones(grid, bool) if keep is None else np.broadcast_to(keep, grid)
        B = None if bias is None else np.broadcast_to(bias, grid)
        c = 1 / mpmath.sqrt(d) if scale is None else mpf(scale)
        kappa = 1 / (1 - mpf(p))
        zero = mpf(0)
        out = {
            "y": np.full((*batch, n_q, dv), zero, dtype=object),
            "lse": np.full((*batch, n_q), -mpmath.inf, dtype=object),
            "dq": np.full((*batch, n_q, d), zero, dtype=object),
            "dk": np.full((*batch, n_k, d), zero, dtype=object),
            "dv": np.full((*batch, n_k, dv), zero, dtype=object),
            "dbias": np.full(grid, zero, dtype=object),
        }
        for b in np.ndindex(*batch):
            for i in range(n_q):
                raw = [c * mpmath.fsum(Q[b][i] * K[b][j]) for j in range(n_k)]
                t = [mpmath.tanh(x / cap) for x in raw] if cap else None
                s = [cap * t[j] if cap else raw[j] for j in range(n_k)]
                if B is not None:  # a −∞ bias excludes the pair
                    s = [
                        s[j] + mpf(float(x)) if x > -np.inf else None for j, x in enumerate(B[b][i])
                    ]
                keys = [j for j in range(n_k) if A[b][i, j] and s[j] is not None]
                if not keys:
                    continue
                m = max(s[j] for j in keys)
                e = {j: mpmath.exp(s[j] - m) for j in keys}
                l = mpmath.fsum(e.values())
                P = {j: e[j] / l for j in keys}
                rho = {j: kappa if R[b][i, j] else zero for j in keys}
                out["y"][b][i] = sum((P[j] * rho[j] * V[b][j] for j in keys), zero * V[b][0])
                out["lse"][b][i] = m + mpmath.log(l)
                dP = {j: mpmath.fsum(G[b][i] * V[b][j]) for j in keys}
                delta = mpmath.fsum(P[j] * rho[j] * dP[j] for j in keys)
                for j in keys:
                    dS = P[j] * (rho[j] * dP[j] - delta)
                    out["dbias"][b][i, j] = dS
                    dS_tilde = dS * (1 - t[j] ** 2) if cap else dS
                    out["dq"][b][i] += c * dS_tilde * K[b][j]
                    out["dk"][b][j] += c * dS_tilde * Q[b][i]
                    out["dv"][b][j] += P[j] * rho[j] * G[b][i]
        if group > 1:  # each key/value head served `group` query heads
            for name in ("dk", "dv"):
                x = out[name]
                x = x.reshape(*x.shape[:-3], x.shape[-3] // group, group, *x.shape[-2:])
                out[name] = x.sum(axis=-3)
        for name, x in (("dq", q), ("dk", k_in), ("dv", v_in)):
            out[name] = _sum_to(out[name], x.shape)
        out["dbias"] = _sum_to(out["dbias"], bias.shape) if bias is not None else None
    return out


def _outside(enc, point: dict) -> dict[str, int]:
    """Per output, how many witness values lie outside the enclosure."""
    return {
        name: int((~enc[name].contains(point[name])).sum()) for name in NAMES if name in enc.balls
    }


def _arrays(seed, q_shape, k_shape, v_shape, g_shape, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(dtype) for s in (q_shape, k_shape, v_shape, g_shape))


def _check(arrays, **keywords):
    witness_keywords = {key: keywords.get(key) for key in ("scale", "allowed", "keep", "bias")}
    point = witness(
        *arrays,
        p=keywords.get("dropout_p", 0.0),
        cap=keywords.get("softcap"),
        group=arrays[0].shape[-3] // arrays[1].shape[-3] if keywords.get("enable_gqa") else 1,
        **witness_keywords,
    )
    enc = certified_attention(*arrays, **keywords)
    assert _outside(enc, point) == dict.fromkeys(enc.balls, 0)
    assert enc.target_met and enc.max_radius < 1e-20
    return enc, point


def test_plain_attention_is_enclosed():
    enc, _ = _check(_arrays(0, (7, 3), (9, 3), (9, 3), (7, 3)), scale=0.7)
    assert enc.prec == certified.LADDER[0]
    assert set(enc.balls) == {"y", "lse", "dq", "dk", "dv"}


def test_mask_with_an_empty_row_cross_attention_and_row_blocks():
    """n_q ≠ n_k, v ≠ d, default scale 1/sqrt(d) (in arb), a row with no allowed key, and
    row blocks of 2 (4 blocks for 7 rows)."""
    rng = np.random.default_rng(1)
    allowed = rng.random((7, 5)) < 0.6
    allowed[:, 0] = True
    allowed[3] = False
    enc, _ = _check(_arrays(1, (7, 4), (5, 4), (5, 2), (7, 2)), allowed=allowed, row_block=2)
    assert enc.empty_rows.tolist() == [i == 3 for i in range(7)]
    assert np.all(enc["y"].hi[3] == 0) and enc["lse"].hi[3] == -np.inf
    assert np.all(enc["dq"].hi[3] == 0)
    # exact values keep radius 0, so a bound of 0 can be checked against them
    assert np.all(enc["y"].rad[3] == 0) and enc["lse"].rad[3] == 0
    assert np.all(enc["y"].distance(enc["y"].hi)[3] == 0)
    assert enc["lse"].distance(enc["lse"].hi)[3] == 0


def test_dropout_bias_softcap_and_broadcast_batch():
    """Batch (2, 3): q per (batch, head), k and v shared over the batch, bias per head with
    −∞ entries, keep-bits per (batch, head); rows in blocks of 3."""
    rng = np.random.default_rng(2)
    arrays = _arrays(2, (2, 3, 5, 3), (3, 6, 3), (1, 1, 6, 4), (2, 3, 5, 4))
    bias = rng.standard_normal((3, 5, 6))
    bias[0, 1, 2] = bias[2, 4, :3] = -np.inf
    keep = rng.random((2, 3, 5, 6)) < 0.7
    enc, _ = _check(
        arrays, scale=0.6, bias=bias, keep=keep, dropout_p=0.3, softcap=1.5, row_block=3
    )
    assert enc["dbias"].hi.shape == bias.shape and enc["dk"].hi.shape == (3, 6, 3)


@pytest.mark.parametrize("bias_shape", [(1, 6), (5, 1), (1, 1), (2, 1, 6)])
def test_bias_gradient_is_summed_to_the_bias_shape(bias_shape):
    rng = np.random.default_rng(3)
    arrays = _arrays(3, (2, 5, 3), (2, 6, 3), (2, 6, 2), (2, 5, 2))
    bias = rng.standard_normal(bias_shape)
    enc, _ = _check(arrays, bias=bias, row_block=2)
    assert enc["dbias"].hi.shape == bias_shape
    if bias_shape[-1] == 1:  # Σ_j dS_ij = 0: an exact zero, enclosed with a tiny radius
        assert enc["dbias"].max_radius < 1e-25


def test_two_workers_give_the_same_enclosure():
    """Blocks split over two processes; dK, dV, dQ summed across them (k broadcast)."""
    arrays = _arrays(4, (3, 6, 3), (1, 8, 3), (3, 8, 2), (3, 6, 2))
    keep = np.random.default_rng(4).random((3, 6, 8)) < 0.5
    enc, _ = _check(arrays, keep=keep, dropout_p=0.5, row_block=4, workers=2)
    one = certified_attention(*arrays, keep=keep, dropout_p=0.5, row_block=4)
    for name in enc.balls:
        assert np.allclose(enc[name].hi, one[name].hi, rtol=1e-15, atol=1e-300)


def test_grouped_query_attention():
    """H = 4 query heads over H_kv = 2 key/value heads (v shared over the batch), with a
    per-head mask and row blocks; dK and dV are summed over each group of query heads."""
    arrays = _arrays(12, (2, 4, 5, 3), (2, 2, 6, 3), (1, 2, 6, 2), (2, 4, 5, 2))
    allowed = np.random.default_rng(12).random((4, 5, 6)) < 0.7
    allowed[..., 0] = True
    enc, _ = _check(arrays, allowed=allowed, enable_gqa=True, row_block=2, workers=2)
    assert enc["dk"].hi.shape == (2, 2, 6, 3) and enc["dv"].hi.shape == (1, 2, 6, 2)
    with pytest.raises(ValueError, match="H_kv dividing"):
        certified_attention(
            *_arrays(0, (3, 2, 2), (2, 2, 2), (2, 2, 2), (3, 2, 2)), enable_gqa=True
        )


def test_single_key_and_reduced_precision_inputs():
    """n_k = 1: P = 1 and dQ, dK are exact zeros (the precision target must not chase
    them); float32 inputs are taken as the exact values they hold."""
    enc, _ = _check(_arrays(5, (4, 2), (1, 2), (1, 3), (4, 3), dtype=np.float32))
    assert enc.prec == certified.LADDER[0]


def test_no_keys_gives_empty_rows():
    q, _, _, g = _arrays(11, (3, 2), (1, 2), (1, 2), (3, 4))
    k, v = np.ones((0, 2)), np.ones((0, 4))
    enc = certified_attention(q, k, v, g, bias=np.zeros((1, 0)))
    assert enc.empty_rows.all() and enc.target_met
    assert np.all(enc["lse"].hi == -np.inf) and np.all(enc["y"].hi == 0)
    assert np.all(enc["dq"].hi == 0) and enc["dk"].hi.shape == (0, 2)


def test_the_ladder_climbs_and_an_explicit_precision_is_kept(monkeypatch):
    arrays = _arrays(6, (6, 3), (6, 3), (6, 3), (6, 3))
    low = certified_attention(*arrays, prec=40)
    assert low.prec == 40 and not low.target_met and low.max_radius > 1e-15
    monkeypatch.setattr(problem, "TARGET_BITS", 100)  # ~92 bits at 96, ~104 at 128
    climbed = certified_attention(*arrays)
    assert climbed.prec == 128 and climbed.target_met
    assert climbed.max_radius < 2.0**-30 * low.max_radius


def test_double_double_midpoints_measure_float64_results():
    arrays = _arrays(7, (8, 4), (8, 4), (8, 4), (8, 4))
    q, k, v, g = arrays
    enc = certified_attention(*arrays, scale=0.5)
    y, stats = exactattn.attention(q, k, v, scale=0.5, block_size=3, return_stats=True)
    dq = exactattn.attention_backward(q, k, v, y, stats, g, scale=0.5, block_size=3)[0]
    ball = enc["y"]
    with mpmath.workprec(200):
        exact = [float(abs(mpmath.mpf(float(a)) - b)) for a, b in zip(y.flat, ball.mpf().flat)]
    got = ball.error(y).reshape(-1)
    assert np.all(np.abs(got - np.array(exact)) <= 2.0**-100 * np.abs(y).max())
    assert 0 < got.max() < 1e-14 and got.max() > 1e10 * ball.max_radius
    assert np.all(ball.distance(y).reshape(-1) >= got) and 0 < enc["dq"].error(dq).max() < 1e-14
    assert np.array_equal(ball.error(ball.hi), np.abs(ball.lo))
    assert np.array_equal(enc["lse"].error(np.full(8, -np.inf)) == 0, np.isinf(enc["lse"].hi))
    assert all(ball.contains(ball.mpf()).flat)
    with pytest.raises(ValueError, match="shape"):
        ball.error(y[:2])


def test_distance_bounds_the_error_to_the_exact_value():
    """|x − exact| ≤ distance(x) for the definition's exact values, at x = hi (where the
    radius decides: |hi − exact| = |lo| ± rad) and at a float64 run."""
    arrays = _arrays(13, (6, 3), (7, 3), (7, 2), (6, 2))
    point = witness(*arrays, scale=0.8)
    enc = certified_attention(*arrays, scale=0.8)
    y = exactattn.attention(*arrays[:3], scale=0.8, block_size=2)
    with mpmath.workprec(WITNESS_PREC):
        for name in ("y", "dq", "dk", "dv"):
            ball = enc[name]
            for x in (ball.hi, y) if name == "y" else (ball.hi,):
                gap = np.frompyfunc(lambda a, b: abs(mpmath.mpf(float(a)) - b), 2, 1)(
                    x, point[name]
                )
                assert all((gap <= ball.distance(x)).flat), name


def test_split_encloses_balls_at_the_edges():
    """hi + lo ± rad contains each ball: wide balls around 0, tiny and huge midpoints,
    an exact 0 and −∞ (radius exactly 0 for those two)."""
    import flint

    with flint.ctx.workprec(200):
        third = flint.arb(1) / 3
        balls = [
            flint.arb(0, 1e-30),
            third,
            third * flint.arb(2) ** -1100,
            third * flint.arb(2) ** -1050,
            third * flint.arb(2) ** 1000,
            flint.arb(0),
            flint.arb("-inf"),
        ]
        hi, lo, rad = certified._split(balls)
        assert rad[5] == 0 and rad[6] == 0 and hi[6] == -np.inf
        for ball, h, l, r in zip(balls[:5], hi, lo, rad):
            gap = abs(ball.mid() - flint.arb(h) - flint.arb(l)) + ball.rad()
            assert gap <= flint.arb(r), (ball, h, l, r)


def test_a_dropped_radius_is_caught(monkeypatch):
    """The check can fail: the same midpoints with the radius dropped leave the exact values."""
    arrays = _arrays(8, (5, 3), (6, 3), (6, 2), (5, 2))
    point = witness(*arrays, scale=0.9)
    split = certified._split

    def no_radius(values):
        hi, lo, rad = split(values)
        return hi, lo, 0 * rad

    monkeypatch.setattr(certified, "_split", no_radius)
    outside = _outside(certified_attention(*arrays, scale=0.9), point)
    assert sum(outside.values()) > 0


def test_a_wrong_delta_is_caught(monkeypatch):
    """δ from a perturbed sum (as δ = G·Y with a slightly wrong Y would give): the forward
    stays enclosed, the gradients through dS leave the balls."""
    arrays = _arrays(9, (5, 3), (6, 3), (6, 2), (5, 2))
    point = witness(*arrays, scale=0.9)
    row_sums = certified._Block._row_sums
    monkeypatch.setattr(
        certified._Block, "_row_sums", lambda self, x: [s + s * 2.0**-60 for s in row_sums(self, x)]
    )
    outside = _outside(certified_attention(*arrays, scale=0.9), point)
    assert outside["y"] == outside["lse"] == outside["dv"] == 0
    assert outside["dq"] > 0 and outside["dk"] > 0


def test_row_blocks_bound_the_memory():
    """Peak traced memory grows with the block of rows, not with n_q."""
    import tracemalloc

    arrays = _arrays(10, (128, 4), (64, 4), (64, 4), (128, 4))
    peaks = {}
    for rows in (8, 128):
        tracemalloc.start()
        certified_attention(*arrays, row_block=rows, prec=96)
        peaks[rows] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peaks[8] < peaks[128] / 4


def test_time_reference_reports_both_references():
    arb, fast = time_reference(16, 4, workers=1)
    assert (arb["name"], fast["name"]) == ("arb", "float64")
    assert arb["pass"] == fast["pass"] == "fwd+bwd"
    assert 0 < arb["radius"] < 1e-20 < fast["radius"] < 1e-12
    assert [t["name"] for t in time_reference(16, 4, backward=False)] == ["arb", "float64"]


@pytest.mark.parametrize(
    ("keywords", "error", "match"),
    [
        (dict(q=np.ones((2, 2), dtype=int)), TypeError, "q must be a real NumPy float array"),
        (dict(k=np.array([[1.0, np.nan]])), ValueError, "k contains NaN or inf"),
        (dict(v=np.ones((3, 2))), ValueError, "same number of keys"),
        (dict(g=np.ones((2, 3))), ValueError, "g must have the shape of y"),
        (dict(allowed=np.ones((3, 1), dtype=bool)), ValueError, "allowed of shape"),
        (dict(allowed=np.ones((2, 1))), TypeError, "allowed must be a boolean array"),
        (dict(dropout_p=0.5), ValueError, "needs keep="),
        (dict(dropout_p=1.0, keep=np.ones((2, 1), bool)), ValueError, "dropout_p must be"),
        (dict(bias=np.array([[np.inf]])), ValueError, "bias contains NaN or \\+inf"),
        (dict(softcap=-1.0), ValueError, "softcap must be a positive"),
        (dict(scale=math.inf), ValueError, "scale must be a finite"),
        (dict(prec=8), ValueError, "prec must be an integer >= 16"),
        (dict(row_block=0), ValueError, "row_block must be"),
        (dict(workers=0), ValueError, "workers must be"),
    ],
)
def test_bad_inputs_name_the_argument(keywords, error, match):
    arrays = dict(q=np.ones((2, 2)), k=np.ones((1, 2)), v=np.ones((1, 2)), g=np.ones((2, 2)))
    arrays.update({name: keywords.pop(name) for name in "qkvg" if name in keywords})
    with pytest.raises(error, match=match):
        certified_attention(arrays["q"], arrays["k"], arrays["v"], arrays["g"], **keywords)
