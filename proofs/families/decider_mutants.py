"""Mutants that only one decider's bug would let through: each must be caught by the other.

Every verdict is decided twice (:mod:`proofs.engine.deciders`). To show that the second
decider is no formality, each mutant here breaks the library *and* one decider so that the
broken decider accepts the broken library: z3 deciding a weakened query, cvc5 answering
``unsat`` to everything, the zero test reading ``e^{kμ}`` as ``e^{μ}``, the point evaluation
doing the same, a rule of calculus with the wrong sign matched by the library's pullback,
and dual numbers sharing that wrong sign. Alone, the broken decider would PROVE the broken
library; each mutant is killed only because the other decider dissents (a DISAGREED
verdict naming both answers, or a refutation by the other side).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any
from unittest import mock

import sympy

from ..engine import cvc5_decider, ledger
from .patch_targets import as_method, full_one_key_wider, target_of

PROOFS = "exactattn.proofs.engine"
ALGORITHM = "exactattn.core.algorithm"


@dataclass(frozen=True)
class PairedMutant:
    """A library mutant and a decider mutant applied together (``(target, make)`` each, as
    :class:`~.mutants.Mutant`'s targets: ``module:attr`` or ``module:Class.method``)."""

    name: str
    breaks: str
    patches: tuple[tuple[str, Callable[[Any], Any]], ...]
    probes: tuple[str, ...]
    caught_by: str  # the decider that must dissent

    def resolve(self) -> list[tuple[Any, str, Any]]:
        found = [(target_of(spec).resolve(), spec) for spec, _ in self.patches]
        missing = [spec for got, spec in found if got is None]
        if missing:
            raise ledger.NoTarget(f"mutant {self.name!r}: {', '.join(missing)} not found")
        return [got for got, _ in found]

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for (owner, attribute, original), (_, make) in zip(self.resolve(), self.patches):
                replacement = make(original)
                if isinstance(owner, type):
                    replacement = as_method(replacement)
                stack.enter_context(mock.patch.object(owner, attribute, replacement))
            yield


# --- the library's half --------------------------------------------------------------------
def _scale_doubled(original: Callable) -> Callable:
    def broken(ctx, q, k, scale, allowed, *rest, **kw):
        return original(ctx, q, k, scale * 2, allowed, *rest, **kw)

    return broken


def _pullback_plus(original: Callable) -> Callable:
    """The soft-cap's pullback ``γ(1 + tanh²)`` instead of ``γ(1 − tanh²)``."""

    def broken(self, gamma, grads):
        return gamma * (self.ctx.scalar(1) + self.t * self.t)

    return broken


# --- the deciders' half --------------------------------------------------------------------
def _z3_weakened(original: Callable) -> Callable:
    """z3 decides the query with a ``false`` hypothesis added (always unsat); the exported
    text, which cvc5 decides, is the real query."""
    import z3

    def broken(solver):
        solver.add(z3.BoolVal(False, ctx=solver.ctx))
        return original(solver)

    return broken


def _cvc5_always_unsat(original: Callable) -> Callable:
    return lambda text, timeout_ms: cvc5_decider.Answer("unsat")


def _zero_test_unit_exponents(original: Callable) -> Callable:
    """The zero test reads ``e^{kμ}`` as ``e^{±μ}``: each exponent coefficient's size lost."""

    def broken(self, arg):
        terms = self._exponent_terms[arg]
        self._exponent_terms[arg] = [
            (monom, Fraction(1 if c > 0 else -1, self._monomials[monom])) for monom, c in terms
        ]
        try:
            return original(self, arg)
        finally:
            self._exponent_terms[arg] = terms

    return broken


def _points_unit_exponents(original: Callable) -> Callable:
    """The point evaluation reads ``e^{kμ}`` as ``e^{±g_μ μ}`` (the same loss, in decider 2)."""

    def broken(self, key):
        original(self, key)
        plain, logs = self.exponents[key]
        self.exponents[key] = ({m: Fraction(1 if c > 0 else -1) for m, c in plain.items()}, logs)
        self.gcds.update({m: Fraction(1) for m in plain})

    return broken


def _tanh_rule_plus(original: Callable) -> Callable:
    """``(tanh u)' = (1 + tanh² u) u'`` in the specification's rules of calculus."""

    def broken(self, e, x):
        if isinstance(e, sympy.tanh):
            return (1 + e * e) * self(e.args[0], x)
        return original(self, e, x)

    return broken


def _dual_tanh_plus(original: Callable) -> Callable:
    """Dual numbers with ``D tanh u = (1 + tanh² u) D u`` (the rules' wrong sign shared)."""

    def broken(self, e):
        if isinstance(e, sympy.tanh):
            t, _ = original(self, e)
            _, du = self(e.args[0])
            return t, (self.constant(1) + t * t) * du
        return original(self, e)

    return broken


WINDOW_KIND = "exactattn.core.masks:window_tile_kind"
TANH_RULE = f"{PROOFS}.symbolic_spec:Derivatives._rule"
PULLBACK = "exactattn.core.scores:_SoftcapTile.pullback"
SOFTCAP_REVERSE = "scores/reverse (dQ, dK, dV): softcap, symbolic cap"

MUTANTS: list[PairedMutant] = [
    PairedMutant("z3 decides a weakened query + window_tile_kind's FULL one key too wide",
                 "solver.z3_check and window_tile_kind",
                 ((f"{PROOFS}.solver:z3_check", _z3_weakened),
                  (WINDOW_KIND, full_one_key_wider)),
                 ("smt/window_tile_kind",), "cvc5"),
    PairedMutant("cvc5 answers unsat to everything + window_tile_kind's FULL one key too wide",
                 "cvc5_decider.decide and window_tile_kind",
                 ((f"{PROOFS}.cvc5_decider:decide", _cvc5_always_unsat),
                  (WINDOW_KIND, full_one_key_wider)),
                 ("smt/window_tile_kind",), "z3"),
    PairedMutant("the zero test drops exponent coefficients + tile_scores doubles c",
                 "zero_test (e^{kμ} as e^{μ}) and tile_scores",
                 ((f"{PROOFS}.zero_test:_Field.exp", _zero_test_unit_exponents),
                  (f"{ALGORITHM}:tile_scores", _scale_doubled)),
                 ("forward/self-attention",), "fmpq points"),
    PairedMutant("the point evaluation drops exponent coefficients + tile_scores doubles c",
                 "point_test (e^{kμ} as e^{μ}) and tile_scores",
                 ((f"{PROOFS}.point_test:Normaliser._exponent", _points_unit_exponents),
                  (f"{ALGORITHM}:tile_scores", _scale_doubled)),
                 ("forward/self-attention",), "zero test"),
    PairedMutant("(tanh u)' = (1 + tanh² u)u' in the rules + the soft-cap pullback likewise",
                 "Derivatives._rule (tanh) and _SoftcapTile.pullback",
                 ((TANH_RULE, _tanh_rule_plus), (PULLBACK, _pullback_plus)),
                 (SOFTCAP_REVERSE,), "dual numbers"),
    PairedMutant("(tanh u)' = (1 + tanh² u)u' in the rules + dual numbers likewise",
                 "Derivatives._rule (tanh) and dual._Evaluation._dual",
                 ((TANH_RULE, _tanh_rule_plus),
                  (f"{PROOFS}.dual:_Evaluation._dual", _dual_tanh_plus)),
                 (SOFTCAP_REVERSE,), "the zero test on the library's gradient"),
]  # fmt: skip


def obligations(kill: Callable[[PairedMutant], Any]) -> list[ledger.Obligation]:
    """One mutant obligation each, judged by ``kill`` (:func:`.mutants.kill`'s loop)."""
    return [
        ledger.Obligation(
            "mutants", m.name, f"caught by {m.caught_by}: {', '.join(m.probes)}",
            lambda m=m: kill(m), expect_refuted=True,
        )
        for m in MUTANTS
    ]  # fmt: skip
