"""``exactattn check`` as a function: targets in, a report of every variant out.

:func:`run` resolves the targets' variants (each dtype each takes, on the device), draws
cases with hypothesis (:mod:`exactattn.difftest.strategies`: every mask kind and
composition, both alignments, ``n_q ≠ n_k``, GQA, layouts, distributions), judges each
variant on each case (:func:`.check.check_case`), shrinks failures, and probes foreign
dropout (:mod:`.probes`). Several worker processes split the examples when every target is
named (callables given as objects run in this process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .. import targets as registry
from ..difftest import strategies
from ..difftest.cases import LAYOUTS
from ..targets import Target, Variant
from ..targets.flex import STATS
from .check import Options, check_case
from .probes import ProbeResult, probe
from .runner import Report, search

DEFAULT_DTYPES = ("float64", "float32", "float16", "bfloat16")


@dataclass
class Settings:
    examples: int = 200
    dtypes: tuple[str, ...] | None = None
    max_n: int = 32
    max_d: int = 8
    grads: bool = True
    seed: int = 0
    device: str = "cpu"
    jobs: int = 1
    determinism: bool = True
    baselines: bool = True
    probes: bool = True
    progress: bool = False
    sampled: bool = True  # False: slow interpreters run every case they take
    program: tuple[str | None, str | None] | None = None  # a user's (mask_mod, score_mod)


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


def run(targets: list[Target], settings: Settings, names: list[tuple] | None = None) -> Result:
    """Check ``targets`` (see the module docstring); ``names`` (picklable target specs)
    allow ``settings.jobs > 1``."""
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
    if variants:
        dtypes = tuple(sorted({v.dtype for v in variants}, key=_dtype_order))
        with _single_thread():
            if settings.jobs > 1 and names is not None:
                result.report = _parallel(names, settings, dtypes)
            else:
                result.report = _search(variants, settings, dtypes, settings.seed)
            if settings.probes and not result.report.interrupted:
                result.probes = _probes(variants, settings)
    result.compile = dict(result.report.compile)
    result.seconds = time.perf_counter() - start
    return result


def _dtype_order(dtype: str) -> int:
    return DEFAULT_DTYPES.index(dtype) if dtype in DEFAULT_DTYPES else len(DEFAULT_DTYPES)


def _search(variants: list[Variant], settings: Settings, dtypes: tuple, seed: int) -> Report:
    options = Options(settings.grads, settings.determinism, settings.baselines, settings.sampled)

    def strategy(active: list[Variant]) -> Any:
        """Cases in the dtypes of the active variants (dtypes of failed ones are dropped)."""
        return strategies.draws(
            max_n=settings.max_n,
            max_d=settings.max_d,
            dtypes=tuple(d for d in dtypes if any(v.dtype == d for v in active)),
            layouts=LAYOUTS,
            exact_share=0,
            dropout=any(v.target.caps.dropout is True for v in active),
            program=settings.program,
            modify=any(True in (v.target.caps.bias, v.target.caps.softcap) for v in active),
        )

    def judge(case, active):
        return check_case(case, active, options)

    progress = "check" if settings.progress else ""
    before = dataclasses.asdict(STATS)
    report = search(judge, variants, strategy, settings.examples, seed, progress, keep_failed=True)
    after = dataclasses.asdict(STATS)
    report.compile.update({k: after[k] - before[k] for k in after if after[k] != before[k]})
    return report


def _worker(args: tuple) -> Report:
    names, settings, dtypes, seed = args
    _one_thread()
    targets = [registry.get(*spec[:1], **spec[1]) for spec in names]
    variants, _, _ = plan(targets, settings)
    return _search(variants, settings, dtypes, seed)


def _parallel(names: list[tuple], settings: Settings, dtypes: tuple) -> Report:
    jobs = settings.jobs
    shares = [settings.examples // jobs + (i < settings.examples % jobs) for i in range(jobs)]
    report = Report()
    with ProcessPoolExecutor(jobs) as pool:
        args = [
            (names, _with(settings, examples=n), dtypes, settings.seed * 1000 + i)
            for i, n in enumerate(shares)
        ]
        for part in pool.map(_worker, args):
            report.merge(part)
    return report


def _with(settings: Settings, **changes: Any) -> Settings:
    return dataclasses.replace(settings, **changes)


def _one_thread() -> None:
    """One BLAS / torch thread per worker: the workers already fill the cores."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


@contextlib.contextmanager
def _single_thread() -> Iterator[None]:
    """torch on one intra-op thread for the run, restored after: the cases are small, and
    waking a thread pool per operation made a 300-case check 5× slower (measured)."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _probes(variants: list[Variant], settings: Settings) -> list[ProbeResult]:
    out = []
    for variant in variants:
        if variant.target.caps.dropout != "own":
            continue
        try:
            out.append(probe(variant, grads=settings.grads and not variant.grads_unsupported()))
        except Exception as error:
            out.append(
                ProbeResult(variant.name, 0.3, ok=False, detail=f"{type(error).__name__}: {error}")
            )
    return out
