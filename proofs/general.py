"""Family 4 — exactness for every n: the general argument, and its lemmas checked.

The enumerated families run the code at fixed sizes. This one proves, for *all* n, b and
masks, that the code's result is exact, from lemmas about the code's individual steps
(each checked symbolically below on the library's own step functions) and the structure
of the loops in ``algorithm.forward`` / ``algorithm.backward``.

Lemma A (shift). ``e^{s − m} · e^m = e^s`` for every real ``m`` (``ctx.exp_shifted``).
Lemma B (homomorphism). ``φ(m, ℓ, z) = (ℓ e^m, z e^m)`` satisfies
``φ(a ⋆ b) = φ(a) + φ(b)`` for whatever shift ``M`` the merge rescales to (``merge`` run
with a free ``M``).
Lemma C (ratio). ``z / ℓ = (z e^m) / (ℓ e^m)`` (``finalize``), so ``Y`` depends on the
summary only through ``φ``.
Lemma D (softmax gradient, other columns lumped). With ``w = e^σ``, the other keys lumped
into ``R = Σ_{k≠j} w_k G·V_k`` and ``W = Σ_{k≠j} w_k`` (free symbols: *any* number of
other keys), ``L = (w·G·V_j + R)/(w + W)`` has ``∂L/∂σ = p (G·V_j − L)`` (``tile_gamma``
with ``δ = L = G·Y``) and ``∂L/∂V_j = p G`` (``value_gradient``), ``p = w/(w + W)``.
Lemma E (chain rule). ``σ = c q·k`` gives ``∂/∂q = c γ k`` and ``∂/∂k = c γ q``
(``query_gradient``, ``key_gradient``), for any d.
Lemma F (δ). ``softmax_delta(G, Y) = G·Y = Σ_j p_j G·V_j`` when ``Y = Σ_j p_j V_j``.

Induction (forward). By Lemma A, ``φ(block_summary(J ∩ A_i)) = Σ_{j∈J∩A_i}(e^{s_ij},
e^{s_ij} V_j)`` — a sum of one term per key, whatever the block's size. The forward starts
from ``φ(⊥) = (0, 0)`` and replaces the state by ``state ⋆ block``; by Lemma B, after
blocks ``J_1..J_t`` the state's ``φ`` is ``Σ_{j∈(J_1∪…∪J_t)∩A_i} (e^{s_ij}, e^{s_ij}V_j)``
(empty tiles, which the code skips, contribute nothing). After the last block the union
is ``A_i``, and by Lemma C ``Y_i = z/ℓ = Σ e^{s_ij}V_j / Σ e^{s_ij}``: exact for every
n, b and mask (with nonempty ``A_i``). ``lse = m + log ℓ = log(ℓ e^m)`` likewise.
Reverse. ``L = Σ_i G_i·Y_i``; each ``Y_i`` depends on key j only through ``s_ij`` and
``V_j``, so ``∂L/∂s_ij`` and ``∂L/∂V_j`` are sums over (i, j) of the per-entry terms of
Lemma D (with the other keys lumped into R, W — so for any n), and the chain rule
(Lemma E) turns them into ``dQ``, ``dK``. The code's reverse visits every allowed (i, j)
exactly once (the tiles partition the key axis; skipped tiles have ``p = 0``), computes
``p_ij = e^{s_ij − m_i}/ℓ_i`` (= the softmax weight by Lemma A with the frozen m, ℓ), δ by
Lemma F, and accumulates exactly those terms: exact for every n, b and mask.

What is proved for all n: Lemmas A–F (symbolic in every variable, with the lumped symbols
standing for any number of other keys) and hence, with the loop structure above, the
theorem. What is proved only for the enumerated sizes: that the code's *indexing* (tile
boundaries, masks, row spans, batch broadcasting, the loops themselves) matches that
structure — families 2, 3 and 5 check this by running the code, at the sizes they list.
"""

from __future__ import annotations

import numpy as np
import sympy

import exactattn
from exactattn import algorithm
from exactattn.algorithm import Summary

from .engine import Obligation, check_equal
from .monoid import AnyShift, phi, summary

FAMILY = "general"
CTX = exactattn.SympyContext()


def _arr(*rows: list) -> np.ndarray:
    return np.array(rows, dtype=object) + sympy.S.Zero


def lemma_a() -> None:
    s, m = sympy.Symbol("s", real=True), sympy.Symbol("m", real=True)
    shifted = CTX.exp_shifted(_arr([s]), np.array([m], dtype=object))[0, 0]
    check_equal("e^{s−m}·e^m vs e^s", shifted * sympy.exp(m), sympy.exp(s))


def lemma_b() -> None:
    a, b = summary(1, 2), summary(2, 2)
    lhs, (la, za), (lb, zb) = phi(algorithm.merge(AnyShift(), a, b)), phi(a), phi(b)
    check_equal(
        "φ(a ⋆_M b) vs φ(a) + φ(b)", [lhs[0][0], *lhs[1][0]], [la[0] + lb[0], *(za + zb)[0]]
    )


def lemma_c() -> None:
    s = summary(1, 2)
    e = sympy.exp(s.m[0])
    check_equal(
        "finalize(m, ℓ, z) vs (z e^m)/(ℓ e^m)",
        algorithm.finalize(CTX, s)[0],
        s.z[0] * e / (s.l[0] * e),
    )


def lemma_d() -> None:
    sigma = sympy.Symbol("sigma", real=True)
    big_w, big_r = sympy.Symbol("W", positive=True), sympy.Symbol("R", real=True)
    g = [sympy.Symbol(f"g{a}", real=True) for a in range(2)]
    vj = [sympy.Symbol(f"vj{a}", real=True) for a in range(2)]
    w = sympy.exp(sigma)
    gv = g[0] * vj[0] + g[1] * vj[1]
    loss = (w * gv + big_r) / (w + big_w)
    p = w / (w + big_w)
    gamma = algorithm.tile_gamma(CTX, _arr([p]), _arr([gv]), np.array([loss], dtype=object))
    check_equal("∂L/∂σ vs tile_gamma", sympy.diff(loss, sigma), gamma[0, 0])
    dv = algorithm.value_gradient(CTX, _arr([p]), _arr(g))
    check_equal("∂L/∂V_j vs value_gradient", [sympy.diff(loss, x) for x in vj], list(dv[0]))


def lemma_e() -> None:
    c, gamma = sympy.Symbol("c", positive=True), sympy.Symbol("gamma", real=True)
    q = [sympy.Symbol(f"q{r}", real=True) for r in range(3)]
    k = [sympy.Symbol(f"k{r}", real=True) for r in range(3)]
    sigma = c * sum(a * b for a, b in zip(q, k))
    dq = algorithm.query_gradient(CTX, _arr([gamma]), _arr(k), c)[0]
    dk = algorithm.key_gradient(CTX, _arr([gamma]), _arr(q), c)[0]
    check_equal("γ ∂σ/∂q vs query_gradient", [gamma * sympy.diff(sigma, x) for x in q], list(dq))
    check_equal("γ ∂σ/∂k vs key_gradient", [gamma * sympy.diff(sigma, x) for x in k], list(dk))


def lemma_f() -> None:
    p = [sympy.Symbol(f"p{j}", positive=True) for j in range(3)]
    v = [[sympy.Symbol(f"v{j}_{a}", real=True) for a in range(2)] for j in range(3)]
    g = [sympy.Symbol(f"g{a}", real=True) for a in range(2)]
    y = [sum(p[j] * v[j][a] for j in range(3)) for a in range(2)]
    delta = algorithm.softmax_delta(CTX, _arr(g), _arr(y))[0]
    rhs = sum(p[j] * sum(g[a] * v[j][a] for a in range(2)) for j in range(3))
    check_equal("softmax_delta(G, Y) vs Σ_j p_j G·V_j", delta, rhs)


def lemma_block_sum() -> None:
    # φ(block_summary(I)) = Σ_{j∈I} (e^{s_j}, e^{s_j} V_j): one term per key (Lemma A termwise).
    for size in (1, 2, 3):
        s = np.array([[sympy.Symbol(f"s{j}", real=True) for j in range(size)]], dtype=object)
        v = np.array([[sympy.Symbol(f"v{j}", real=True)] for j in range(size)], dtype=object)
        block = algorithm.block_summary(CTX, s, v)
        ell, z = phi(Summary(block.m, block.l, block.z))
        e = [sympy.exp(x) for x in s[0]]
        check_equal(f"|I|={size} φ ℓ-part vs Σ e^s", ell[0], sum(e))
        check_equal(
            f"|I|={size} φ z-part vs Σ e^s V", z[0, 0], sum(a * b for a, b in zip(e, v[:, 0]))
        )


def obligations(max_n: int = 4) -> list[Obligation]:
    return [
        Obligation(FAMILY, "Lemma A: e^{s−m}·e^m = e^s (exp_shifted)", "any real m", lemma_a),
        Obligation(FAMILY, "Lemma B: φ(a ⋆_M b) = φ(a) + φ(b), any shift M", "z ∈ R^2", lemma_b),
        Obligation(FAMILY, "Lemma C: z/ℓ = (z e^m)/(ℓ e^m) (finalize)", "z ∈ R^2", lemma_c),
        Obligation(
            FAMILY, "Lemma D: ∂L/∂σ = p(G·V_j − δ), ∂L/∂V_j = p G", "other keys lumped", lemma_d
        ),
        Obligation(FAMILY, "Lemma E: chain rule through c q·k", "d=3", lemma_e),
        Obligation(
            FAMILY, "Lemma F: δ = G·Y = Σ_j p_j G·V_j (softmax_delta)", "3 keys, v=2", lemma_f
        ),
        Obligation(
            FAMILY, "φ(block_summary(I)) = Σ_{j∈I}(e^s, e^s V)", "|I|=1..3", lemma_block_sum
        ),
    ]
