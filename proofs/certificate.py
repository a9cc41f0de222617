"""The markdown certificate of ``exactattn prove --report``: readable without the code.

Sections: the command and versions; the method (what the code runs on, the zero test, what
a verdict means); the theorems (each family's docstring); the coverage matrix (mask kind
[+ score modification] × alignment against n_q ≠ n_k, batch, GQA, row_block, dropout,
empty rows, forward and reverse, and what holds for all n); the mutation table (each
mutant, killed by the proofs? by the tests?); every obligation's verdict; the
counterexamples and open items.
"""

from __future__ import annotations

import platform
import re
import textwrap
from collections.abc import Callable

import numpy as np
import sympy

from . import agreement, chain
from .engine import coverage_matrix, zero_test
from .engine.ledger import PROVED, SKIPPED, Outcome, summary
from .families import smt
from .mutation import Tested

METHOD = """\
Every obligation runs the library's own tiled code (`exactattn.core.algorithm`, through the
public API where it can) over the exact sympy backend — with an uninterpreted max and
binary floats read as the rationals they are (`proofs/engine/context.py`) — with symbols as
inputs, and compares what the code returned with the specification
(`proofs/engine/symbolic_spec.py`: softmax attention as a formula, allowed sets as inequalities,
dropout factors r/(1 − p) with the keep-bits specified independently, soft-cap and bias as the
formula cap·tanh(s/cap) + B), or with its derivative by the rules of calculus. The
specification never calls the code under test. The tile iterator's structure is proved for
all sizes with SMT solvers (z3 and cvc5), running the masks' own integer formulas on symbols
(`proofs/families/smt.py`)."""

VERDICTS = """\
A REFUTED verdict carries a concrete point (rational inputs) at which the two sides
evaluate, in 30-digit mpmath arithmetic, to different numbers (or, for the tile iterator
and dropout families, the configuration that breaks the claim; for the smt family, the
solver's model: integer values for which the claim is false). FAILED means the code
raised (the exception is recorded); UNDECIDED means not proved and no counterexample
found; UNKNOWN means the SMT solver answered `unknown` or ran out of time; DISAGREED means
two deciders of one comparison answered differently (both answers are recorded). All five are
failures, and so are TIMEOUT (no verdict within the run's
`--timeout`) and LOST (the process checking it died; the reason is recorded): a mutant
with either was not judged, so it does not count as killed. SKIPPED means an optional
package the check needs (z3) is not installed: not a failure, and nothing is claimed for
it. Mutants are deliberately
broken variants of one step, mask method, score modification or dropout piece, substituted
into the same code path; each must be killed."""


def _all_n(outcomes: list[Outcome]) -> Callable[[str], str]:
    """What holds for all n, per matrix row: the arithmetic (``general``: lemmas and the
    induction; Lemma S for score modification) and the tile iterator (``smt``), else the
    sizes the ``tiles`` family enumerated."""
    status = {(o.obligation.family, o.obligation.name): o.status for o in outcomes}

    def verdict(family: str, names: tuple[str, ...]) -> str | None:
        got = [status.get((family, name)) for name in names]
        if None in got or SKIPPED in got:
            return None  # not (all) run
        return "✓" if all(s == PROVED for s in got) else "✗"

    lemmas = [o for o in outcomes if o.obligation.family == "general"]
    arithmetic = "✗" if any(not o.ok for o in lemmas) else "✓" if lemmas else None
    score_lemma = verdict(
        "general", tuple(o.obligation.name for o in lemmas if "Lemma S" in o.obligation.name)
    )
    enumerated = {}
    for o in outcomes:
        if o.obligation.family == "tiles" and o.status == PROVED:
            bound = re.search(r"≤ (\d+)", o.obligation.sizes)
            which = "composite" if "∧" in o.obligation.name else "single"
            enumerated[which] = f"n_q, n_k ≤ {bound.group(1)}" if bound else o.obligation.sizes

    def cell(row: str) -> str:
        kind, _, score = row.partition(" + ")
        parts = [f"arithmetic {arithmetic}" if arithmetic else "arithmetic not checked"]
        if score:
            parts.append(f"{score} (Lemma S) {score_lemma or 'not checked'}")
        smt_verdict = verdict("smt", smt.FOR_ALL_N.get(kind, ()))
        which = "composite" if kind in ("and", "or") else "single"
        if smt_verdict == "✓":
            parts.append("iterator ✓ (smt: tiles()'s formulas are the stated loop)")
        elif smt_verdict == "✗":
            parts.append("iterator ✗ (smt)")
        elif which in enumerated:
            parts.append(f"iterator only at {enumerated[which]} (tiles)")
        else:
            parts.append("iterator not checked")
        return "; ".join(parts)

    return cell


def mutation_table(outcomes: list[Outcome], tested: list[Tested] | None) -> list[str]:
    from .families.mutants import MUTANTS

    by_name = {o.obligation.name: o for o in outcomes if o.obligation.family == "mutants"}
    by_test = {t.mutant: t for t in tested or []}
    lines = [
        "| mutant | breaks | killed by the proofs? | killed by the tests? |",
        "| --- | --- | --- | --- |",
    ]
    for m in MUTANTS:
        o = by_name.get(m.name)
        if o is None:
            proofs = "not run (`--mutants`)"
        else:
            how = o.counterexample.what if o.counterexample is not None else o.detail
            where = how.split(" — ")[0] if how else ""  # the probe that killed it
            proofs = f"{'yes' if o.ok else '**NO**'} — {o.status}" + (
                f" by {where}" if where else ""
            )
        t = by_test.get(m.name)
        if t is None:
            tests = "not run (`--mutation-tests`)"
        else:
            word = {True: "yes", False: "**NO**", None: "not run"}[t.killed]
            tests = f"{word} — {t.detail}"
        cell = [m.name, m.breaks, proofs, tests]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cell) + " |")
    return lines


def certificate(
    outcomes: list[Outcome],
    seconds: float,
    theorems: dict[str, str],
    command: str,
    tested: list[Tested] | None = None,
) -> str:
    """The whole markdown certificate."""
    zero_test_text = textwrap.dedent("\n\n".join(zero_test.__doc__.split("\n\n")[1:3])).strip()
    lines = [
        "# exactattn proof certificate",
        "",
        f"Command: `{command}`  ",
        f"Python {platform.python_version()}, sympy {sympy.__version__}, "
        f"numpy {np.__version__}, zero test on {zero_test.backend_name()}, "
        f"{platform.machine()}  ",
        f"Result: **{summary(outcomes, seconds)}**",
        "",
        "## Method",
        "",
        METHOD,
        "",
        zero_test_text,
        "",
        agreement.method(),
        "",
        VERDICTS,
        "",
        "## Agreement of the deciders",
        "",
        agreement.line(outcomes) + ".",
        "",
        "Obligations per family by the deciders of their comparisons (an obligation counts "
        "under a kind when it made such comparisons; *one* when any of them had one decider):",
        "",
        *agreement.table(outcomes),
        "",
        *(
            chain.markdown(outcomes, agreement.trusted_base(outcomes))
            if any(o.obligation.family in ("general", "smt") for o in outcomes)
            else [
                "Trusted base of the deciders (what both share, what had one decider):",
                "",
                *(f"- {item}" for item in agreement.trusted_base(outcomes)),
            ]
        ),
        "",
        "## Coverage",
        "",
        "Largest n at which a PROVED obligation exercised each parameter with each mask "
        "and score modification (F forward, R reverse; n_k = n). The last column says what "
        "holds for every n: the arithmetic by the lemmas and the induction of the general "
        "family (Lemma S for soft-cap and bias), the tile iterator by the smt family (the "
        "stated loop and the masks' contracts, and tiles()'s own formulas are the stated "
        "loop, for all n) — or, where smt did not run, only at the sizes the tiles "
        "family enumerated. KeyPadding.row_span writes its condition (max length ≤ a) inline "
        "rather than through padding_tile_kind: that it drops exactly the rows the proved "
        "formula drops is checked by the tiles family, not proved.",
        "",
    ]
    proved = [c for o in outcomes if o.status == PROVED for c in o.obligation.coverage]
    lines += coverage_matrix.matrix(proved, _all_n(outcomes))
    if any(o.obligation.family == "mutants" for o in outcomes) or tested:
        lines += ["", "## Mutation table", "", *mutation_table(outcomes, tested)]
    lines += ["", "## Theorems", ""]
    for family, text in theorems.items():
        lines += [f"### {family}", "", text.strip(), ""]
    lines += [
        "## Obligations",
        "",
        "| family | obligation | sizes | seconds | verdict | deciders that agreed |",
        "| --- | --- | --- | ---: | --- | --- |",
    ]
    for o in outcomes:
        ob = o.obligation
        verdict = o.status + (" (mutant killed)" if ob.expect_refuted and o.ok else "")
        if not o.ok:
            verdict = f"**{verdict} — FAILURE**"
        name = ob.name.replace("|", "\\|")
        by = "; ".join(f"{label} ×{count}" for label, count in o.deciders) or "—"
        lines.append(
            f"| {ob.family} | {name} | {ob.sizes} | {o.seconds:.2f} | {verdict} | "
            f"{by.replace('|', '/')} |"
        )
    details = [
        o for o in outcomes
        if not o.obligation.expect_refuted and (o.counterexample is not None or o.status != PROVED)
    ]  # fmt: skip
    if details:
        lines += ["", "## Counterexamples and open items", ""]
        for o in details:
            text = o.counterexample.full() if o.counterexample is not None else o.detail
            lines.append(f"- **{o.obligation.family} / {o.obligation.name}** — {o.status}: {text}")
    return "\n".join(lines) + "\n"
