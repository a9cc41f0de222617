"""Family `program` — a user's FlexAttention program is computed exactly.

Theorem. For the given ``mask_mod(b, h, q_idx, kv_idx)`` and ``score_mod(score, b, h,
q_idx, kv_idx)``, every ``n ≤ N`` (``n_q = n_k = n``), the batch ``(B, H)`` given and every
key-block size ``b`` in ``1..n+1``, the library's tiled forward and reverse
(``exactattn.attention(..., mask=mask_mod, score_mod=score_mod)`` over the exact backend)
return

    Y_i = Σ_{j∈A_i} e^{s'_ij} V_j / Σ_{j∈A_i} e^{s'_ij},   s'_ij = score_mod(c·q_i·k_j, b, h, i, j),
    A_i = {j : mask_mod(b, h, i, j)}

(``Y_i = 0`` for a row with no allowed key), ``lse_i = log Σ_{j∈A_i} e^{s'_ij}`` and
``(dQ, dK, dV) = ∂(Σ G∘Y)/∂(Q, K, V)``, as identities in the free symbols Q, K, V (d = v = 2)
and the scale ``c``. The specification side evaluates the two mods once on the whole
``(B, H, n, n)`` index grid (:func:`exactattn.core.ops.specification`), never through the tile
iterator, and sympy takes the derivative of the formula. Mods that use operations outside
the zero test's fragment (``exp``, ``tanh``, ``+ − × ÷``) end UNDECIDED, never PROVED.

``exactattn prove --mask-mod module:fn [--score-mod module:fn] --max-n N [--batch B]
[--heads H]`` runs this family alone; ``module:fn`` may also be ``path/to/file.py:fn``.

Theorem (``--all-n``, the mask_mod traced by :mod:`exactattn.proofs.engine.trace`). For every
sequence length n, block size b and row split: the tiles of the traced mask_mod visit exactly its
allowed pairs (its structure is Mask's default — every tile PARTIAL, every row in the span — whose
contracts hold for any predicate, and the iterator's own formulas are the stated loop), so
the general family's lemmas for a tile of any width give the tiled forward and reverse
equal to the definition; and a block structure given as a program (``--block-mod``: a
hand-built BlockMask's kinds as a function of the block, 0 EMPTY, 1 PARTIAL, 2 FULL) is
sound: FULL only where every pair of the block is allowed, EMPTY only where none is, for
every n and every (square) block size — or refuted at the smallest n. The trace is checked
against the program itself on the whole grid at n ≤ N (the program called on one (b, h, i,
j) at a time, as FlexAttention's vmap does, with its own arrays), so a mistrace cannot
pass for a proof.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy

import exactattn
from exactattn.core import masks, ops
from exactattn.infra import loading

from ..engine import symbolic_spec
from ..engine.context import ProofContext
from ..engine.ledger import Obligation, Refuted, Undecided, check_equal
from ..engine.symbols import C, tensor, upstream

FAMILY = "program"
D = V = 2


def load(reference: str, what: str) -> Callable[..., Any]:
    """The callable named by ``module:fn`` or ``path/to/file.py:fn``; ValueError if none
    (:func:`exactattn.infra.loading.load_callable`: modules in the current directory too)."""
    return loading.load_callable(reference, what)


@dataclass(frozen=True)
class Program:
    """A mask_mod and/or a score_mod, and the batch they are proved over."""

    mask_mod: Callable[..., Any] | None
    score_mod: Callable[..., Any] | None
    batch: tuple[int, int] = (1, 1)
    name: str = "program"
    all_n: bool = False  # also the obligations for every length (--all-n)
    assume: tuple[tuple[str, str], ...] = ()  # (array, constraint), e.g. nondecreasing
    block_mod: Callable[..., Any] | None = None  # a block structure's kind per block
    block_name: str = ""

    def inputs(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return tuple(tensor(x, *self.batch, n, D) for x in "qkv")  # type: ignore[return-value]

    def keywords(self, b: int) -> dict[str, Any]:
        return dict(
            scale=C, block_size=b, mask=self.mask_mod, score_mod=self.score_mod,
            empty_rows="zero", backend=ProofContext(),
        )  # fmt: skip

    def specification(self, q, k, v) -> tuple[np.ndarray, np.ndarray]:
        """``(Y, Σ_{j∈A_i} e^{s'_ij})`` from the mods and the formula alone."""
        n_q, n_k = q.shape[-2], k.shape[-2]
        raw = np.einsum("...id,...jd->...ij", q, k) * C
        allowed, modified = ops.specification(
            n_q, n_k, batch=self.batch, mask_mod=self.mask_mod, score_mod=self.score_mod,
            scores=raw,
        )  # fmt: skip
        s = raw if modified is None else modified
        e = np.where(allowed, np.vectorize(sympy.exp, otypes=[object])(s), sympy.S.Zero)
        total = e.sum(axis=-1)
        y = np.empty((*self.batch, n_q, v.shape[-1]), dtype=object)
        for index in np.ndindex(*self.batch, n_q):
            row = e[index] @ v[index[:-1]]
            y[index] = row / total[index] if total[index] != 0 else row * 0
        return y, total


def _forward(program: Program, n: int) -> Callable[[], str]:
    def check() -> str:
        q, k, v = program.inputs(n)
        want_y, want_total = program.specification(q, k, v)
        empty = np.vectorize(lambda t: t == 0, otypes=[bool])(want_total)
        for b in range(1, n + 2):
            y, stats = exactattn.attention(q, k, v, return_stats=True, **program.keywords(b))
            check_equal(f"b={b}: tiled Y vs the program's Y", y, want_y)
            lse = np.asarray(stats.lse, dtype=object)
            if not all(x == -sympy.oo for x in lse[empty]):
                check_equal(f"b={b}: lse of a row with no allowed key", lse[empty], -sympy.oo)
            e_lse = np.vectorize(sympy.exp, otypes=[object])(lse[~empty])
            check_equal(f"b={b}: e^lse vs Σ_{{j∈A_i}} e^s'", e_lse, want_total[~empty])
        return f"{n + 1} block sizes"

    return check


def _reverse(program: Program, n: int) -> Callable[[], str]:
    def check() -> str:
        q, k, v = program.inputs(n)
        want_y, _ = program.specification(q, k, v)
        shape = (*program.batch, n, V)
        runs, wanted = 0, {}  # the definition's gradients, once per row for every b
        for b in range(1, n + 2):
            kw = program.keywords(b)
            y, stats = exactattn.attention(q, k, v, return_stats=True, **kw)
            for row in np.ndindex(*shape[:-1]):
                g = upstream(shape, row)
                if row not in wanted:
                    wanted[row] = [
                        symbolic_spec.row_gradient(g[row], want_y[row], x) for x in (q, k, v)
                    ]
                got = exactattn.attention_backward(q, k, v, y, stats, g, **kw)
                for name, lhs, rhs in zip(("dQ", "dK", "dV"), got, wanted[row]):
                    where = f"b={b} row {list(row)}: tiled {name} vs ∂L/∂{name[1]}"
                    check_equal(where, lhs, rhs)
                runs += 1
        return f"{runs} (block size, row) pairs"

    return check


def obligations_for(program: Program, max_n: int) -> list[Obligation]:
    sizes = "B={} H={} n={} d=v={} b=1..n+1"
    out = all_n_obligations(program, max_n) if program.all_n else []
    for n in range(1, max_n + 1):
        size = sizes.format(*program.batch, n, D)
        out.append(Obligation(FAMILY, f"forward: {program.name}", size, _forward(program, n)))
        out.append(Obligation(FAMILY, f"reverse: {program.name}", size, _reverse(program, n)))
    return out


# --- for every length (--all-n) --------------------------------------------------------------
BLOCK_KINDS = {"EMPTY": 0, "PARTIAL": 1, "FULL": 2}


def _trace_is_the_program(program: Program, n_max: int) -> Callable[[], str]:
    def check() -> str:
        from ..engine import trace as tracing
        from ..engine.counterexamples import Counterexample

        z3 = tracing.load()
        found = tracing.trace(program.mask_mod, dict(program.assume))
        lengths = [np.shape(a.values)[-1] for a in found.arrays.values()]
        top = min([n_max, *lengths])
        checked = 0
        table = _array_values(found)
        for n in range(1, top + 1):
            for index in np.ndindex(*program.batch, n, n):
                allowed = bool(program.mask_mod(*index))  # one pair, as FlexAttention's vmap
                pairs = [(t, z3.IntVal(int(x))) for t, x in zip(found.indices, index)]
                value = z3.simplify(z3.substitute(z3.substitute(found.allowed, *pairs), *table))
                if not z3.is_true(value) and not z3.is_false(value):
                    raise Undecided(f"the trace did not evaluate at {index}: {value}")
                if z3.is_true(value) != allowed:
                    point = dict(zip(("b", "h", "i", "j"), map(str, index)), n=str(n))
                    raise Refuted(Counterexample(
                        "the traced mask_mod vs the program", point, str(z3.is_true(value)),
                        str(allowed), "≠",
                    ))  # fmt: skip
                checked += 1
        return f"{checked} pairs, n ≤ {top}"

    return check


def _array_values(found: Any) -> list[tuple[Any, Any]]:
    """Each traced array's entries as z3 substitutions ``name(index) → value``."""
    z3 = load_z3()
    out = []
    for array in found.arrays.values():
        values = np.asarray(array.values.cpu() if hasattr(array.values, "cpu") else array.values)
        fn = z3.Function(array.name, *([z3.IntSort()] * (array.ndim + 1)))
        for index in np.ndindex(values.shape):
            out.append((fn(*map(z3.IntVal, map(int, index))), z3.IntVal(int(values[index]))))
    return out or [(z3.IntVal(0), z3.IntVal(0))]


def load_z3() -> Any:
    from ..engine.solver import load as load_solver

    return load_solver()


def _structure_is_the_default(program: Program) -> Callable[[], str]:
    def check() -> str:
        mask = masks.as_mask(program.mask_mod)
        kind = type(mask)
        if kind.classify is not masks.Mask.classify or kind.row_span is not masks.Mask.row_span:
            raise Undecided(f"{kind.__name__} overrides classify/row_span: not the default")
        return f"{kind.__name__}: classify = PARTIAL, row_span = every row (Mask's own)"

    return check


def _block_mod_is_sound(program: Program) -> Callable[[], str]:
    def check() -> str:
        from ..engine import trace as tracing
        from ..engine.counterexamples import Counterexample
        from ..engine.solver import prove

        z3 = tracing.load()
        found = tracing.trace(program.mask_mod, dict(program.assume))
        b, h, i, j = found.indices
        qb, kb = z3.Ints("q_block kv_block")
        kind = _kind_term(program.block_mod, (b, h, qb, kb))
        n, size = z3.Ints("n BLOCK_SIZE")  # square blocks, as create_block_mask's default
        grid = [n >= 1, size >= 1, b >= 0, h >= 0, qb >= 0, kb >= 0]
        grid += [i >= qb * size, i < (qb + 1) * size, i < n, j >= kb * size]
        grid += [j < (kb + 1) * size, j < n]
        facts = found.facts()
        for name, claim in (("FULL", found.allowed), ("EMPTY", z3.Not(found.allowed))):
            what = f"a block the structure calls {name}"
            hypotheses = [*grid, *facts, kind == BLOCK_KINDS[name]]
            try:
                prove(f"{what}: {'every' if name == 'FULL' else 'no'} pair allowed", claim,
                      hypotheses, {"kind": kind})  # fmt: skip
            except Refuted:
                smallest = _smallest(z3, [*hypotheses, z3.Not(claim)], n)
                raise Refuted(Counterexample(
                    f"{what} (the smallest length)", smallest, name,
                    "allowed" if name == "EMPTY" else "masked", "but (i, j) is",
                )) from None  # fmt: skip
        return "FULL ⇒ allowed, EMPTY ⇒ masked"

    return check


def _kind_term(block_mod: Callable, indices: tuple[Any, ...]) -> Any:
    """``block_mod(b, h, q_block, kv_block)`` traced: 0 EMPTY, 1 PARTIAL, 2 FULL."""
    from ..engine import trace as tracing

    z3 = tracing.load()
    out = block_mod(*(tracing.Traced(t) for t in indices))
    if isinstance(out, int):
        return z3.IntVal(out)
    if not isinstance(out, tracing.Traced) or out._is_bool():
        raise tracing.Untraceable(f"the block mod returned {type(out).__name__}, not a kind")
    return out.term


def _smallest(z3: Any, constraints: list[Any], n: Any) -> dict[str, Any]:
    """A model of ``constraints`` with the least ``n`` (z3's optimizer)."""
    opt = z3.Optimize()
    opt.add(*constraints)
    opt.minimize(n)
    if opt.check() != z3.sat:
        raise Undecided("the refutation's model could not be minimised")
    model = opt.model()
    point = {str(d): str(model[d]) for d in model.decls() if d.arity() == 0}
    first = ("n", "BLOCK_SIZE", "q_block", "kv_block", "i", "j")
    return {k: point[k] for k in (*first, *sorted(point)) if k in point}


def all_n_obligations(program: Program, max_n: int) -> list[Obligation]:
    from . import blockmask, general, smt

    if program.mask_mod is None:
        return []
    name = program.name
    out = [
        Obligation(FAMILY, f"all n: the traced mask_mod is the program: {name}",
                   f"B={program.batch[0]} H={program.batch[1]} n ≤ {max_n}",
                   _untraceable_is_undecided(_trace_is_the_program(program, max_n))),
        Obligation(FAMILY, "all n: its structure is the default (contracts hold)",
                   "any predicate", _structure_is_the_default(program)),
    ]  # fmt: skip
    if program.block_mod is not None:
        out.append(Obligation(
            FAMILY, f"all n: the block structure is sound: {program.block_name}",
            "all n, square block sizes, blocks",
            _untraceable_is_undecided(_block_mod_is_sound(program)),
        ))  # fmt: skip
    iterator = {smt.LOOP[0], smt.LOOP[1], smt.LOOP[3], smt.LOOP[4], *blockmask.NAMES}
    out += [ob for ob in smt.obligations() if ob.name in iterator]
    out += general.obligations()
    return out


def _untraceable_is_undecided(check: Callable[[], str]) -> Callable[[], str]:
    def run() -> str:
        from ..engine import trace as tracing

        try:
            return check()
        except tracing.Untraceable as error:
            raise Undecided(f"not traced for all n: {error}") from None

    return run


# --- the example the mutants judge the all-n obligations by ---------------------------------
def example_causal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    """FlexAttention's causal mask_mod."""
    return q_idx >= kv_idx


def example_causal_blocks(b: Any, h: Any, q_block: Any, kv_block: Any) -> Any:
    """create_block_mask's structure of it (square blocks): FULL below the diagonal,
    PARTIAL on it, EMPTY above."""
    from ..engine.trace import where

    full, partial, empty = BLOCK_KINDS["FULL"], BLOCK_KINDS["PARTIAL"], BLOCK_KINDS["EMPTY"]
    return where(kv_block < q_block, full, where(kv_block == q_block, partial, empty))


def example_obligations() -> list[Obligation]:
    """The all-n obligations of :func:`example_causal` with :func:`example_causal_blocks`
    (the mod and the structure looked up at call time, so a mutant can replace them)."""
    import sys

    module = sys.modules[__name__]
    example = Program(
        lambda b, h, i, j: module.example_causal(b, h, i, j), None, all_n=True,
        name="causal (example)", block_name="causal blocks",
        block_mod=lambda b, h, q, k: module.example_causal_blocks(b, h, q, k),
    )  # fmt: skip
    return [ob for ob in all_n_obligations(example, 3) if ob.family == FAMILY]
