"""Family 4 — exactness for every n: lemmas on the steps, and the induction as checked steps.

The enumerated families run the whole code at fixed sizes. This one proves, for *all*
n, b, row runs and masks, that the code's arithmetic is exact: each statement below is
checked symbolically on the library's own step functions (``exactattn.core.algorithm``) over
:class:`~proofs.context.ProofContext`, whose max is a free symbol — so every statement
holds for *any* value of the running max, not only the true one.

Lemma A (shift). ``e^{s − m} · e^m = e^s`` for every real ``m`` (``ctx.exp_shifted``).
Lemma B (homomorphism). ``φ(m, ℓ, z) = (ℓ e^m, z e^m)`` satisfies ``φ(a ⋆ b) = φ(a) + φ(b)``
whatever shift ``M`` the merge rescales to.
Lemma C (ratio). ``finalize = z/ℓ = (z e^m)/(ℓ e^m)``, so ``Y`` depends on the summary only
through ``φ``; ``e^{log_sum_exp} = ℓ e^m``; at ⊥ both are exact (``Y = 0``, ``lse = −∞``).
Lemma D (softmax gradient, other keys lumped). With ``w = e^σ``, the other keys lumped into
``R = Σ_{k≠j} w_k ρ_k G·V_k`` and ``W = Σ_{k≠j} w_k`` (free symbols: *any* number of other
keys), ``L = (w ρ G·V_j + R)/(w + W)`` has ``∂L/∂σ = p (ρ G·V_j − L)`` (``tile_gamma``
with ``δ = L = G·Y``) and ``∂L/∂V_j = p ρ G`` (``value_gradient``), ``p = w/(w + W)``;
ρ = 1 without dropout.
Lemma E (chain rule). ``σ = c q·k`` gives ``∂/∂q = c γ k`` and ``∂/∂k = c γ q``
(``query_gradient``, ``key_gradient``), for any d.
Lemma F (δ). ``softmax_delta(G, Y) = G·Y = Σ_j p_j ρ_j G·V_j`` when ``Y = Σ_j p_j ρ_j V_j``.
Lemma R (rows). Every step is row-local — row r of its result is the step applied to row r
alone — except ``key_gradient`` and ``value_gradient``, which are the sum of the rows'
separate contributions. So splitting the query rows into runs (``row_block``) changes no
row's arithmetic, and dK, dV add up the same terms whatever the split.
Lemma P (frozen p). ``tile_probabilities(s, m, ℓ) · ℓ e^m = e^s`` (0 off ``A_i``) for any
frozen ``m, ℓ`` — the forward's, or the torch path's ``m = lse, ℓ = 1``.
Lemma S (score modification). The library's soft-cap-then-bias tile (``exactattn.core.scores``)
maps a score σ to ``σ' = cap·tanh(σ/cap) + B`` and pulls an upstream ``γ' = ∂L/∂σ'`` back
to ``γ'·∂σ'/∂σ`` with ``dB += γ'·∂σ'/∂B = γ'`` — for every real σ, B, γ' and cap > 0. The
modification is elementwise, so the induction below runs unchanged on the modified scores
σ' (any reals), and Lemma S turns its ``∂L/∂σ'`` into ``∂L/∂σ`` and ``∂L/∂B``.

Induction over the tiles (forward), as checked steps. Fix a row i and let ``U_t`` be the
allowed keys of the first t tiles the loop visits for it. Claim ``H_t``: the state's
``φ = Σ_{j∈U_t} (e^{s_ij}, e^{s_ij} ρ_ij V_j)``.
* Base (checked, "induction base"): the loop starts from ⊥ (run with no tile at all),
  ``φ(⊥) = 0``.
* Step (checked, "induction step"): one loop body — ``tile_scores`` (−∞ off ``A_i``),
  ``block_summary`` (with ρ), ``merge`` — from a free state (or ⊥) and a tile of width
  1..4 with every pattern of masked keys, adds exactly the tile's allowed terms to ``φ``
  (Lemmas A and B); and for a tile of *symbolic* width ``w`` (:mod:`exactattn.proofs.engine.width`:
  one generic key ``j``, allowed or not, with the row sums and the key contractions as ``Σ_{j<w}``):
  the same identity for every ``w`` and every pattern.
* End (Lemma C): ``Y_i = φ_z/φ_ℓ``, ``e^{lse_i} = φ_ℓ``.
If the loop visits every allowed (b, i, j) exactly once, ``U_T = A_i`` and
``Y_i = Σ_{A_i} e^s ρ V / Σ_{A_i} e^s``: exact. Reverse: each visit adds
``c γ_ij k_j`` to dQ_i, ``c γ_ij q_i`` to dK_j and ``p_ij ρ_ij G_i`` to dV_j with
``p_ij = e^{s_ij}/Σ_{A_i} e^s`` (Lemma P and the forward), δ by Lemma F; by Lemmas D and
E these are exactly the terms of ``∂L/∂(Q, K, V)``, summed once each: exact (with score
modification, Lemma S gives each visit's ``∂L/∂σ`` and its ``dB_ij`` term). The reverse
visit is also checked for a tile of symbolic width ``w`` ("reverse visit"): it adds
``Σ_j c ∂L/∂s_j K_j`` to dQ_i and ``c ∂L/∂s_j q_i``, ``P_j ρ_j G_i`` to dK_j, dV_j.

What holds for all n: the lemmas and the induction steps (symbolic in every variable,
with lumped symbols standing for any number of other keys, and tiles of symbolic width),
and — the ``smt`` family — that ``tiles()``'s formulas are the stated loop, which visits
every allowed pair exactly once given the masks' contracts, which the built-in masks'
formulas meet (:mod:`exactattn.proofs.chain` prints the linked argument). What holds only at
enumerated sizes: the whole iterator run against the definition (``tiles``), and the end-to-end runs
of families 2, 3 and 5.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap

import numpy as np
import sympy

from exactattn.core import algorithm, masks, scores
from exactattn.core.algorithm import Summary

from ..engine import width
from ..engine.context import ProofContext
from ..engine.dual import derivatives
from ..engine.ledger import Obligation, Undecided, check_equal

FAMILY = "general"


def _arr(*rows: list) -> np.ndarray:
    return np.array(rows, dtype=object) + sympy.S.Zero


def _sym(name: str, **assumptions: bool) -> sympy.Symbol:
    return sympy.Symbol(name, **(assumptions or {"real": True}))


def free_summary(k: int, v: int) -> Summary:
    """A one-row summary with symbols ``m_k`` (real), ``l_k`` (> 0), ``z_k_a``."""
    m, l = _sym(f"m{k}"), _sym(f"l{k}", positive=True)
    return Summary(_arr([m])[0], _arr([l])[0], _arr([_sym(f"z{k}_{a}") for a in range(v)]))


def bottom(v: int) -> Summary:
    return Summary(_arr([-sympy.oo])[0], _arr([0])[0], _arr([0] * v))


def phi(s: Summary) -> tuple[np.ndarray, np.ndarray]:
    """``φ(m, ℓ, z) = (ℓ e^m, z e^m)`` (``e^{−∞} = 0`` at ⊥)."""
    e = np.vectorize(sympy.exp, otypes=[object])(s.m)
    return s.l * e, s.z * e[..., None]


# --- lemmas ---------------------------------------------------------------------------------
def lemma_a() -> None:
    s, m = _sym("s"), _sym("m")
    shifted = ProofContext().exp_shifted(_arr([s]), np.array([m], dtype=object))[0, 0]
    check_equal("e^{s−m}·e^m vs e^s", shifted * sympy.exp(m), sympy.exp(s))


def lemma_b() -> None:
    a, b = free_summary(1, 2), free_summary(2, 2)
    lhs, (la, za), (lb, zb) = phi(algorithm.merge(ProofContext(), a, b)), phi(a), phi(b)
    check_equal("φ(a ⋆_M b) ℓ-part vs φ(a) + φ(b)", lhs[0], la + lb)
    check_equal("φ(a ⋆_M b) z-part vs φ(a) + φ(b)", lhs[1], za + zb)


def lemma_c() -> None:
    ctx, s = ProofContext(), free_summary(1, 2)
    ell, z = phi(s)
    check_equal("finalize(m, ℓ, z) vs φ_z/φ_ℓ", algorithm.finalize(ctx, s), z / ell[..., None])
    lse = algorithm.log_sum_exp(ctx, s.m, s.l)
    check_equal("e^{log_sum_exp} vs φ_ℓ", np.vectorize(sympy.exp, otypes=[object])(lse), ell)
    e = bottom(2)
    y, lse = algorithm.finalize(ctx, e), algorithm.log_sum_exp(ctx, e.m, e.l)
    if list(y.flat) != [0, 0] or list(lse) != [-sympy.oo]:
        raise Undecided(f"at ⊥: Y = {y}, lse = {lse}; expected 0 and −∞")


def lemma_d() -> None:
    ctx = ProofContext()
    sigma, rho = _sym("sigma"), _sym("rho", nonnegative=True)
    big_w, big_r = _sym("W", positive=True), _sym("R")
    g, vj = [_sym(f"g{a}") for a in range(2)], [_sym(f"vj{a}") for a in range(2)]
    w = sympy.exp(sigma)
    gv = g[0] * vj[0] + g[1] * vj[1]
    for r in (sympy.S.One, rho):
        loss = (w * r * gv + big_r) / (w + big_w)
        p = w / (w + big_w)
        gamma = algorithm.tile_gamma(ctx, _arr([p]), _arr([gv * r]), np.array([loss], dtype=object))
        check_equal(
            f"ρ={r}: ∂L/∂σ vs tile_gamma", derivatives("∂L/∂σ", loss, [sigma])[0], gamma[0, 0]
        )
        dv = algorithm.value_gradient(ctx, _arr([p * r]), _arr(g))
        check_equal(f"ρ={r}: ∂L/∂V_j vs value_gradient", derivatives("∂L/∂V_j", loss, vj), dv[0])


def lemma_e() -> None:
    ctx, c, gamma = ProofContext(), _sym("c", positive=True), _sym("gamma")
    q, k = [_sym(f"q{r}") for r in range(3)], [_sym(f"k{r}") for r in range(3)]
    sigma = c * sum(a * b for a, b in zip(q, k))
    dq = algorithm.query_gradient(ctx, _arr([gamma]), _arr(k), c)[0]
    dk = algorithm.key_gradient(ctx, _arr([gamma]), _arr(q), c)[0]
    check_equal(
        "γ ∂σ/∂q vs query_gradient", [gamma * d for d in derivatives("∂σ/∂q", sigma, q)], dq
    )
    check_equal("γ ∂σ/∂k vs key_gradient", [gamma * d for d in derivatives("∂σ/∂k", sigma, k)], dk)


def lemma_f() -> None:
    p = [_sym(f"p{j}", positive=True) for j in range(3)]
    rho = [_sym(f"rho{j}", nonnegative=True) for j in range(3)]
    v = [[_sym(f"v{j}_{a}") for a in range(2)] for j in range(3)]
    g = [_sym(f"g{a}") for a in range(2)]
    y = [sum(p[j] * rho[j] * v[j][a] for j in range(3)) for a in range(2)]
    delta = algorithm.softmax_delta(ProofContext(), _arr(g), _arr(y))[0]
    rhs = sum(p[j] * rho[j] * sum(g[a] * v[j][a] for a in range(2)) for j in range(3))
    check_equal("softmax_delta(G, Y) vs Σ_j p_j ρ_j G·V_j", delta, rhs)


def lemma_p() -> None:
    ctx = ProofContext()
    s, m, l = [_sym(f"s{j}") for j in range(3)], _sym("m"), _sym("l", positive=True)
    scores = _arr([s[0], -sympy.oo, s[2]])  # one key off A_i
    p = algorithm.tile_probabilities(ctx, scores, _arr(m), _arr(l))[0]
    want = [sympy.exp(s[0]), 0, sympy.exp(s[2])]
    check_equal("tile_probabilities · ℓ e^m vs e^s (0 off A_i)", p * l * sympy.exp(m), want)


def lemma_s() -> None:
    ctx, geometry = ProofContext(), masks.Geometry(1, 1)
    sigma, big_b, gamma = _sym("sigma"), _sym("B"), _sym("gamma")
    cap = _sym("cap", positive=True)
    bias = scores.bias(_arr([big_b])).adopt(ctx)
    tile = scores.chain(scores.softcap(cap), bias).at(
        ctx, masks.tile_index(ctx, geometry, range(1), range(1)), geometry
    )
    modified = cap * sympy.tanh(sigma / cap) + big_b  # the definition
    check_equal("tile apply vs cap·tanh(σ/cap) + B", tile.apply(_arr([sigma]))[0, 0], modified)
    grads = {"bias": ctx.zeros((1, 1))}
    pulled = tile.pullback(_arr([gamma]), grads)[0, 0]
    d_sigma, d_b = derivatives("∂σ'/∂(σ, B)", modified, [sigma, big_b])
    check_equal("pullback vs γ'·∂σ'/∂σ", pulled, gamma * d_sigma)
    check_equal("dB vs γ'·∂σ'/∂B", grads["bias"][0, 0], gamma * d_b)


def rows() -> None:
    """Row r of each step's result is the step on row r alone; dK, dV add per row."""
    ctx, c = ProofContext(), _sym("c", positive=True)

    def sym_rows(name: str, n: int, cols: int) -> np.ndarray:
        return np.array([[_sym(f"{name}{r}_{a}") for a in range(cols)] for r in range(n)])

    q, k, v = sym_rows("q", 2, 2), sym_rows("k", 3, 2), sym_rows("v", 3, 2)
    allowed = np.array([[True, False, True], [False, True, True]])
    s = algorithm.tile_scores(ctx, q, k, c, allowed)
    for r in range(2):
        alone = algorithm.tile_scores(ctx, q[r : r + 1], k, c, allowed[r : r + 1])
        check_equal(f"tile_scores row {r}", s[r], alone[0])
    m, l = _arr(*[[_sym(f"m{r}")] for r in range(2)])[:, 0], sym_rows("l", 2, 1)[:, 0]
    z, g, y = sym_rows("z", 2, 2), sym_rows("g", 2, 2), sym_rows("y", 2, 2)
    block = algorithm.block_summary(ctx, s, v)
    merged = algorithm.merge(ctx, Summary(m, l, z), block)
    p = algorithm.tile_probabilities(ctx, s, m, l)
    delta = algorithm.softmax_delta(ctx, g, y)
    gamma = algorithm.tile_gamma(ctx, p, g @ v.T, delta)
    dp = g @ v.T
    for r in range(2):
        one = slice(r, r + 1)
        b1 = algorithm.block_summary(ctx, s[one], v)
        m1 = algorithm.merge(ctx, Summary(m[one], l[one], z[one]), b1)
        p1 = algorithm.tile_probabilities(ctx, s[one], m[one], l[one])
        d1 = algorithm.softmax_delta(ctx, g[one], y[one])
        gamma1 = algorithm.tile_gamma(ctx, p1, dp[one], d1)
        for what, whole, alone in (
            ("block_summary ℓ", block.l[r], b1.l[0]),
            ("block_summary z", block.z[r], b1.z[0]),
            ("merge ℓ", merged.l[r], m1.l[0]),
            ("merge z", merged.z[r], m1.z[0]),
            ("finalize", algorithm.finalize(ctx, merged)[r], algorithm.finalize(ctx, m1)[0]),
            ("tile_probabilities", p[r], p1[0]),
            ("softmax_delta", delta[r], d1[0]),
            ("tile_gamma", gamma[r], gamma1[0]),
            (
                "query_gradient",
                algorithm.query_gradient(ctx, gamma, k, c)[r],
                algorithm.query_gradient(ctx, gamma1, k, c)[0],
            ),
        ):
            check_equal(f"{what} row {r}", whole, alone)
    for name, step, other in (
        ("key_gradient", algorithm.key_gradient, (q, c)),
        ("value_gradient", lambda ctx, w, x: algorithm.value_gradient(ctx, w, x), (g,)),
    ):
        whole = step(ctx, gamma, *other)
        parts = sum(step(ctx, gamma[r : r + 1], other[0][r : r + 1], *other[1:]) for r in range(2))
        check_equal(f"{name} vs the sum of the rows' contributions", whole, parts)


# --- the induction over tiles -------------------------------------------------------------
class _NoTiles(masks.Mask):
    """A mask that reaches no row: the loop body never runs."""

    def tile(self, i, j, geometry):
        return (i < 0) & (j < 0)

    def classify(self, rows, cols, geometry):
        return masks.TileKind.EMPTY

    def row_span(self, cols, geometry):
        return range(0)


def base() -> None:
    ctx = ProofContext()
    q, k, v = (_arr(*[[_sym(f"{x}{r}")] for r in range(2)]) for x in "qkv")
    _, state = algorithm.forward(ctx, q, k, v, scale=sympy.S.One, block_size=1, mask=_NoTiles())
    values = [*state.m, *state.l, *state.z.flat]
    if values != [-sympy.oo] * 2 + [0] * 4:
        raise Undecided(f"the loop does not start from ⊥ = (−∞, 0, 0): {values}")
    ell, z = phi(state)
    check_equal("φ(initial state) vs 0", [*ell, *z.flat], [0] * 4)


def step() -> str:
    runs = 0
    for keys in range(1, 5):
        s = [_sym(f"s{j}") for j in range(keys)]
        v = _arr(*[[_sym(f"v{j}_{a}") for a in range(2)] for j in range(keys)])
        rho = [_sym(f"rho{j}", nonnegative=True) for j in range(keys)]
        for pattern in itertools.product((True, False), repeat=keys):
            for old in (free_summary(0, 2), bottom(2)):
                for dropout in (False, True):
                    _one_step(s, v, rho, np.array([pattern]), old, dropout)
                    runs += 1
    return f"{runs} steps"


def _one_step(s, v, rho, allowed, old: Summary, dropout: bool) -> None:
    ctx = ProofContext()
    k = _arr(*[[x] for x in s])
    tile = algorithm.tile_scores(ctx, _arr([1]), k, sympy.S.One, allowed)
    factors = _arr(rho) if dropout else None
    block = algorithm.block_summary(ctx, tile, v, factors)
    new = algorithm.merge(ctx, old, block)
    (ell_new, z_new), (ell_old, z_old) = phi(new), phi(old)
    weight = [sympy.exp(x) if ok else 0 for x, ok in zip(s, allowed[0])]
    rw = [w * (r if dropout else 1) for w, r in zip(weight, rho)]
    what = f"width {len(s)} allowed {allowed[0].astype(int).tolist()} ρ={dropout}"
    check_equal(f"{what}: φ_ℓ(old ⋆ tile) vs φ_ℓ(old) + Σ e^s", ell_new, ell_old + sum(weight))
    zs = z_old + _arr([sum(w * v[j, a] for j, w in enumerate(rw)) for a in range(2)])
    check_equal(f"{what}: φ_z(old ⋆ tile) vs φ_z(old) + Σ e^s ρ V", z_new, zs)


def obligations(max_n: int = 4) -> list[Obligation]:
    return [
        Obligation(FAMILY, "Lemma A: e^{s−m}·e^m = e^s (exp_shifted)", "any real m", lemma_a),
        Obligation(FAMILY, "Lemma B: φ(a ⋆_M b) = φ(a) + φ(b), any shift M", "z ∈ R^2", lemma_b),
        Obligation(FAMILY, "Lemma C: Y = φ_z/φ_ℓ, e^lse = φ_ℓ; exact at ⊥", "z ∈ R^2", lemma_c),
        Obligation(
            FAMILY, "Lemma D: ∂L/∂σ = p(ρG·V_j − δ), ∂L/∂V_j = pρG", "other keys lumped", lemma_d
        ),
        Obligation(FAMILY, "Lemma E: chain rule through c q·k", "d=3", lemma_e),
        Obligation(FAMILY, "Lemma F: δ = G·Y = Σ_j p_j ρ_j G·V_j", "3 keys, v=2", lemma_f),
        Obligation(FAMILY, "Lemma P: p·ℓe^m = e^s for any frozen m, ℓ", "3 keys", lemma_p),
        Obligation(
            FAMILY, "Lemma S: softcap then bias, pullback and dB = γ'", "any σ, B, cap", lemma_s
        ),
        Obligation(FAMILY, "Lemma R: steps are row-local; dK, dV add per row", "2 rows", rows),
        Obligation(FAMILY, "induction base: the loop starts at ⊥, φ(⊥) = 0", "2 rows", base),
        Obligation(
            FAMILY,
            "induction step: one tile adds its allowed terms to φ",
            "width 1..4, every pattern, ρ",
            step,
        ),
        Obligation(FAMILY, STEP_ANY_WIDTH, "any width w, any allowed keys, ρ", step_any_width),
        Obligation(FAMILY, VISIT_ANY_WIDTH, "any width w, any allowed keys, ρ", visit_any_width),
        Obligation(FAMILY, B_THROUGH_TILES, "forward, backward (source)", b_through_tiles),
    ]


B_THROUGH_TILES = "the forward and reverse read b only through tiles()"
STEP_ANY_WIDTH = "induction step, tile of symbolic width w: adds its terms to φ"
VISIT_ANY_WIDTH = "reverse visit, tile of symbolic width w: the terms of ∂L"


# --- a tile of any width w (symbolic) --------------------------------------------------------
def _generic_tile(d: int, v: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Query row ``q`` (1, d), key j's ``K`` (1, d) and ``V`` (1, v), and ``α(j) = 1``."""
    q = _arr([_sym(f"q{r}") for r in range(d)])
    k = np.array([[width.entry("K", r) for r in range(d)]], dtype=object)
    values = np.array([[width.entry("V", a) for a in range(v)]], dtype=object)
    return q, k, values, np.array([[width.allowed()]], dtype=object)


def _definition_weight(c: sympy.Expr, q: np.ndarray, k: np.ndarray) -> sympy.Expr:
    """``e^{s_ij}`` for an allowed key, 0 for a masked one (the definition)."""
    score = c * sum(a * b for a, b in zip(q[0], k[0]))
    return sympy.Piecewise((sympy.exp(score), width.allowed()), (0, True))


def step_any_width() -> str:
    """One loop body on a tile of symbolic width w adds exactly its allowed terms to φ."""
    c, runs = _sym("c", positive=True), 0
    q, k, values, allowed = _generic_tile(2, 2)
    rho = np.array([[width.entry("rho")]], dtype=object)
    weight = _definition_weight(c, q, k)
    for row_max, cases in ((_sym("M_t"), (0, 1)), (-sympy.oo, (0,))):
        for old in (free_summary(0, 2), bottom(2)):
            for dropout in (False, True):
                ctx = width.WidthContext(row_max)
                s = algorithm.tile_scores(ctx, q, k, c, allowed)
                block = algorithm.block_summary(ctx, s, values, rho if dropout else None)
                (ell_new, z_new), (ell_old, z_old) = phi(algorithm.merge(ctx, old, block)), phi(old)
                factor = rho[0, 0] if dropout else 1
                what = f"{'some' if cases == (0, 1) else 'no'} key allowed, ρ={dropout}"
                width.check_equal(
                    f"{what}: φ_ℓ(old ⋆ tile) vs φ_ℓ(old) + Σ_j e^s", ell_new,
                    ell_old + width.sum_over_keys(weight), cases,
                )  # fmt: skip
                zs = [width.sum_over_keys(weight * factor * values[0, a]) for a in range(2)]
                width.check_equal(
                    f"{what}: φ_z(old ⋆ tile) vs φ_z(old) + Σ_j e^s ρ V", z_new,
                    z_old + _arr(zs), cases,
                )  # fmt: skip
                runs += 1
    return f"{runs} steps, any w"


def visit_any_width() -> str:
    """One reverse visit of a tile of symbolic width w adds the definition's terms.

    With the frozen statistics ``e^{lse} = ℓ e^m`` and ``P_j = α_j e^{s_j}/e^{lse}``,
    ``∂L/∂s_j = P_j(ρ_j G·V_j − δ)`` (Lemma D), the visit must add ``Σ_j c ∂L/∂s_j K_j``
    to dQ_i, ``c ∂L/∂s_j q_i`` to dK_j and ``P_j ρ_j G_i`` to dV_j (Lemma E).
    """
    c, runs = _sym("c", positive=True), 0
    m, ell = _sym("m"), _sym("l", positive=True)
    q, k, values, allowed = _generic_tile(2, 2)
    g, delta = _arr([_sym("g0"), _sym("g1")]), _sym("delta")
    rho = np.array([[width.entry("rho")]], dtype=object)
    weight = _definition_weight(c, q, k)
    for dropout in (False, True):
        ctx = width.WidthContext(_sym("M_t"))
        s = algorithm.tile_scores(ctx, q, k, c, allowed)
        p = algorithm.tile_probabilities(ctx, s, _arr(m), _arr(ell))
        dp = ctx.matmul(g, ctx.transpose(values))
        weights = p
        if dropout:
            dp, weights = dp * rho, p * rho
        gamma = algorithm.tile_gamma(ctx, p, dp, _arr(delta))
        dq = algorithm.query_gradient(ctx, gamma, k, c)[0]
        dk = algorithm.key_gradient(ctx, gamma, q, c)[0]
        dv = algorithm.value_gradient(ctx, weights, g)[0]
        factor = rho[0, 0] if dropout else 1
        big_p = weight / (ell * sympy.exp(m))
        ds = big_p * (factor * sum(g[0, a] * values[0, a] for a in range(2)) - delta)
        what = f"ρ={dropout}"
        want_dq = [width.sum_over_keys(c * ds * k[0, r]) for r in range(2)]
        width.check_equal(f"{what}: dQ_i term vs Σ_j c ∂L/∂s_j K_j", dq, want_dq)
        width.check_equal(f"{what}: dK_j term vs c ∂L/∂s_j q_i", dk, [c * ds * x for x in q[0]])
        width.check_equal(
            f"{what}: dV_j term vs P_j ρ_j G_i", dv, [big_p * factor * x for x in g[0]]
        )
        runs += 1
    return f"{runs} visits, any w"


# --- b is read only through tiles() ----------------------------------------------------------
def block_size_uses(fn: object) -> list[str]:
    """Every read of the parameter ``block_size`` in ``fn``'s source that is not an argument
    of a call of ``tiles`` (described by its line)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    through_tiles: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "tiles":
            args = [*node.args, *(k.value for k in node.keywords)]
            through_tiles |= {id(a) for a in args if getattr(a, "id", None) == "block_size"}
    return [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and node.id == "block_size"
        and isinstance(node.ctx, ast.Load) and id(node) not in through_tiles
    ]  # fmt: skip


def b_through_tiles() -> str:
    """``algorithm.forward`` and ``algorithm.backward`` read ``b`` only as ``tiles()``'s
    argument, so two block sizes whose tilings are equal run the same arithmetic: the
    enumerated families check one ``b`` of each distinct tiling and this carries the
    verdict to the others (:func:`proofs.inputs.distinct`)."""
    for fn in (algorithm.forward, algorithm.backward):
        other = block_size_uses(fn)
        if other or "block_size" not in inspect.signature(fn).parameters:
            raise Undecided(f"{fn.__name__} reads block_size outside tiles(): {other}")
    return "2 functions"
