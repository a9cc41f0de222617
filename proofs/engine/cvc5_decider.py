"""cvc5 as the second SMT decider: it parses and decides the SMT-LIB2 text of a z3 query.

The formulas are the library's own code run on z3 terms (:mod:`.solver`); z3 serialises the
assertions it decides (``Solver.to_smt2``) and cvc5 reads that text through its own parser,
so the encoding is written once and the two solvers share no code. :func:`decide` answers
``unsat``, ``sat`` or ``unknown`` with the reason; a crash of the parser or the solver and
cvc5's time limit are ``unknown`` too (never ``unsat``).

Quantified queries (the BlockMask's classes and the packed sequences' boundaries as
uninterpreted functions under ``∀``) are decided with cvc5's exhaustive instantiation after
e-matching (``full-saturate-quant``), and enumerative instantiation (``enum-inst``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType

INSTALL = "pip install 'exactattn[proofs]' (or: pip install cvc5)"


class Missing(Exception):
    """cvc5 is not installed (the message says how to install it)."""


@functools.cache
def load() -> ModuleType:
    """The cvc5 module, or :class:`Missing` naming the extra that installs it."""
    try:
        import cvc5
    except ModuleNotFoundError:
        raise Missing(f"cvc5 is not installed: {INSTALL}") from None
    return cvc5


def available() -> bool:
    try:
        load()
    except Missing:
        return False
    return True


@dataclass(frozen=True)
class Answer:
    """``unsat``, ``sat`` or ``unknown``; ``reason`` says why for ``unknown``."""

    word: str
    reason: str = ""

    def __str__(self) -> str:
        return self.word + (f" ({self.reason})" if self.reason else "")


def decide(text: str, timeout_ms: int) -> Answer:
    """cvc5's answer to the SMT-LIB2 script ``text`` (its one ``check-sat``)."""
    cvc5 = load()
    try:
        solver = cvc5.Solver()
        solver.setOption("tlimit-per", str(timeout_ms))
        if "forall" in text or "exists" in text:
            solver.setOption("full-saturate-quant", "true")
            solver.setOption("enum-inst", "true")
        parser = cvc5.InputParser(solver)
        parser.setStringInput(cvc5.InputLanguage.SMT_LIB_2_6, "(set-logic ALL)\n" + text, "q")
        symbols = parser.getSymbolManager()
        answers = []
        while True:
            command = parser.nextCommand()
            if command.isNull():
                break
            if command.getCommandName() == "check-sat":
                answers.append(solver.checkSat())
            else:
                command.invoke(solver, symbols)
    except Exception as err:  # cvc5 raises its own errors on a crash: no answer
        return Answer("unknown", f"cvc5 raised {type(err).__name__}: {err}")
    if len(answers) != 1:
        return Answer("unknown", f"the script has {len(answers)} check-sat commands, not 1")
    (result,) = answers
    if result.isUnsat():
        return Answer("unsat")
    if result.isSat():
        return Answer("sat")
    return Answer("unknown", str(result.getUnknownExplanation()).lower())
