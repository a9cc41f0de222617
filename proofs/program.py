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
``(B, H, n, n)`` index grid (:func:`exactattn.ops.specification`), never through the tile
iterator, and sympy takes the derivative of the formula. Mods that use operations outside
the zero test's fragment (``exp``, ``tanh``, ``+ − × ÷``) end UNDECIDED, never PROVED.

``exactattn prove --mask-mod module:fn [--score-mod module:fn] --max-n N [--batch B]
[--heads H]`` runs this family alone; ``module:fn`` may also be ``path/to/file.py:fn``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy

import exactattn
from exactattn import loading, ops

from . import spec
from .context import ProofContext
from .engine import Obligation, check_equal
from .inputs import C, tensor, upstream

FAMILY = "program"
D = V = 2


def load(reference: str, what: str) -> Callable[..., Any]:
    """The callable named by ``module:fn`` or ``path/to/file.py:fn``; ValueError if none
    (:func:`exactattn.loading.load_callable`: modules in the current directory too)."""
    return loading.load_callable(reference, what)


@dataclass(frozen=True)
class Program:
    """A mask_mod and/or a score_mod, and the batch they are proved over."""

    mask_mod: Callable[..., Any] | None
    score_mod: Callable[..., Any] | None
    batch: tuple[int, int] = (1, 1)
    name: str = "program"

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
        runs = 0
        for b in range(1, n + 2):
            kw = program.keywords(b)
            y, stats = exactattn.attention(q, k, v, return_stats=True, **kw)
            for row in np.ndindex(*shape[:-1]):
                g = upstream(shape, row)
                loss = sympy.Add(*(g[row] * want_y[row]))
                got = exactattn.attention_backward(q, k, v, y, stats, g, **kw)
                for name, lhs, x in zip(("dQ", "dK", "dV"), got, (q, k, v)):
                    where = f"b={b} row {list(row)}: tiled {name} vs ∂L/∂{name[1]}"
                    check_equal(where, lhs, spec.gradient(loss, x))
                runs += 1
        return f"{runs} (block size, row) pairs"

    return check


def obligations_for(program: Program, max_n: int) -> list[Obligation]:
    sizes = "B={} H={} n={} d=v={} b=1..n+1"
    out = []
    for n in range(1, max_n + 1):
        size = sizes.format(*program.batch, n, D)
        out.append(Obligation(FAMILY, f"forward: {program.name}", size, _forward(program, n)))
        out.append(Obligation(FAMILY, f"reverse: {program.name}", size, _reverse(program, n)))
    return out
