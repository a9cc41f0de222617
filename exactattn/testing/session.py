"""``exactattn check`` as a function: targets in, a report of every variant out.

:func:`run` resolves the targets' variants (each dtype each takes, on the device), draws
cases with hypothesis (:mod:`exactattn.cases.strategies`: every mask kind and
composition, both alignments, ``n_q ≠ n_k``, GQA, layouts, distributions), judges each
variant on each case (:func:`exactattn.testing.case_check.check_case`) through
:func:`exactattn.testing.search.search` — in this process, in ``settings.workers`` local processes
or on the Dask cluster of ``settings.scheduler``, with the same report — shrinks failures, and
probes foreign dropout (:mod:`.probes`). Worker processes rebuild the targets from their names
(``names``); callables given as objects run in this process only.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from .. import targets as registry
from ..cases import LAYOUTS, Case, interface_fields, paths, strategies
from ..infra.executors import make_executor
from ..infra.journal import Journal
from ..targets import Target, Variant
from ..targets.flex_convention import STATS
from ..targets.interface_table import NAMES as INTERFACES
from .case_check import Options, check_case
from .judge import Finding
from .known import reclassify
from .probes import ProbeResult, probe
from .search import Report, search, single_thread

DEFAULT_DTYPES = ("float64", "float32", "float16", "bfloat16")


@dataclass
class Settings:
    examples: int = 200
    dtypes: tuple[str, ...] | None = None
    max_n: int = 2048
    max_d: int | None = None  # None: the field's head dims (exactattn.cases.paths)
    budget: int = 1 << 17  # the largest B·H·n_q·n_k of a drawn case
    grads: bool = True
    seed: int = 0
    device: str = "cpu"
    workers: int = 1
    scheduler: str | None = None  # a Dask scheduler's address: the cases run there
    determinism: bool = True
    baselines: bool = True
    probes: bool = True
    progress: bool = False
    sampled: bool = True  # False: slow interpreters run every case they take
    program: tuple[str | None, str | None] | None = None  # a user's (mask_mod, score_mod)
    fast_reference: bool = True  # the float64 reference where it serves, arb elsewhere


@dataclass
class Result:
    """A finished (or interrupted) check: the report, what ran and what could not."""

    settings: Settings
    report: Report
    variants: list[str]
    unavailable: dict[str, str] = field(default_factory=dict)
    unsupported_dtypes: dict[str, list[str]] = field(default_factory=dict)
    probes: list[ProbeResult] = field(default_factory=list)
    compile: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    targets: dict[str, Target] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return bool(self.report.failures) or any(not p.ok for p in self.probes)


def plan(targets: list[Target], settings: Settings) -> tuple[list[Variant], dict, dict]:
    """The variants to run, the unavailable targets and the dtypes a target does not take."""
    variants, unavailable, unsupported = [], {}, {}
    wanted = settings.dtypes
    for target in targets:
        why = registry.unavailable(target, settings.device)
        if why is not None:
            unavailable[target.name] = why
            continue
        chosen = list(target.caps.dtypes if wanted is None else wanted)
        missing = [d for d in chosen if d not in target.caps.dtypes]
        if missing:
            unsupported[target.name] = missing
        variants += [Variant(target, d, settings.device) for d in chosen if d not in missing]
    return variants, unavailable, unsupported


@dataclass
class Variants:
    """The check's source of units (:mod:`exactattn.testing.search`): the variants of the targets
    ``names`` (``(name, keywords)`` as :func:`exactattn.targets.get` takes them), rebuilt wherever
    it runs, or ``given`` variants (this process only)."""

    settings: Settings
    names: list[tuple[str, dict]] | None = None
    given: list[Variant] | None = None

    def build(self) -> list[Variant]:
        if self.given is not None:
            return list(self.given)
        chosen = [registry.get(name, **spec) for name, spec in self.names or []]
        return plan(chosen, self.settings)[0]

    def judge(self, case: Case, units: list[Variant]) -> list[Finding]:
        """Every unit's finding on ``case``, a failure a known bug explains reclassified
        (:func:`.known.reclassify`: ``KNOWN-UPSTREAM`` is reported, not failed)."""
        s = self.settings
        options = Options(s.grads, s.determinism, s.baselines, s.sampled, s.fast_reference)
        by_name = {u.name: u for u in units}
        found = [reclassify(by_name[f.target], case, f) for f in check_case(case, units, options)]
        return [dataclasses.replace(f, covered=_covered(case, by_name[f.target])) for f in found]

    def counters(self) -> dict[str, float]:
        return dataclasses.asdict(STATS)

    def __getstate__(self) -> dict[str, Any]:
        if self.given is not None:
            raise TypeError(
                "targets given as objects run in this process only: name them (registry "
                "names or module:function) to run on worker processes or a cluster"
            )
        return self.__dict__


def _covered(case: Case, unit: Variant) -> tuple[str, ...]:
    """What ``case`` covered of the interface fields ``unit``'s convention reads."""
    reads = unit.convention.reads
    return tuple(interface_fields.coverage(case, reads)) if reads else ()


def run(
    targets: list[Target],
    settings: Settings,
    names: list[tuple] | None = None,
    journal: Journal | None = None,
) -> Result:
    """Check ``targets`` (see the module docstring); ``names`` (picklable target specs)
    allow ``settings.workers > 1`` and ``settings.scheduler``; ``journal`` keeps each
    judged case (a resumed journal's cases are not judged again)."""
    start = time.perf_counter()
    variants, unavailable, unsupported = plan(targets, settings)
    result = Result(
        settings,
        Report(),
        [v.name for v in variants],
        unavailable,
        unsupported,
        targets={t.name: t for t in targets},
    )
    remote = settings.workers > 1 or settings.scheduler
    if remote and names is None:
        raise ValueError(
            "settings.workers > 1 or settings.scheduler need the targets' names "
            "(names=[(name, keywords), ...]): objects do not travel to other processes"
        )
    if variants:
        source = (
            Variants(settings, names=list(names)) if remote else Variants(settings, given=variants)
        )
        result.report = judge_cases(source, _strategy(variants, settings), settings, journal)
        if settings.probes and not result.report.interrupted:
            with single_thread():
                result.probes = _probes(variants, settings)
    result.report.notes += [f"{t.name}: {note}" for t in targets for note in t.options.notes]
    result.compile = dict(result.report.compile)
    result.seconds = time.perf_counter() - start
    return result


def judge_cases(source: Any, cases: Any, settings: Settings, journal: Journal | None) -> Report:
    """The one runner of check and difftest: ``settings.examples`` cases drawn from the
    strategy ``cases`` at ``settings.seed``, judged on the units of ``source`` (see
    :mod:`exactattn.testing.search`: ``build``, ``judge``, ``counters``) in this process, in
    ``settings.workers`` processes or on the cluster of ``settings.scheduler``; each failure
    shrunk; ``journal`` keeps each judged case."""
    executor = make_executor(settings.workers, settings.scheduler)
    try:
        return search(
            source, cases, settings.examples, settings.seed,
            executor=executor, journal=journal, progress=settings.progress,
        )  # fmt: skip
    finally:
        executor.close()


def _strategy(variants: list[Variant], settings: Settings) -> Any:
    """Cases in the variants' dtypes: with a user's program, every case runs it (the
    composition strategy, :func:`exactattn.cases.strategies.draws`); else the calling paths
    and sizes aimed at the claimed block sizes (:func:`exactattn.cases.paths.check_draws`);
    dropout when some variant replays our keep-bits, score modifications when some variant
    takes them, ragged query batches when some variant's convention takes query lengths."""
    dtypes = tuple(sorted({v.dtype for v in variants}, key=_dtype_order))
    dropout = any(v.target.caps.dropout is True for v in variants)
    modify = any(True in (v.target.caps.bias, v.target.caps.softcap) for v in variants)
    interface = any(v.target.convention in INTERFACES for v in variants)
    ragged = any(v.convention.ragged for v in variants)
    kvcache = any(v.convention.kvcache for v in variants)
    if settings.program is not None:
        return strategies.draws(
            max_n=settings.max_n,
            max_d=settings.max_d or 8,
            dtypes=dtypes,
            layouts=LAYOUTS,
            exact_share=0,
            dropout=dropout,
            program=settings.program,
            modify=modify,
        )
    blocks = tuple(sorted({b for v in variants if (b := v.claim.block)}))
    return paths.check_draws(
        blocks=blocks,
        max_n=settings.max_n,
        max_d=settings.max_d,
        budget=settings.budget,
        dtypes=dtypes,
        layouts=LAYOUTS,
        dropout=dropout,
        modify=modify,
        interface=interface,
        ragged=ragged,
        kvcache=kvcache,
    )


def _dtype_order(dtype: str) -> int:
    return DEFAULT_DTYPES.index(dtype) if dtype in DEFAULT_DTYPES else len(DEFAULT_DTYPES)


def _probes(variants: list[Variant], settings: Settings) -> list[ProbeResult]:
    out = []
    for variant in variants:
        if variant.target.caps.dropout != "own":
            continue
        try:
            out.append(probe(variant, grads=settings.grads and not variant.grads_unsupported()))
        except Exception as error:
            refused = variant.target.refuses(error)
            why = f"{type(error).__name__}: {refused if refused is not None else error}"
            out.append(ProbeResult(variant.name, 0.3, ok=refused is not None, detail=why))
            out[-1].ran = refused is None  # a target without dropout: the probe did not run
    return out
