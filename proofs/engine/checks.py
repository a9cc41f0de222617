"""Run the library on one symbolic problem and compare with the specification.

A :class:`Problem` holds both sides: what the library is given (inputs, its mask object,
``dropout_p`` and ``seed``, a bias array and a soft-cap) and what the specification uses (the
same inputs, bias and cap, the allowed set written as inequalities, the dropout factors
from their definition). The library runs
through the public API (``exactattn.attention`` / ``attention_backward``) when it can, and
through ``algorithm.forward`` / ``backward`` when the obligation needs a parameter the API
does not take (``row_block``, the torch path's frozen statistics, symbolic ρ), always over
:class:`~proofs.terms.TermContext` (the proof context with light exact terms as entries).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy

import exactattn
from exactattn.backends import NumpyContext
from exactattn.core import algorithm, masks, scores
from exactattn.core.dropout import make_dropout

from . import deciders, dual, symbolic_spec
from .ledger import Undecided, check_equal
from .symbols import C, SymbolicDropout, upstream
from .terms import TermContext


@dataclass
class Problem:
    """One attention problem, as the library sees it and as the specification defines it."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    c: Any = C
    mask: Any = None  # what the library is given
    allowed: symbolic_spec.Allowed | None = None  # the definition of A_i (None: every key)
    dropout_p: float = 0.0
    seed: int | None = None
    symbolic_rho: SymbolicDropout | None = None
    empty_rows: str = "error"
    enable_gqa: bool = False  # axis −3 of q holds H = g·H_kv heads; head h reads h // g
    bias: np.ndarray | None = None  # B_ij, broadcastable to (*batch, n_q, n_k): an input
    softcap: Any = None  # cap in cap·tanh(s/cap)
    _spec_grads: dict = field(default_factory=dict, repr=False)
    _spec: dict = field(default_factory=dict, repr=False)  # Y and e^lse, for every b

    @property
    def batch(self) -> tuple[int, ...]:
        shapes = (x.shape[:-2] for x in self.spec_inputs)
        return tuple(np.broadcast_shapes(*shapes))

    @property
    def spec_inputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Q, K, V as the definition reads them: with GQA, key/value head ``h // g`` repeated."""
        if not self.enable_gqa:
            return self.inputs
        group = self.q.shape[-3] // self.k.shape[-3]
        return self.q, np.repeat(self.k, group, axis=-3), np.repeat(self.v, group, axis=-3)

    @property
    def n_q(self) -> int:
        return self.q.shape[-2]

    @property
    def n_k(self) -> int:
        return self.k.shape[-2]

    def allowed_grid(self) -> np.ndarray | None:
        if self.allowed is None:
            return None
        return self.allowed.grid(self.batch, self.n_q, self.n_k)

    def rho_grid(self) -> Any:
        if self.symbolic_rho is not None:
            return np.broadcast_to(self.symbolic_rho.rho, (*self.batch, self.n_q, self.n_k))
        if self.dropout_p:
            return symbolic_spec.dropout_factors(
                self.dropout_p, self.seed, self.batch, self.n_q, self.n_k
            )
        return None

    def spec_output(self) -> np.ndarray:
        """The definition's Y (computed once per problem: it does not depend on b)."""
        if "y" not in self._spec:
            c, cap = self.c, self.softcap
            self._spec["y"] = symbolic_spec.batched(
                lambda q, k, v, a, r, bias: symbolic_spec.naive_output(q, k, v, c, a, r, bias, cap),
                self.batch, *self.spec_inputs, self.allowed_grid(), self.rho_grid(), self.bias,
            )  # fmt: skip
        return self._spec["y"]

    def spec_exp_lse(self) -> np.ndarray:
        """The definition's e^lse (computed once per problem)."""
        if "e^lse" not in self._spec:
            c, cap = self.c, self.softcap
            self._spec["e^lse"] = symbolic_spec.batched(
                lambda q, k, a, bias: symbolic_spec.naive_exp_lse(q, k, c, a, bias, cap),
                self.batch, *self.spec_inputs[:2], self.allowed_grid(), self.bias,
            )  # fmt: skip
        return self._spec["e^lse"]

    def spec_gradients(self, row: tuple[int, ...], g: np.ndarray) -> list[np.ndarray | None]:
        """``∂(G_row·Y_row)/∂X`` for X = Q, K, V (None where X is not all symbols) and, with
        a bias, ``∂/∂B`` (0 at its constant entries)."""
        hit = self._spec_grads.get(row)
        if hit is None:
            y = _spec_row(self, row)
            grad = [
                symbolic_spec.row_gradient(g[row], y, x) if _all_symbols(x) else None
                for x in self.inputs
            ]
            if self.bias is not None:
                grad.append(symbolic_spec.row_gradient(g[row], y, self.bias))
            checked = _check_rules(row, g[row], y, self.inputs, self.bias, grad)
            hit = self._spec_grads[row] = grad
            self._spec_grads[row, "checked"] = checked
        deciders.add(self._spec_grads[row, "checked"])  # as decided when computed
        return hit

    @property
    def inputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.q, self.k, self.v

    def keywords(self, b: int) -> dict[str, Any]:
        return dict(
            scale=self.c, block_size=b, mask=self.mask, dropout_p=self.dropout_p,
            seed=self.seed, empty_rows=self.empty_rows, enable_gqa=self.enable_gqa,
            bias=self.bias, softcap=self.softcap,
        )  # fmt: skip

    def score_mod(self, ctx: Any) -> scores.ScoreMod | None:
        """The score modifications as the public API builds them: soft-cap, then bias."""
        return scores.chain(
            None if self.softcap is None else scores.softcap(self.softcap),
            None if self.bias is None else scores.bias(self.bias).adopt(ctx),
        )


def _spec_row(pb: Problem, row: tuple[int, ...]) -> np.ndarray:
    """The specification's ``Y`` at one query row (index ``(*batch, i)``) alone."""
    *lead, i = row
    allowed, rho = pb.allowed_grid(), pb.rho_grid()
    args = [symbolic_spec.at_batch(x, tuple(lead), len(pb.batch)) for x in pb.spec_inputs]
    a = None if allowed is None else allowed[tuple(lead)][i : i + 1]
    r = None if rho is None else rho[tuple(lead)][i : i + 1]
    bias = None
    if pb.bias is not None:
        bias = symbolic_spec.at_batch(pb.bias, tuple(lead), len(pb.batch))
        bias = bias[i : i + 1] if bias.shape[0] != 1 else bias
    q = args[0][i : i + 1]
    return symbolic_spec.naive_output(q, args[1], args[2], pb.c, a, r, bias, pb.softcap)[0]


def _check_rules(row, weights, y, inputs, bias, grads) -> tuple[tuple[str, int], ...]:
    """The rules' gradients of ``Σ_a g_a Y_a`` decided again by dual numbers
    (:func:`.dual.check_gradient`) once per row; what was decided, as a record."""
    wrt: dict[sympy.Symbol, Any] = {}  # each distinct symbol once, with its gradient
    arrays = [*inputs, *([] if bias is None else [bias])]
    for x, grad in zip((a for a in arrays), (gr for gr in grads)):
        if grad is None:
            continue
        for index in np.ndindex(x.shape):
            if isinstance(x[index], sympy.Symbol):
                wrt.setdefault(x[index], grad[index])
    with deciders.collecting() as tally:
        dual.check_gradient(f"row {list(row)}: ∂(G·Y)/∂(Q, K, V, B) by the rules",
                            list(weights), list(y), list(wrt), list(wrt.values()))  # fmt: skip
    return tuple(tally.items())


def _all_symbols(x: np.ndarray) -> bool:
    return all(isinstance(e, sympy.Symbol) for e in x.flat)


# --- the library's side --------------------------------------------------------------------
@dataclass
class Run:
    """What the library's forward returned (compute type, over TermContext)."""

    y: np.ndarray
    m: np.ndarray
    l: np.ndarray
    lse: np.ndarray
    stats: Any


def _direct(pb: Problem, row_block: int | None) -> bool:
    return row_block is not None or pb.symbolic_rho is not None


def _dropout(pb: Problem) -> Any:
    return pb.symbolic_rho if pb.symbolic_rho is not None else make_dropout(pb.dropout_p, pb.seed)


def library_forward(pb: Problem, b: int, row_block: int | None = None) -> Run:
    ctx = TermContext()
    if not _direct(pb, row_block):
        y, stats = exactattn.attention(
            pb.q, pb.k, pb.v, backend=ctx, return_stats=True, **pb.keywords(b)
        )
        return Run(y, stats.m, stats.l, stats.lse, stats)
    q, k, v = (ctx.asarray(x) for x in pb.inputs)
    mask = masks.as_mask(pb.mask)
    y, state = algorithm.forward(
        ctx, q, k, v, scale=ctx.scalar(pb.c), block_size=b, mask=mask,
        dropout=_dropout(pb), row_block=row_block, enable_gqa=pb.enable_gqa,
        score_mod=pb.score_mod(ctx),
    )  # fmt: skip
    return Run(y, state.m, state.l, algorithm.log_sum_exp(ctx, state.m, state.l), None)


def library_backward(
    pb: Problem,
    b: int,
    run: Run,
    g: np.ndarray,
    row_block: int | None = None,
    lse_only: bool = False,
) -> tuple[np.ndarray, ...]:
    """``(dQ, dK, dV)`` and, with a bias, ``dB``; ``lse_only`` freezes ``m = lse, ℓ = 1``
    as the torch path does."""
    ctx = TermContext()
    if not (_direct(pb, row_block) or lse_only):
        return exactattn.attention_backward(
            pb.q, pb.k, pb.v, run.y, run.stats, g, backend=ctx, bias_grad=pb.bias is not None,
            **pb.keywords(b),
        )  # fmt: skip
    q, k, v = (ctx.asarray(x) for x in pb.inputs)
    m, l = run.m, run.l
    if lse_only:
        m, l = run.lse, np.full(run.lse.shape, sympy.S.One, dtype=object)
    grads = {} if pb.bias is None else {"bias": ctx.zeros(pb.bias.shape)}
    out = algorithm.backward(
        ctx, q, k, v, run.y, m, l, ctx.asarray(g), scale=ctx.scalar(pb.c), block_size=b,
        mask=masks.as_mask(pb.mask), dropout=_dropout(pb), row_block=row_block,
        enable_gqa=pb.enable_gqa, score_mod=pb.score_mod(ctx), mod_grads=grads,
    )  # fmt: skip
    return (*out, *grads.values())


def tiling(pb: Problem, b: int, row_block: int | None = None) -> tuple:
    """What ``tiles()`` yields for ``b``: each tile's rows, keys and kind, in the forward's
    order (``edge_first``) and the reverse's. Two block sizes with the same tiling run the
    same arithmetic, since the forward and the reverse read ``b`` only through ``tiles()``
    (the general family's obligation :data:`general.B_THROUGH_TILES`); an allowed tile is
    a function of its rows and keys."""
    ctx = NumpyContext()
    geometry = algorithm.geometry_of(*pb.inputs, pb.enable_gqa)
    mask = masks.as_mask(pb.mask)
    mask = None if mask is None else mask.adopt(ctx)
    return tuple(
        tuple(
            (t.rows.start, t.rows.stop, t.cols.start, t.cols.stop, t.allowed is None)
            for t in algorithm.tiles(ctx, mask, geometry, b, row_block, edge_first=edge)
        )
        for edge in (True, False)
    )


# --- comparisons ---------------------------------------------------------------------------
def _exp(x: Any) -> np.ndarray:
    """``e^x`` entrywise, built as the proof context builds it (:func:`proofs.terms.exp`:
    exact at numbers, ``e^{log u} = u``, otherwise unevaluated): the zero test reads
    ``e^{m + log ℓ}`` as ``e^m·ℓ`` itself, without sympy's rewriting of the sum."""
    return TermContext().exp(np.asarray(x, dtype=object))


def check_forward(pb: Problem, b: int, row_block: int | None = None) -> Run:
    """The library's Y and lse against the specification (every batch position, every row)."""
    run = library_forward(pb, b, row_block)
    where = f"b={b}" + ("" if row_block is None else f" row_block={row_block}") + ": "
    check_equal(where + "tiled Y vs naive Y", run.y, pb.spec_output())
    total = pb.spec_exp_lse()
    empty = np.vectorize(lambda t: t == 0, otypes=[bool])(total)
    lse = np.asarray(run.lse, dtype=object)
    if any(lse[index] != sympy.S.NegativeInfinity for index in zip(*np.nonzero(empty))):
        raise Undecided(f"{where}lse of a row with no allowed key is not −∞: {lse[empty]}")
    check_equal(where + "e^lse vs Σ_{j∈A_i} e^s", _exp(lse[~empty]), total[~empty])
    return run


def check_reverse(
    pb: Problem, b: int, row_block: int | None = None, lse_only: bool = False
) -> None:
    """For every query row of G: the library's (dQ, dK, dV[, dB]) against ∂(G·Y)/∂(Q, K, V[, B])."""
    run = library_forward(pb, b, row_block)
    shape = (*pb.batch, pb.n_q, pb.v.shape[-1])
    where = f"b={b}" + ("" if row_block is None else f" row_block={row_block}")
    where += " (m = lse, ℓ = 1)" if lse_only else ""
    for row in np.ndindex(*shape[:-1]):
        g = upstream(shape, row)
        tiled = library_backward(pb, b, run, g, row_block, lse_only)
        wanted = pb.spec_gradients(row, g)
        if len(tiled) != len(wanted):
            raise Undecided(f"{where}: {len(tiled)} gradients returned, {len(wanted)} specified")
        for name, lhs, rhs in zip(("dQ", "dK", "dV", "dB"), tiled, wanted):
            if rhs is not None:  # Q = I at score level: dQ is covered by the full runs
                check_equal(f"{where} row {list(row)}: tiled {name} vs ∂L/∂{name[1]}", lhs, rhs)
