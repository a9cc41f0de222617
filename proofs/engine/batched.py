"""Leading dims that change what runs, shared by the forward and reverse families.

Three problems over (batch, head) axes, causal bottom-right, d = v = 1, as the generic code
and the torch path run them: grouped-query heads (q (H_kv=2, g=2, n, 1) against k, v
(2, 1, n, 1)), ``enable_gqa`` (q (B=1, H=4, n, 1) against k, v (1, H_kv=2, n, 1), with the
library's dropout at p = 1/2 on the logical heads, flat index b·H + h) and batch
broadcasting (q (2, 1, n, 1) against k, v (1, 2, n, 1)). :func:`row_runs` runs a check for
every block size and each of a set of row splits (``row_block``; None is whole rows).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from exactattn.core import masks

from . import symbolic_spec
from .checks import Problem
from .checks import tiling as tiling_of
from .coverage_matrix import Coverage
from .ledger import Obligation
from .symbols import C, distinct, tensor

WHOLE_AND_SPLIT = (None, 2)


def _causal_problem(q: tuple[int, int], kv: tuple[int, int], n: int, **keywords) -> Problem:
    return Problem(
        tensor("q", *q, n, 1), tensor("k", *kv, n, 1), tensor("v", *kv, n, 1), C,
        masks.causal("bottom-right"), symbolic_spec.causal("bottom-right"), **keywords,
    )  # fmt: skip


def grouped(n: int) -> Problem:
    return _causal_problem((2, 2), (2, 1), n)


def enable_gqa(n: int) -> Problem:
    return _causal_problem((1, 4), (1, 2), n, dropout_p=0.5, seed=3, enable_gqa=True)


def broadcast(n: int) -> Problem:
    return _causal_problem((2, 1), (1, 2), n)


@dataclass(frozen=True)
class Batched:
    """One of the problems, named as its obligations are: ``what`` + the family's claim."""

    name: str
    problem: Callable[[int], Problem]
    what: str
    batch: str  # the coverage matrix's column: "GQA" or "batch"
    dropout: bool = False

    def sizes(self, n: int) -> str:
        return f"n={n} d=v=1{' p=1/2' if self.dropout else ''} b=1..{n + 1}"

    def coverage(self, direction: str, n: int) -> tuple[Coverage, ...]:
        """The whole-rows run (with dropout when it has it) and the split-rows run."""
        at = dict(mask="causal", alignment="bottom-right", n=n, batch=self.batch)
        return (
            Coverage(direction, dropout=self.dropout, **at),
            Coverage(direction, row_block=True, **at),
        )


BATCHED = (
    Batched("grouped", grouped, "grouped-query heads (H_kv=2, g=2)", "GQA"),
    Batched("enable_gqa", enable_gqa, "enable_gqa (H=4 over H_kv=2) with dropout", "GQA", True),
    Batched("broadcast", broadcast, "batch broadcasting q (2,1,·) × k, v (1,2,·)", "batch"),
)


def obligations(
    family: str,
    check: Callable[[Problem, int, int | None], None],
    claims: Mapping[str, str],
    n: int = 3,
) -> list[Obligation]:
    """One obligation per :data:`BATCHED` problem: ``check(problem, b, row_block)`` for every
    b, whole and split rows; ``claims[name]`` ends its description."""
    out = []
    for item in BATCHED:
        pb = item.problem(n)
        out.append(
            Obligation(
                family,
                item.what + claims[item.name],
                item.sizes(n),
                row_runs(n, lambda b, rows, pb=pb: check(pb, b, rows), problem=pb),
                coverage=item.coverage(family, n),
            )
        )
    return out


def row_runs(
    n_k: int,
    run: Callable[[int, int | None], None],
    row_blocks: Iterable[int | None] = WHOLE_AND_SPLIT,
    problem: Problem | None = None,
) -> Callable[[], str]:
    """A check that runs ``run(b, row_block)`` for each row split and every b = 1..n_k+1
    (given the ``problem``: one b per distinct tiling of each split)."""
    splits = tuple(row_blocks)

    def check() -> str:
        count = 0
        for row_block in splits:
            tiling = None if problem is None else (lambda b, r=row_block: tiling_of(problem, b, r))
            for b in distinct(range(1, n_k + 2), tiling):
                run(b, row_block)
                count += 1
        return f"{len(splits) * (n_k + 1)} (b, split)s, {count} distinct tilings"

    return check
