"""SMT terms for the proofs: the masks' integer formulas over z3, and answers with a model.

* :class:`Z3Ops` — the :class:`exactattn.core.masks.IntOps` namespace over z3 integer terms
  (``max``/``min`` as if-then-else, ``and_``/``or_`` as connectives), so the masks' own
  structure functions (``window_row_span``, ``window_tile_kind``, ...) run unchanged on
  symbols;
* :func:`prove` — ``hypotheses ⇒ claim`` for *all* integer (and boolean) values of the
  variables: the solver finds the negation unsatisfiable (PROVED), or returns a model, which
  becomes a :class:`~proofs.numeric.Counterexample` with the variables' values and the named
  terms evaluated (REFUTED), or gives up — ``unknown`` or its time limit — (UNKNOWN, never
  PROVED). Every query is decided twice (:func:`second_opinion`): z3 serialises the
  assertions it decides as SMT-LIB2 and cvc5 parses and decides that text; ``unsat``
  against ``sat`` is a :class:`~.deciders.Disagreement`, a cvc5 ``unknown`` (or no cvc5)
  leaves z3's answer with one decider, recorded with the reason;
* :class:`Paths` and :class:`SymInt` — running Python code that *branches* on integers
  (``min(a, b)``, ``if a < b``) on symbols: each comparison asks the solver which outcomes
  are feasible under the path taken so far, and the code is run once per feasible path
  (symbolic execution), so its own control flow is covered exhaustively.

z3 (``z3-solver``, the ``proofs`` extra) is optional: without it every check that needs it
raises :class:`~proofs.engine.Skipped` with the command that installs it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from exactattn.infra.optional import install_hint

from . import cvc5_decider, deciders
from .counterexamples import Counterexample
from .ledger import Refuted, Skipped, Unknown

TIMEOUT_MS = 60_000


@functools.cache
def load() -> ModuleType:
    """The z3 module, or :class:`Skipped` naming the extra that installs it."""
    try:
        import z3
    except ModuleNotFoundError:
        raise Skipped(f"needs z3-solver, which is not installed: {install_hint('z3')}") from None
    return z3


M_TOP_PAD, TOP_PAD = -2, 256 << 20  # glibc's mallopt parameter, and the bytes kept


def keep_heap_top() -> None:
    """Ask glibc to keep 256 MB at the top of the heap when it trims (where there is glibc);
    called as a proof run's process starts (:mod:`exactattn.proofs.proof_run`), before the heap has
    grown.

    :func:`prove` makes a z3 context per query; each allocates some MB at the top of the
    heap and frees them, and once the process holds the proofs' expressions glibc gives
    those pages back at every free and faults them in again at the next context: 2 M page
    faults and 4 s of system time in a default ``exactattn prove``, 60 k with the pad (set
    late, the pad does not help). Untouched padding is address space, not resident memory.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(M_TOP_PAD, TOP_PAD)
    except (OSError, AttributeError):  # no glibc (macOS, musl): only speed is affected
        pass


def available() -> bool:
    try:
        load()
    except Skipped:
        return False
    return True


class Z3Ops:
    """:class:`exactattn.core.masks.IntOps` over z3 terms."""

    @staticmethod
    def max(a: Any, b: Any) -> Any:
        return load().If(a >= b, a, b)

    @staticmethod
    def min(a: Any, b: Any) -> Any:
        return load().If(a <= b, a, b)

    @staticmethod
    def and_(a: Any, b: Any) -> Any:
        return load().And(a, b)

    @staticmethod
    def or_(a: Any, b: Any) -> Any:
        return load().Or(a, b)

    @staticmethod
    def where(cond: Any, a: Any, b: Any) -> Any:
        return load().If(cond, a, b)

    @staticmethod
    def floordiv(a: Any, b: Any) -> Any:
        """``⌊a/b⌋`` for ``b > 0`` (SMT-LIB's ``div``, which the callers' hypotheses make so)."""
        return a / b


Z3 = Z3Ops()


def ints(names: str) -> list[Any]:
    """Fresh z3 integer variables, one per space-separated name."""
    return list(load().Ints(names))


def boolean(x: Any) -> Any:
    """A z3 boolean term (Python bools, which formulas give for absent sides, included)."""
    return load().BoolVal(x) if isinstance(x, bool) else x


def implies(a: Any, b: Any) -> Any:
    return load().Implies(boolean(a), boolean(b))


def prove(
    what: str,
    claim: Any,
    hypotheses: Iterable[Any] = (),
    show: dict[str, Any] | None = None,
    timeout_ms: int | None = None,
) -> None:
    """Prove ``hypotheses ⇒ claim`` for all values of the free variables, or raise.

    ``show`` names terms whose values a counterexample lists next to the variables'. The
    solver gets ``timeout_ms`` (default :data:`TIMEOUT_MS`); ``unknown`` raises
    :class:`~proofs.engine.Unknown`.
    """
    z3 = load()
    # A fresh context per query: the model z3 returns then depends on this query alone, not
    # on the terms the process built before, so a counterexample reads the same serially,
    # in worker processes and on a cluster.
    ctx = z3.Context()
    solver = z3.Solver(ctx=ctx)
    solver.set("timeout", TIMEOUT_MS if timeout_ms is None else timeout_ms)
    solver.add(*(boolean(h).translate(ctx) for h in hypotheses))
    solver.add(z3.Not(boolean(claim)).translate(ctx))
    text = solver.to_smt2()  # the query, once: what cvc5 decides too
    verdict = z3_check(solver)
    if verdict == z3.unsat:
        second_opinion(what, "unsat", text, timeout_ms)
        return
    if verdict != z3.sat:
        raise Unknown(f"{what}: the solver answered {verdict} ({solver.reason_unknown()})")
    model = solver.model()
    second_opinion(what, "sat", pinned(text, model), timeout_ms)
    point = {
        str(d): str(model[d]) for d in sorted(model.decls(), key=str) if d.arity() == 0
    }  # the variables
    values = ", ".join(
        f"{name} = {model.eval(t.translate(ctx), model_completion=True) if z3.is_expr(t) else t}"
        for name, t in (show or {}).items()
    )
    if not values:
        raise Refuted(Counterexample(what, point, "false", "these values", "for"))
    raise Refuted(Counterexample(what, point, "false", values, "with"))


def pinned(text: str, model: Any) -> str:
    """The query ``text`` with every constant and function z3's model defines fixed to
    its value there (``define-fun`` for ``declare-fun``): cvc5 then confirms the
    counterexample, the quantified variables being its own to decide."""
    defined = {}
    for d in model.decls():
        interpretation = model[d]
        body = interpretation.sexpr() if d.arity() == 0 else None
        if d.arity() == 0:
            defined[d.name()] = f"(define-fun {d.name()} () {d.range().sexpr()} {body})"
        else:
            args = " ".join(f"(x!{k} {d.domain(k).sexpr()})" for k in range(d.arity()))
            value = _interpretation(interpretation, d.arity())
            defined[d.name()] = f"(define-fun {d.name()} ({args}) {d.range().sexpr()} {value})"
    lines = []
    for line in text.splitlines():
        if line.startswith("(declare-fun "):
            name = line.split()[1]
            lines.append(defined.get(name, line))
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def _interpretation(f: Any, arity: int) -> str:
    """A z3 function interpretation as an ``ite`` chain over ``x!0 …`` (z3 writes an
    argument in the default value as ``(:var i)``)."""
    out = re.sub(r"\(:var (\d+)\)", r"x!\1", f.else_value().sexpr())
    for k in range(f.num_entries() - 1, -1, -1):
        entry = f.entry(k)
        tests = [f"(= x!{i} {entry.arg_value(i).sexpr()})" for i in range(arity)]
        test = tests[0] if arity == 1 else f"(and {' '.join(tests)})"
        out = f"(ite {test} {entry.value().sexpr()} {out})"
    return out


def z3_check(solver: Any) -> Any:
    """z3's answer to a :func:`prove` query (a function of its own, so that a mutant can
    stand for a z3 bug: :mod:`proofs.families.decider_mutants`)."""
    return solver.check()


def second_opinion(what: str, first: str, text: str, timeout_ms: int | None = None) -> None:
    """cvc5's answer to the query ``text`` that z3 answered ``first`` (``unsat``/``sat``).

    Records the comparison as decided by both when the answers agree and by z3 only (with
    the reason) when cvc5 is missing or answers ``unknown``; raises
    :class:`~.deciders.Disagreement` naming ``what`` and both answers when they differ.
    """
    try:
        second = cvc5_decider.decide(text, TIMEOUT_MS if timeout_ms is None else timeout_ms)
    except cvc5_decider.Missing as err:
        deciders.one(deciders.SMT, str(err))
        return
    if second.word == first:
        deciders.both(deciders.SMT)
    elif second.word == "unknown":
        deciders.one(deciders.SMT, f"cvc5 answered {second}")
    else:
        raise deciders.Disagreement(f"{what}: z3 answered {first}, cvc5 answered {second}")


# --- symbolic execution of code that branches on integers -----------------------------------
class Paths:
    """Run a function once per feasible path of its comparisons on :class:`SymInt` values.

    A comparison with both outcomes feasible under the hypotheses and the path so far takes
    ``True`` and queues the path that takes ``False``; a comparison with one feasible
    outcome takes it. :meth:`explore` returns every ``(path condition, result)``.
    """

    def __init__(self, hypotheses: Iterable[Any] = ()) -> None:
        self.hypotheses = [boolean(h) for h in hypotheses]
        self._forced: list[bool] = []
        self._taken: list[bool] = []
        self._condition: list[Any] = []
        self._pending: list[list[bool]] = []

    def symbol(self, name: str) -> SymInt:
        return SymInt(load().Int(name), self)

    def explore(self, fn: Callable[[], Any]) -> list[tuple[list[Any], Any]]:
        self._pending, out = [[]], []
        while self._pending:
            self._forced, self._taken = self._pending.pop(), []
            self._condition = list(self.hypotheses)
            result = fn()
            out.append((list(self._condition), result))
        return out

    def _feasible(self, term: Any) -> bool:
        """Whether the path so far can take ``term``: a branch is dropped only when z3 finds
        it unsatisfiable (and cvc5 agrees on the same text: :func:`second_opinion`); an
        ``unknown`` keeps it."""
        z3 = load()
        solver = z3.Solver()
        solver.add(*self._condition, term)
        if solver.check() != z3.unsat:
            return True
        second_opinion(f"the branch {term} (after {len(self._taken)} taken)", "unsat",
                       solver.to_smt2())  # fmt: skip
        return False

    def decide(self, term: Any) -> bool:
        z3 = load()
        if len(self._taken) < len(self._forced):
            choice = self._forced[len(self._taken)]
        else:
            yes, no = self._feasible(term), self._feasible(z3.Not(term))
            if yes and no:
                self._pending.append([*self._taken, False])
            choice = yes
        self._taken.append(choice)
        self._condition.append(term if choice else z3.Not(term))
        return choice


class SymInt:
    """A symbolic integer whose comparisons are decided by :class:`Paths` (one path each)."""

    __hash__ = None  # type: ignore[assignment]  # equality is symbolic

    def __init__(self, term: Any, paths: Paths) -> None:
        self.term, self.paths = term, paths

    @staticmethod
    def _term(x: Any) -> Any:
        return x.term if isinstance(x, SymInt) else x

    def _new(self, term: Any) -> SymInt:
        return SymInt(term, self.paths)

    def __add__(self, other: Any) -> SymInt:
        return self._new(self.term + self._term(other))

    __radd__ = __add__

    def __sub__(self, other: Any) -> SymInt:
        return self._new(self.term - self._term(other))

    def __rsub__(self, other: Any) -> SymInt:
        return self._new(self._term(other) - self.term)

    def __neg__(self) -> SymInt:
        return self._new(-self.term)

    def __lt__(self, other: Any) -> bool:
        return self.paths.decide(self.term < self._term(other))

    def __le__(self, other: Any) -> bool:
        return self.paths.decide(self.term <= self._term(other))

    def __gt__(self, other: Any) -> bool:
        return self.paths.decide(self.term > self._term(other))

    def __ge__(self, other: Any) -> bool:
        return self.paths.decide(self.term >= self._term(other))

    def __eq__(self, other: Any) -> bool:  # type: ignore[override]
        return self.paths.decide(self.term == self._term(other))

    def __ne__(self, other: Any) -> bool:  # type: ignore[override]
        return self.paths.decide(self.term != self._term(other))

    def __bool__(self) -> bool:
        raise TypeError("a symbolic integer has no truth value; compare it")

    def __index__(self) -> int:
        raise TypeError("a symbolic integer has no concrete value")

    def __repr__(self) -> str:
        return f"SymInt({self.term})"


def term(x: Any) -> Any:
    """The z3 term of a :class:`SymInt` (other values unchanged)."""
    return SymInt._term(x)
