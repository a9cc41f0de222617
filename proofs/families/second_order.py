"""Family — the second-order reverse is exact (``exactattn.attention_hvp``).

Theorem. For every problem in the grid below and every block size ``b`` in ``1..n_k+1``,
the library's second-order reverse (:mod:`exactattn.core.hvp`: first visits gathering the
rows' ``σ_i = Σ_j p_ij ṡ_ij``, ``δ̇_i`` and ``Ẏ_i``, then per tile ``ṗ = p(ṡ − σ)``,
``γ̇ = ṗ(dP − δ) + p(dṖ − δ̇)``, ``dQ̇ += c(γ̇K + γK̇)``, ``dK̇ += c(γ̇ᵀQ + γᵀQ̇)``,
``dV̇ += (ṗ∘ρ)ᵀG + (p∘ρ)ᵀĠ``, through ``mod′`` and ``mod″`` of the score modifications)
returns exactly

    (dQ̇, dK̇, dV̇[, dḂ]) = Σ_x ẋ · ∂/∂x (∂L/∂Q, ∂L/∂K, ∂L/∂V[, ∂L/∂B]),   L = Σ G∘Y,

the directional derivative of the reverse's specification (the derivative of the
definition's ``Y``, :meth:`Problem.spec_gradients`) along free tangent symbols ``ẋ`` for every
entry ``x`` of ``Q, K, V, G`` (and ``B``, with a bias): the frozen ``m, ℓ`` cancel, nothing
is differentiated but the formula. As for the reverse, both sides are linear in ``G`` and
``Ġ`` together, so the claim is checked with ``G`` and ``Ġ`` zero but for one query row.

Grid (default ``--max-n 4``): cross-attention (n_q = n + 1, n_k = n, d = 2, v = 1, symbolic
c) for n = 1..max-n; every nonempty-row mask at n = 2; every mask case of
:mod:`proofs.engine.mask_grid` with ``min_n ≤ 3`` at n = 3 (d = 2, v = 1); the torch path's
statistics (``m = lse, ℓ = 1``) with split rows; grouped-query heads, ``enable_gqa`` with
dropout and batch broadcasting; dropout with symbolic ``ρ_ij`` and through the library's
``Dropout``; soft-cap (symbolic cap), a free-symbol bias with its tangent and ``dḂ``, and
soft-cap then bias under a bottom-right causal mask.

For every n (the all-n chain, :mod:`proofs.chain`): ``b`` is read only in the one
``tiles()`` call whose tiles both visits read, in the order of ``row_schedule`` (each tile
once per visit, the second after its rows are complete: an argument for any list of runs,
checked exhaustively on small ones and on ``tiles()``' runs); one first visit of a tile of
symbolic width ``w`` adds the definition's terms ``p_j ṡ_j``, ``p_j dP_j``,
``p_j (ṡ_j dP_j + dṖ_j)`` and ``p_j ρ_j (ṡ_j V_j + V̇_j)`` to the rows' sums and keeps the
tile's ``dP, dṖ``; a second visit adds the definition's terms of ``d/dε ∂L`` given them
and the rows' ``σ, δ, δ̇``; and ``Ẏ = w − σY``, ``δ̇ = Σ_j p(ṡ dP + dṖ) − σ Σ_j p dP`` are
the derivatives of ``Y`` and ``δ``. With the ``smt`` family's theorem that ``tiles()``
visits every allowed pair exactly once, these give the second-order reverse exact for all n.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import sympy

import exactattn
from exactattn.core import algorithm, hvp, masks
from exactattn.core.dropout import make_dropout

from ..engine import batched, symbolic_spec, width
from ..engine.batched import row_runs
from ..engine.checks import Problem, library_forward, tiling
from ..engine.counterexamples import Counterexample
from ..engine.ledger import Obligation, Refuted, Undecided, check_equal
from ..engine.mask_grid import BY_NAME, CASES, CAUSAL, full_problem, symbolic_dropout_problem
from ..engine.symbols import C, every_block_size, every_mask_check, matrix, tensor, upstream
from ..engine.terms import TermContext
from .general import block_size_uses

FAMILY = "second_order"
CAP = sympy.Symbol("cap", positive=True)


# --- the specification: the directional derivative of the reverse's -------------------------
def tangents_of(pb: Problem) -> hvp.Tangents:
    """Free tangent symbols ``q̇, k̇, v̇`` (and ``ḃ`` of a bias), shaped like the inputs."""
    dot = [tensor(name + "d", *x.shape) for name, x in zip("qkv", pb.inputs)]
    bias = None if pb.bias is None else tensor("Bd", *pb.bias.shape)
    return hvp.Tangents(*dot, None, bias)


def upstream_tangent(shape: tuple[int, ...], row: tuple[int, ...]) -> np.ndarray:
    """``Ġ`` zero except the row ``row`` (symbols ``gd_a``), like :func:`upstream`."""
    out = np.full(shape, sympy.S.Zero, dtype=object)
    out[row] = [sympy.Symbol(f"gd{a}", real=True) for a in range(shape[-1])]
    return out


def directional(e: Any, pairs: list[tuple[sympy.Symbol, Any]], d: Any) -> sympy.Expr:
    """``Σ_x ẋ·∂e/∂x`` over the (symbol, tangent) ``pairs``, built unevaluated."""
    terms = [sympy.Mul(dx, x_dot, evaluate=False) for x, x_dot in pairs if (dx := d(e, x)) != 0]
    if not terms:
        return sympy.S.Zero
    return terms[0] if len(terms) == 1 else sympy.Add(*terms, evaluate=False)


def spec_second_order(pb: Problem, row: tuple, g: np.ndarray, t: hvp.Tangents) -> list:
    """The directional derivative of ``pb.spec_gradients(row, g)`` along ``t``."""
    primals = [*pb.inputs, g] + ([pb.bias] if pb.bias is not None else [])
    dots = [t.q, t.k, t.v, t.grad_y] + ([t.bias] if pb.bias is not None else [])
    pairs = [
        (x, x_dot)
        for xs, x_dots in zip(primals, dots)
        for x, x_dot in zip(xs.flat, x_dots.flat)
        if isinstance(x, sympy.Symbol)
    ]
    d = symbolic_spec.Derivatives()
    out = []
    for grad in pb.spec_gradients(row, g):
        if grad is None:
            raise Undecided("a second-order obligation needs symbolic Q, K, V (full inputs)")
        out.append(np.vectorize(lambda e: directional(e, pairs, d), otypes=[object])(grad))
    return out


# --- the library's side ------------------------------------------------------------------------
def library_hvp(pb: Problem, b: int, run: Any, g, t, row_block=None, lse_only=False) -> tuple:
    """``(dQ̇, dK̇, dV̇[, dḂ])``: through ``exactattn.attention_hvp``, or ``core.hvp.hvp``
    where the obligation needs what the API does not take (rows split, ``m = lse, ℓ = 1``,
    symbolic ρ)."""
    ctx = TermContext()
    direct = row_block is not None or lse_only or pb.symbolic_rho is not None
    if not direct:
        return exactattn.attention_hvp(
            pb.q, pb.k, pb.v, run.y, run.stats, g, t, backend=ctx,
            bias_grad=pb.bias is not None, **pb.keywords(b),
        )  # fmt: skip
    m, l = run.m, run.l
    if lse_only:
        m, l = run.lse, np.full(run.lse.shape, sympy.S.One, dtype=object)
    grads = {} if pb.bias is None else {"bias": ctx.zeros(pb.bias.shape)}
    dropout = (
        pb.symbolic_rho if pb.symbolic_rho is not None else make_dropout(pb.dropout_p, pb.seed)
    )
    out = hvp.hvp(
        ctx, *(ctx.asarray(x) for x in pb.inputs), run.y, m, l, ctx.asarray(g), t,
        scale=ctx.scalar(pb.c), block_size=b, mask=masks.as_mask(pb.mask), dropout=dropout,
        row_block=row_block, enable_gqa=pb.enable_gqa, score_mod=pb.score_mod(ctx),
        mod_tangents={} if t.bias is None else {"bias": t.bias}, mod_grad_tangents=grads,
    )  # fmt: skip
    return (out.q, out.k, out.v, *grads.values())


def check_second_order(
    pb: Problem,
    b: int,
    row_block: int | None = None,
    lse_only: bool = False,
    specified: dict[tuple, list] | None = None,
) -> None:
    """For every query row of ``G, Ġ``: the library's second-order outputs against the
    directional derivative of the specification's gradients (``specified``: one
    obligation's store of them by row, which no ``b`` changes, computed once per run)."""
    run = library_forward(pb, b, row_block)
    t = tangents_of(pb)
    shape = (*pb.batch, pb.n_q, pb.v.shape[-1])
    where = f"b={b}" + ("" if row_block is None else f" row_block={row_block}")
    where += " (m = lse, ℓ = 1)" if lse_only else ""
    for row in np.ndindex(*shape[:-1]):
        g = upstream(shape, row)
        t_row = t._replace(grad_y=upstream_tangent(shape, row))
        got = library_hvp(pb, b, run, g, t_row, row_block, lse_only)
        if specified is None or row not in specified:
            wanted = spec_second_order(pb, row, g, t_row)
            if specified is not None:
                specified[row] = wanted
        wanted = specified[row] if specified is not None else wanted
        if len(got) != len(wanted):
            raise Undecided(f"{where}: {len(got)} outputs returned, {len(wanted)} specified")
        for name, lhs, rhs in zip(("dQ̇", "dK̇", "dV̇", "dḂ"), got, wanted):
            check_equal(f"{where} row {list(row)}: {name} vs d/dε ∂L/∂{name[1]}", lhs, rhs)


# --- the enumerated obligations --------------------------------------------------------------
def _every_b(pb: Problem, n_k: int) -> Callable[[], str]:
    def check() -> str:
        specified: dict[tuple, list] = {}  # fresh for each run (a mutant may patch the spec)
        run = every_block_size(
            n_k, lambda b: check_second_order(pb, b, specified=specified), lambda b: tiling(pb, b)
        )
        return run()

    return check


def cross_attention(n: int) -> Obligation:
    pb = Problem(matrix("q", n + 1, 2), matrix("k", n, 2), matrix("v", n, 1), C)
    return Obligation(
        FAMILY,
        "(dQ̇, dK̇, dV̇) = d/dε ∂(Σ G∘Y)/∂(Q, K, V) along (Q̇, K̇, V̇, Ġ), symbolic c",
        f"n_q={n + 1} n_k={n} d=2 v=1 b=1..{n + 1}",
        _every_b(pb, n),
    )


def every_mask(n: int = 2) -> Obligation:
    q, k, v = matrix("q", n, 2), matrix("k", n, 2), matrix("v", n, 1)
    problems: dict[bytes, Problem] = {}

    def run(allowed: np.ndarray, b: int) -> None:
        key = allowed.tobytes()
        if key not in problems:
            problems.clear()
            problems[key] = Problem(q, k, v, C, allowed, symbolic_spec.dense(allowed))
        check_second_order(problems[key], b)

    return Obligation(
        FAMILY,
        f"every nonempty-row mask ({(2**n - 1) ** n} masks), full inputs",
        f"n={n} d=2 v=1 b=1..{n + 1}",
        every_mask_check(n, run, lambda allowed, b: tiling(Problem(q, k, v, C, allowed), b)),
    )


def structured(case: Any, n: int = 3) -> Obligation:
    pb = full_problem(case, n, v=1)
    return Obligation(
        FAMILY,
        f"{case.name}, full inputs",
        f"{case.sizes(n)} d=2 v=1 b=1..{n + 1}",
        _every_b(pb, n),
    )


def torch_statistics(n: int = 3) -> Obligation:
    """The torch path's second-order reverse: frozen ``m = lse``, ``ℓ = 1``, rows split."""
    pb = full_problem(CAUSAL, n, d=1, v=1)
    return Obligation(
        FAMILY,
        "causal, frozen m = lse, ℓ = 1 (torch path), rows split, full inputs",
        f"n={n} d=1 v=1 b=1..{n + 1}",
        row_runs(n, lambda b, rows: check_second_order(pb, b, rows, lse_only=True), (None, 1), pb),
    )


BATCHED_CLAIMS = {
    "grouped": ": dK̇, dV̇ summed over the group",
    "enable_gqa": ", causal bottom-right, whole and split",
    "broadcast": ": second-order outputs summed over it",
}


def symbolic_dropout(n: int = 2) -> Obligation:
    pb = symbolic_dropout_problem(n)
    return Obligation(
        FAMILY,
        "dropout, symbolic replayed ρ_ij: exact second order",
        f"n={n} d=v=2 b=1..{n + 1}",
        _every_b(pb, n),
    )


def library_dropout(n: int = 2) -> Obligation:
    case = BY_NAME["causal ∧ key padding"]
    pb = full_problem(case, n, v=1, dropout_p=0.25, seed=7)
    return Obligation(
        FAMILY,
        "dropout: the library's Dropout at p = 1/4 (causal ∧ key padding)",
        f"{case.sizes(n)} d=2 v=1 seed=7 b=1..{n + 1}",
        _every_b(pb, n),
    )


def softcap(n: int = 2) -> Obligation:
    pb = full_problem(CAUSAL, n, v=1, softcap=CAP)
    return Obligation(
        FAMILY,
        "softcap (symbolic cap): mod″ = −2t(1 − t²)/cap enters",
        f"n={n} causal d=2 v=1 b=1..{n + 1}",
        _every_b(pb, n),
    )


def bias(n: int = 2) -> Obligation:
    q, k, v = matrix("q", n + 1, 2), matrix("k", n, 2), matrix("v", n, 1)
    pb = Problem(q, k, v, C, bias=tensor("B", n + 1, n))
    return Obligation(
        FAMILY,
        "free-symbol bias with its tangent Ḃ: dḂ = γ̇",
        f"n_q={n + 1} n_k={n} d=2 v=1 b=1..{n + 1}",
        _every_b(pb, n),
    )


def softcap_then_bias(n: int = 2) -> Obligation:
    pb = Problem(
        matrix("q", n, 1), matrix("k", n + 1, 1), matrix("v", n + 1, 1), C,
        masks.causal("bottom-right"), symbolic_spec.causal("bottom-right"),
        bias=tensor("B", n, n + 1), softcap=CAP,
    )  # fmt: skip
    return Obligation(
        FAMILY,
        "softcap then bias (with Ḃ), causal bottom-right, n_q = n_k − 1",
        f"n_q={n} n_k={n + 1} d=v=1 b=1..{n + 2}",
        _every_b(pb, n + 1),
    )


# --- for every n: b through tiles(), and the visits of a tile of symbolic width ------------------
B_THROUGH_TILES = "the second-order passes read b only through tiles()"
FIRST_VISIT = "first visit, tile of symbolic width w: the terms of σ, δ̇ and Ẏ; dP, dṖ"
SECOND_VISIT = "second visit, tile of symbolic width w: the terms of d/dε ∂L"
ANY_WIDTH = "any width w, any allowed keys, ρ"
ROW_IDENTITIES = "Ẏ = w − σY and δ̇ = Σ p(ṡ dP + dṖ) − σ Σ p dP: the derivatives of Y, δ"
SCHEDULE = "row_schedule: each tile visited once per pass, the second after its rows complete"
SCHEDULE_SIZES = "every list of ≤ 3 runs in 6 rows; tiles()' runs, n ≤ 6, causal and window"


def schedule_is_sound(rows: list[range]) -> None:
    """The lemma of :func:`hvp.row_schedule` on one list of row runs: the first visits and
    the second visits are each every tile once, and a tile's second visit comes after the
    first visit of every tile sharing a row with it (so its rows' σ, δ̇ are complete)."""
    firsts: list[int] = []
    seconds: list[int] = []
    for step_firsts, step_seconds in hvp.row_schedule(rows):
        firsts += step_firsts
        visited = set(firsts)
        for tile in step_seconds:
            early = [u for u in range(len(rows)) if set(rows[u]) & set(rows[tile])]
            if not set(early) <= visited:
                raise Refuted(Counterexample(
                    f"tile {tile}'s second visit", {"runs": str(rows)}, f"tiles {early}",
                    f"the first-visited {sorted(visited)}", "⊄",
                ))  # fmt: skip
        seconds += step_seconds
    if sorted(firsts) != list(range(len(rows))) or sorted(seconds) != list(range(len(rows))):
        raise Refuted(Counterexample(
            "each tile once per visit", {"runs": str(rows)}, f"first visits {firsts}",
            f"second visits {seconds}", "vs",
        ))  # fmt: skip


def schedule() -> str:
    """:func:`hvp.row_schedule` is sound (:func:`schedule_is_sound`) on every list of up to
    three nonempty runs within six rows (the argument of its docstring holds for any list:
    a tile holding row ``r`` starts at most at ``r``, and the tiles are first-visited by
    their first row) and on the runs of ``tiles()`` for n_q, n_k ≤ 6, every b and
    row_block under a causal mask and a window."""
    runs = [range(a, b) for a in range(6) for b in range(a + 1, 7)]
    lists = [[x] for x in runs]
    lists += [[x, y] for x in runs for y in runs]
    lists += [[x, y, z] for x in runs for y in runs for z in runs]
    ctx = TermContext()
    for n_q in range(1, 7):
        for n_k in range(1, 7):
            geometry = algorithm.geometry_of(*(np.zeros((n, 1)) for n in (n_q, n_k, n_k)))
            for mask in (masks.causal(), masks.causal("bottom-right"), masks.SlidingWindow(2, 0)):
                for b in range(1, n_k + 1):
                    for row_block in range(1, n_q + 1):
                        tiling = algorithm.tiles(ctx, mask, geometry, b, row_block)
                        lists.append([range(x.rows.start, x.rows.stop) for x in tiling])
    for rows in lists:
        schedule_is_sound(rows)
    return f"{len(lists)} lists of runs"


def b_through_tiles() -> str:
    """``hvp.hvp`` reads ``b`` only as ``tiles()``'s argument (in ``every_tile``, which both
    passes iterate), so two block sizes with the same tiling run the same arithmetic."""
    other = block_size_uses(hvp.hvp)
    if other:
        raise Undecided(f"hvp.hvp reads block_size outside tiles(): {other}")
    return "hvp.hvp"


def _sym(name: str, **assumptions: Any) -> sympy.Symbol:
    return sympy.Symbol(name, real=True, **assumptions)


def _arr(x: Any) -> np.ndarray:
    return np.array(x, dtype=object)


class _WidthTile:
    """One query row against a generic key ``j`` of ``0..w−1`` (:mod:`proofs.engine.width`):
    q, q̇ (plain symbols), key j's K, K̇, V, V̇ (entries K(j, r), K(j, r, 1), ...), G, Ġ."""

    def __init__(self, d: int = 2, v: int = 2) -> None:
        self.c = _sym("c", positive=True)
        self.q = _arr([[_sym(f"q{r}") for r in range(d)]])
        self.q_dot = _arr([[_sym(f"qd{r}") for r in range(d)]])
        self.k = _arr([[width.entry("K", r) for r in range(d)]])
        self.k_dot = _arr([[width.entry("K", r, 1) for r in range(d)]])
        self.v = _arr([[width.entry("V", a) for a in range(v)]])
        self.v_dot = _arr([[width.entry("V", a, 1) for a in range(v)]])
        self.g = _arr([[_sym(f"g{a}") for a in range(v)]])
        self.g_dot = _arr([[_sym(f"gd{a}") for a in range(v)]])
        self.rho = _arr([[width.entry("rho")]])
        self.m, self.ell = _sym("m"), _sym("l", positive=True)
        score = self.c * sum(a * b for a, b in zip(self.q[0], self.k[0]))
        self.s_dot = self.c * sum(
            a * b + x * y for a, b, x, y in zip(self.q_dot[0], self.k[0], self.q[0], self.k_dot[0])
        )
        weight = sympy.Piecewise((sympy.exp(score), width.allowed()), (0, True))
        self.big_p = weight / (self.ell * sympy.exp(self.m))  # P_j, the definition's

    def operands(self) -> hvp.TileOperands:
        return hvp.TileOperands(
            self.q, self.q_dot, self.k, self.k_dot, self.v, self.v_dot, self.g, self.g_dot
        )

    def recompute(self, ctx: Any, dropout: bool) -> hvp.Recomputed:
        return hvp.recompute(
            ctx, self.operands(), _arr([[width.allowed()]]), self.c, _arr([self.m]),
            _arr([self.ell]), rho=self.rho if dropout else None,
        )  # fmt: skip


def _products(tile: _WidthTile, x: hvp.TileOperands, rho: Any) -> tuple[Any, Any]:
    """The definition's ``dP_j = ρ_j G·V_j`` and ``dṖ_j = ρ_j(Ġ·V_j + G·V̇_j)``."""
    gv = sum(x.g[0, a] * x.v[0, a] for a in range(2))
    gv_dot = sum(x.g_dot[0, a] * x.v[0, a] + x.g[0, a] * x.v_dot[0, a] for a in range(2))
    return rho * gv, rho * gv_dot


def first_visit_any_width() -> str:
    """The first visit adds ``Σ_j P_j ṡ_j`` to σ_i, ``Σ_j P_j dP_j`` and
    ``Σ_j P_j (ṡ_j dP_j + dṖ_j)`` to the rows' sums for δ̇, and ``Σ_j P_j ρ_j (ṡ_j V_j +
    V̇_j)`` to the sum that gives Ẏ_i, ``P_j = α_j e^{s_j}/(ℓ e^m)`` for the frozen ``m, ℓ``,
    ``dP_j = ρ_j G·V_j``, ``dṖ_j = ρ_j(Ġ·V_j + G·V̇_j)``; and keeps the tile's own dP, dṖ."""
    runs = 0
    for dropout in (False, True):
        tile, ctx = _WidthTile(), width.WidthContext(_sym("M_t"))
        x = tile.operands()
        terms = hvp.first_visit(ctx, x, tile.recompute(ctx, dropout))
        factor = tile.rho[0, 0] if dropout else 1
        dp, dp_dot = _products(tile, x, factor)
        what = f"ρ={dropout}"
        big_p, s_dot = tile.big_p, tile.s_dot
        width.check_equal(f"{what}: σ term vs Σ_j P_j ṡ_j", terms.sigma, [
            width.sum_over_keys(big_p * s_dot)
        ])  # fmt: skip
        width.check_equal(f"{what}: Σ_j P_j dP_j term", terms.p_dp, [
            width.sum_over_keys(big_p * dp)
        ])  # fmt: skip
        width.check_equal(f"{what}: Σ_j P_j (ṡ_j dP_j + dṖ_j) term", terms.p_ds, [
            width.sum_over_keys(big_p * (s_dot * dp + dp_dot))
        ])  # fmt: skip
        want = [
            width.sum_over_keys(big_p * factor * (s_dot * x.v[0, a] + x.v_dot[0, a]))
            for a in range(2)
        ]
        width.check_equal(f"{what}: Ẏ's term vs Σ_j P_j ρ_j (ṡ_j V_j + V̇_j)", terms.w[0], want)
        width.check_equal(f"{what}: the tile's dP", terms.dp[0], [dp])
        width.check_equal(f"{what}: the tile's dṖ", terms.dp_dot[0], [dp_dot])
        runs += 1
    return f"{runs} visits, any w"


def second_visit_any_width() -> str:
    """The second visit, given the tile's dP, dṖ, adds the definition's terms of
    ``d/dε (dQ_i, dK_j, dV_j)``: with ``∂L/∂s_j = P_j(ρ_j G·V_j − δ)``, its derivative
    ``Ṗ_j(ρ_j G·V_j − δ) + P_j(ρ_j(Ġ·V_j + G·V̇_j) − δ̇)``, ``Ṗ_j = P_j(ṡ_j − σ)``, for free row
    totals ``σ, δ, δ̇`` (what the first visits and Lemma F give): ``Σ_j c(d/dε ∂L/∂s_j K_j +
    ∂L/∂s_j K̇_j)`` to dQ̇_i, ``c(d/dε ∂L/∂s_j q_i + ∂L/∂s_j q̇_i)`` to dK̇_j,
    ``ρ_j(Ṗ_j G_i + P_j Ġ_i)`` to dV̇_j."""
    runs = 0
    sigma, delta, delta_dot = _sym("sigma"), _sym("delta"), _sym("delta_dot")
    for dropout in (False, True):
        tile, ctx = _WidthTile(), width.WidthContext(_sym("M_t"))
        x = tile.operands()
        r = tile.recompute(ctx, dropout)
        kept = hvp.first_visit(ctx, x, r, output_tangent=False)
        dq, dk, dv = hvp.second_visit(
            ctx, x, r, kept.dp, kept.dp_dot, _arr([sigma]), _arr([delta]), _arr([delta_dot]),
            tile.c,
        )  # fmt: skip
        rho = tile.rho[0, 0] if dropout else 1
        big_p, c = tile.big_p, tile.c
        dp, dp_dot = _products(tile, x, rho)
        p_dot = big_p * (tile.s_dot - sigma)
        ds = big_p * (dp - delta)
        ds_dot = p_dot * (dp - delta) + big_p * (dp_dot - delta_dot)
        what = f"ρ={dropout}"
        want_dq = [
            width.sum_over_keys(c * (ds_dot * x.k[0, r] + ds * x.k_dot[0, r])) for r in range(2)
        ]
        width.check_equal(f"{what}: dQ̇_i term", dq[0], want_dq)
        want_dk = [c * (ds_dot * x.q[0, r] + ds * x.q_dot[0, r]) for r in range(2)]
        width.check_equal(f"{what}: dK̇_j term", dk[0], want_dk)
        want_dv = [rho * (p_dot * x.g[0, a] + big_p * x.g_dot[0, a]) for a in range(2)]
        width.check_equal(f"{what}: dV̇_j term", dv[0], want_dv)
        runs += 1
    return f"{runs} visits, any w"


def row_identities() -> str:
    """With ``Y_a = Σ_j P_j ρ_j V_ja`` (any number of keys: ``A_a = Σ_j P_j ρ_j ṡ_j V_ja`` and
    ``B_a = Σ_j P_j ρ_j V̇_ja`` lumped, ``σ = Σ_j P_j ṡ_j``): ``output_tangent_of(A + B, σ,
    Y)`` is ``Ẏ = Σ_j ρ_j (Ṗ_j V_j + P_j V̇_j)`` with ``Ṗ_j = P_j(ṡ_j − σ)``, by linearity;
    and ``delta_tangent(σ, Σ_j P_j dP_j, Σ_j P_j(ṡ_j dP_j + dṖ_j))`` is the derivative of
    ``δ = G·Y``, ``Ġ·Y + G·Ẏ``: both are sums over keys, so it is checked key by key (one
    key's terms, ``σ`` a free row total), and holds for any number of keys."""
    ctx = width.WidthContext(_sym("M_t"))
    y = _arr([[_sym(f"Y{a}") for a in range(2)]])
    lumped = _arr([[_sym(f"A{a}") + _sym(f"B{a}") for a in range(2)]])
    sigma = _sym("sigma")
    got = hvp.output_tangent_of(ctx, lumped, _arr([sigma]), y)
    # Σ_j ρ P (ṡ − σ) V + Σ_j ρ P V̇ = A − σ Y + B, since Σ_j ρ P V = Y
    check_equal("Ẏ vs A + B − σ·Y", got, _arr([[lumped[0, a] - sigma * y[0, a] for a in range(2)]]))
    g, g_dot = [_sym("g0"), _sym("g1")], [_sym("gd0"), _sym("gd1")]
    v, v_dot = [_sym("v0"), _sym("v1")], [_sym("vd0"), _sym("vd1")]
    big_p, s_dot, rho = _sym("P", positive=True), _sym("s_dot"), _sym("rho")
    dp = rho * sum(a * b for a, b in zip(g, v))
    dp_dot = rho * sum(a * b + c * d for a, b, c, d in zip(g_dot, v, g, v_dot))
    got = hvp.delta_tangent(
        ctx, _arr([sigma]), _arr([big_p * dp]), _arr([big_p * (s_dot * dp + dp_dot)])
    )
    # one key's terms of Ġ·Y + G·Ẏ: Y's term P ρ V, Ẏ's term ρ (P (ṡ − σ) V + P V̇)
    y_key = [big_p * rho * x for x in v]
    y_dot_key = [rho * (big_p * (s_dot - sigma) * x + big_p * xd) for x, xd in zip(v, v_dot)]
    want = sum(a * b for a, b in zip(g_dot, y_key)) + sum(a * b for a, b in zip(g, y_dot_key))
    check_equal("δ̇'s key term vs that of Ġ·Y + G·Ẏ", got, _arr([want]))
    return "2 identities"


def obligations(max_n: int = 4) -> list[Obligation]:
    out = [cross_attention(n) for n in range(1, max_n + 1)]
    out += [every_mask(2)]
    out += [structured(case) for case in CASES if case.min_n <= 3]
    out += [torch_statistics()]
    out += batched.obligations(FAMILY, check_second_order, BATCHED_CLAIMS, n=2)
    out += [symbolic_dropout(), library_dropout(), softcap(), bias(), softcap_then_bias()]
    out += [
        Obligation(FAMILY, B_THROUGH_TILES, "hvp.hvp (source)", b_through_tiles),
        Obligation(FAMILY, FIRST_VISIT, ANY_WIDTH, first_visit_any_width),
        Obligation(FAMILY, SECOND_VISIT, ANY_WIDTH, second_visit_any_width),
        Obligation(FAMILY, ROW_IDENTITIES, "any number of keys", row_identities),
        Obligation(FAMILY, SCHEDULE, SCHEDULE_SIZES, schedule),
    ]  # fmt: skip
    return out
