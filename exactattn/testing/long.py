"""``exactattn check --profile long``: a few cases at n = 16384, 65536 and 131072.

At each length :data:`SIZES`, one head (``B·H = 1``, ``d = v = 64``, normal inputs, key
blocks of 512 for the bound's claim) on two calling paths: ``is_causal`` square (training,
no table) and key padding as a boolean ``attn_mask`` (an ``n_q × n_k`` table the target
reads: it shows the memory guard). The target runs the whole problem, forward only. Its
output is judged on strips of :data:`STRIP` query rows — the first, one across ``n/2`` and
the last — where the float64 reference (:func:`exactattn.cases.exact.fast` on the
strip, the mask read a strip of rows at a time) and the bound
(:func:`exactattn.error.bounds.bounds_max` of the strip's rows: the forward's bound of a row
reads that row only) cost ``O(STRIP·n·d)`` each, a small fraction of the target's run.

At :data:`GRADIENT_N` = 16384 the target also runs its backward and ``Y, dQ, dK, dV`` are
judged on every row: dK and dV sum over all ``n`` query rows, so the float64 reference
(:func:`exactattn.cases.exact.fast`) and the bound (:func:`exactattn.testing.tolerance.
bounds`) each make one full ``O(n²·d)`` pass, a strip of rows at a time (their chunks:
memory ``O(n·d)`` plus one strip's tiles), several minutes a case; a reference whose
radius is not below 2^-20 of the allowed error skips the gradients, saying so. The larger
lengths judge the forward only (a gradient pass there takes hours).

Skipped, each with its reason printed once: a float64 target (only arb could certify it, and
arb at this length takes days), the gradients beyond :data:`GRADIENT_N`, the same-dtype
naive baseline and a dense bias table (both need ``n²``-sized memory), the determinism run.
A case whose estimated memory (the inputs as held, a table the path needs, the strips'
tiles) exceeds what the machine has available is skipped with a message saying how much it
needed. Before each case an ETA is printed, the target's time at :data:`PROBE_N` scaled by
``(n/PROBE_N)²``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cases import Case
from ..cases.exact import Reference, fast, serves
from ..cases.inputs import make_inputs
from ..error import bounds as error_bounds
from ..targets import Variant
from .judge import Finding, judge
from .tolerance import Allowed, bounds, overflow_risk

SIZES = (16384, 65536, 131072)
GRADIENT_N = 16384  # the one length whose gradients are judged (a full n² pass each)
STRIP = 512  # query rows per judged strip
PROBE_N = 2048  # the ETA's calibration size
HEAD_DIM = 64
BLOCK = 512
PATHS = ("causal-square", "padding")
SKIPPED = {
    "float64": "float64 targets are not judged at long n: only the arb reference could "
    "certify them (the float64 reference's radius is not below 2^-20 of their tolerance), "
    "and arb at this length takes days",
    "gradients": f"gradients are judged at n = {GRADIENT_N} only: dK, dV sum over all n "
    "query rows, whose reference and bound are a full n² pass (hours at 65536 and beyond; "
    "the forward is judged on strips of rows there)",
    "baselines": "the same-dtype naive baseline and a dense bias table need n²-sized memory "
    "(the naive baseline's scores alone: 64 GiB at n = 131072 in float32): not run",
    "determinism": "no second run at long n (the determinism check is the default profile's)",
}


@dataclass
class LongCase:
    """One long case of one variant: what ran, how long, and the verdict."""

    n: int
    path: str
    target: str
    finding: Finding
    rows: int = 0  # query rows judged
    seconds: dict[str, float] = field(default_factory=dict)


def available_bytes() -> int:
    """Memory the machine has available now (``MemAvailable``; free pages elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def needed_bytes(n: int, path: str, dtype: str) -> int:
    """What a case needs at most: the float64 arrays and the held copies, the ``n × n``
    table the path hands the target (a boolean mask, and the float mask a kernel may make
    of it), and the strips' float64 tiles (reference and bound, ~12 per strip)."""
    itemsize = np.dtype("float32" if dtype == "bfloat16" else dtype).itemsize
    arrays = 4 * n * HEAD_DIM * (8 + itemsize) * 2
    table = n * n * (1 + itemsize) if path == "padding" else 0
    strips = 12 * STRIP * n * 8
    return arrays + table + strips


def long_case(n: int, path: str, dtype: str, seed: int = 0) -> Case:
    """The case at length ``n`` on ``path`` (no ``n × n`` array is formed here)."""
    x = make_inputs("normal", n, HEAD_DIM, seed)
    q, k, v, g = (x[name].reshape(1, 1, n, HEAD_DIM) for name in "qkvg")
    if path == "causal-square":
        mask: dict[str, Any] = {"kind": "causal", "align": "top-left"}
    else:  # keys past 3/4 of n padded away
        mask = {"kind": "padding", "lengths": [3 * n // 4]}
    return Case(q, k, v, g, BLOCK, mask=mask, dtype=dtype, note=f"path {path} (long)")


def strips(n: int) -> list[tuple[int, int]]:
    """The judged query rows: the first, one across ``n/2`` and the last strip (merged
    where they overlap)."""
    half = max(0, n // 2 - STRIP // 2)
    wanted = sorted({(0, min(STRIP, n)), (half, min(half + STRIP, n)), (max(0, n - STRIP), n)})
    out: list[tuple[int, int]] = []
    for start, stop in wanted:
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


def _strip(case: Case, held: dict[str, np.ndarray], rows: tuple[int, int]):
    """The strip's rows as a case (its mask read from the whole case's rows)."""
    r0, r1 = rows
    cut = {x: held[x][..., r0:r1, :] if x in "qg" else held[x] for x in "qkvg"}
    part = dataclasses.replace(case, q=case.q[..., r0:r1, :], g=case.g[..., r0:r1, :])
    return part, cut


def judge_strip(
    variant: Variant, case: Case, held: dict[str, np.ndarray], out: dict[str, Any], rows
) -> Finding:
    """The variant's ``y`` (and ``lse``) on query rows ``rows`` against the float64
    reference of those rows, within the bound of its claim on those rows."""
    r0, r1 = rows
    part, cut = _strip(case, held, rows)
    ref = _strip_reference(case, part, cut, rows)
    arith = variant.arith(variant.bound_block(case), held)
    bound = error_bounds.bounds_max(
        arith, cut["q"], cut["k"], cut["v"], None,
        reverses=variant.target.options.reverses, scale=case.scale,
        allowed=case.allowed_rows(r0, r1) if case.masked else None,
    )  # fmt: skip
    allowed = Allowed(bound, overflow_risk(arith, part, cut))
    outputs = {"y": np.asarray(out["y"])[..., r0:r1, :]}
    if "lse" in out:
        outputs["lse"] = np.asarray(out["lse"])[..., r0:r1]
    finding = judge(variant, part, outputs, ref, allowed)
    finding.reference = ref.served
    if finding.status != "ok":  # the entry's index counts from the strip's first row
        finding.detail += f" (query rows {r0}:{r1}: row index + {r0})"
    if finding.where.get("query_row") is not None:
        finding.where["query_row"] += r0
    return finding


def _strip_reference(case: Case, part: Case, cut: dict, rows: tuple[int, int]) -> Reference:
    """The float64 reference of the strip: its rows of the whole case's mask, lazily."""
    from ..oracle.float64 import fast_attention

    r0 = rows[0]
    enclosure = fast_attention(
        cut["q"], cut["k"], cut["v"], None, scale=case.scale,
        allowed=(lambda a, b: case.allowed_rows(r0 + a, r0 + b)) if case.masked else None,
        enable_gqa=case.group > 1,
    )  # fmt: skip
    if not all(np.isfinite(ball.rad).all() for ball in enclosure.balls.values()):
        raise ValueError("the float64 reference cannot serve this strip (scores near its range)")
    return Reference(enclosure, part, cut, served="float64")


def run_long(
    variants: list[Variant],
    *,
    sizes: tuple[int, ...] = SIZES,
    say: Callable[[str], None] = print,
) -> list[LongCase]:
    """Every variant on the long cases (see the module docstring), one line per event."""
    for reason in SKIPPED.values():
        say(f"long: {reason}")
    judged = [v for v in variants if v.dtype != "float64"]
    for v in variants:
        if v.dtype == "float64":
            say(f"long: {v.name} skipped: {SKIPPED['float64']}")
    results: list[LongCase] = []
    rates: dict[tuple[str, str], float] = {}
    plan = [(n, path, v) for n in sizes for path in PATHS for v in judged]
    for index, (n, path, variant) in enumerate(plan, 1):
        head = f"long case {index}/{len(plan)}: {variant.name} n={n} {path}"
        need, have = needed_bytes(n, path, variant.dtype), available_bytes()
        if need > have:
            why = f"needs ~{need / 2**30:.1f} GiB, {have / 2**30:.1f} GiB available"
            say(f"{head}: skipped, {why}")
            finding = Finding(variant.name, "skip", why, dtype=variant.dtype)
            results.append(LongCase(n, path, variant.name, finding))
            continue
        case = long_case(n, path, variant.dtype)
        why = variant.unsupported(case)
        if why is not None:
            say(f"{head}: skipped, {why}")
            finding = Finding(variant.name, "skip", why, dtype=variant.dtype)
            results.append(LongCase(n, path, variant.name, finding))
            continue
        key = (variant.name, path)
        if key not in rates:
            rates[key] = _probe_seconds(variant, path) / PROBE_N**2
        eta = _minutes(rates[key] * n * n)
        later = " then the gradients' reference and bound" if n == GRADIENT_N else ""
        say(f"{head}: ETA ~{eta} (the run at n={PROBE_N} × (n/{PROBE_N})²){later}")
        results.append(_one(variant, case, n, path, say, head))
    return results


def _probe_seconds(variant: Variant, path: str) -> float:
    """The target's forward at :data:`PROBE_N` (the second of two runs: the first warms up)."""
    case = long_case(PROBE_N, path, variant.dtype, seed=1)
    held = variant.held(case)
    variant.run(case, held, False)
    start = time.perf_counter()
    variant.run(case, held, False)
    return time.perf_counter() - start


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _one(variant: Variant, case: Case, n: int, path: str, say, head: str) -> LongCase:
    held = variant.held(case)
    grads = n == GRADIENT_N and not variant.grads_unsupported()
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    try:
        out = variant.run(case, held, grads)
    except Exception as error:  # a target's failure is a finding, never a crash
        text = (str(error).strip().splitlines() or [""])[0][:300]
        finding = Finding(variant.name, "fail", f"raised {type(error).__name__}: {text}")
        finding.dtype = variant.dtype
        say(f"{head}: FAIL {finding.detail}")
        return LongCase(n, path, variant.name, finding)
    seconds["target"] = time.perf_counter() - start
    start = time.perf_counter()
    finding, rows = Finding(variant.name, "ok", dtype=variant.dtype), 0
    for rows_here in strips(n):
        part = judge_strip(variant, case, held, out, rows_here)
        rows += rows_here[1] - rows_here[0]
        finding.worst = max(finding.worst, part.worst)
        if part.status != "ok":
            finding = part
            break
    seconds["judge"] = time.perf_counter() - start
    judged = f"query rows judged {rows} of {n}"
    if grads and finding.status == "ok":
        start = time.perf_counter()
        finding = _judge_gradients(variant, case, held, out, finding)
        seconds["gradients"] = time.perf_counter() - start
        judged += ", " + (finding.grads_skipped or "dQ, dK, dV on every row")
    verdict = "ok" if finding.status == "ok" else f"{finding.status.upper()} {finding.detail}"
    timing = f"target {seconds['target']:.1f} s, reference and bound {seconds['judge']:.1f} s"
    if "gradients" in seconds:
        timing += f", gradients' reference and bound {seconds['gradients']:.1f} s"
    say(f"{head}: {verdict} ({judged}; worst {finding.worst:.3g} of allowed; {timing})")
    return LongCase(n, path, variant.name, finding, rows, seconds)


def _judge_gradients(
    variant: Variant, case: Case, held: dict[str, np.ndarray], out: dict[str, Any], forward
) -> Finding:
    """``Y, dQ, dK, dV`` of the whole case against the float64 reference, within the claim's
    bound (both one pass over the rows, a strip at a time); ``forward``: the strips'
    finding, returned with the reason where the reference cannot serve."""
    ref = fast(case, held)
    if ref is None:
        forward.grads_skipped = "gradients not judged: the float64 reference cannot serve"
        return forward
    allowed = bounds(variant, ref)
    if not serves(ref, allowed.bound):
        forward.grads_skipped = (
            "gradients not judged: the float64 reference's radius is not below 2^-20 of the "
            "allowed error (only arb could certify them, and arb at this length takes days)"
        )
        return forward
    finding = judge(variant, case, out, ref, allowed)
    finding.reference = ref.served
    finding.worst = max(finding.worst, forward.worst)
    return finding
