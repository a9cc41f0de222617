"""Grid points of a preset: a preset is a grid over case fields.

A :class:`Point` is one run (a configuration and a block size) on a :class:`Problem`, the
case knobs its reference is shared by; :meth:`Problem.case` turns the knobs into the one
case model's :class:`~exactattn.cases.Case` (inputs from :mod:`exactattn.cases.inputs`,
mask and score modification as specs written from their definitions), which the
reference, every run and the bound read: the sweep describes a problem once, as check and
difftest do.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from ..cases import Case, spec
from ..cases.inputs import make_inputs
from .presets import DEFAULTS, SCORES

MASKS = ("none", "causal", "window")

KNOBS = (
    "config", "n", "d", "block", "dist", "scale", "mask", "score", "seed", "grads", "splits",
    "merge", "sink",
)  # fmt: skip
OLDER = {"score": "none", "splits": 1, "merge": "fp32", "sink": "none"}  # later knobs' defaults
MERGES = ("fp32", "input")  # the arithmetic split-KV partials are merged in


@dataclass(frozen=True, order=True)
class Problem:
    """Inputs and exact answer: shared by every configuration and block size."""

    n: int
    d: int
    dist: str
    scale: float
    mask: str
    seed: int
    grads: bool
    score: str = "none"  # a score modification (see mask_spec, score_terms)

    @property
    def c(self) -> float:
        """The score scale ``c = scale / sqrt(d)`` as a float64 (exact input of every run)."""
        return float(self.scale) / math.sqrt(self.d)

    def case(self, block: int | None = None) -> Case:
        """The case these knobs describe (``block``: the key-block size of a run; ``n``
        without one): float64 ``q, k, v, g`` of shape ``(n, d)``, the explicit scale ``c``,
        the mask and score modification as specs."""
        score, bias, softcap = score_terms(self.score, self.n, self.seed)
        return Case(
            **make_inputs(self.dist, self.n, self.d, self.seed),
            block_size=self.n if block is None else block,
            scale=self.c,
            mask=mask_spec(self.mask, self.n),
            bias=bias,
            softcap=softcap,
            score=score,
        )


def mask_spec(name: str, n: int) -> dict[str, Any]:
    """``none``, ``causal`` or ``window`` (each query sees the ``max(1, n//8)`` keys before
    it) as a mask spec of :mod:`exactattn.cases.spec`."""
    if name == "none":
        return {"kind": "none"}
    if name == "causal":
        return {"kind": "causal"}
    if name == "window":
        return {"kind": "window", "left": max(1, n // 8), "right": 0}
    raise ValueError(f"mask must be one of {MASKS}; got {name!r}")


def score_terms(name: str, n: int, seed: int) -> tuple[dict[str, Any], Any, float | None]:
    """The score spec, bias ``B`` (float64, ``(n, n)``) and soft-cap of a score
    modification, written from its definition (:mod:`exactattn.cases.spec`, not
    :mod:`exactattn.core.scores`):

    * ``alibi``: ``B_ij = −|i − j|/8`` (one head's slope, 2^-3: exact in every format);
    * ``t5``: a N(0, 1) table of 32 buckets indexed by T5's bidirectional bucket of
      ``j − i`` (max distance 128);
    * ``bias-inf``: N(0, 1) entries, a tenth of the off-diagonal ones ``−∞`` (the diagonal
      stays finite, so no row of a causal problem ends empty);
    * ``softcap``: no bias, scores capped as ``5·tanh(s/5)``.
    """
    if name not in SCORES:
        raise ValueError(f"score must be one of {SCORES}; got {name!r}")
    rng = np.random.default_rng([seed, n, SCORES.index(name)])
    none = {"kind": "none"}
    if name == "alibi":
        score = {"kind": "alibi", "form": "abs", "slopes": [2.0**-3]}
        return score, spec.bias(score, (), n, n), None
    if name == "t5":
        score = {"kind": "t5", "table": rng.standard_normal((1, 32)).tolist(), "max_distance": 128}
        return score, spec.bias(score, (), n, n), None
    if name == "bias-inf":
        values = rng.standard_normal((n, n))
        values[(rng.random((n, n)) < 0.1) & ~np.eye(n, dtype=bool)] = -np.inf
        return {"kind": "dense"}, values, None
    if name == "softcap":
        return none, None, 5.0
    return none, None, None


@dataclass(frozen=True, order=True)
class Point:
    """One run: a configuration and block size on a problem."""

    config: str
    n: int
    d: int
    block: int
    dist: str
    scale: float
    mask: str
    seed: int
    grads: bool
    score: str = "none"  # a score modification (exactattn.precision.grid.score_terms)
    splits: int = 1  # split-KV: the keys in this many equal parts, merged by their lse
    merge: str = "fp32"  # the merge's arithmetic: float32, or the input format ("input")
    sink: str = "none"  # a sink's offset δ from the smallest lse (cases.interface), or none

    @property
    def problem(self) -> Problem:
        return Problem(
            self.n, self.d, self.dist, self.scale, self.mask, self.seed, self.grads, self.score
        )

    def case(self) -> Case:
        """The case of this run: its problem's, at the point's block size (with its split
        boundaries when ``splits > 1``)."""
        case = self.problem.case(self.block)
        if self.splits > 1:
            case.splits = np.linspace(0, self.n, self.splits + 1).round().astype(int).tolist()
        if self.sink != "none":
            case.sinks = [float(self.sink)]
        return case

    @property
    def key(self) -> str:
        """A stable text key (the CSV's knob columns joined), used for resume."""
        return key_of(asdict(self))


def key_of(row: dict[str, Any]) -> str:
    parts = []
    for name in KNOBS:
        value = row.get(name)
        if name in OLDER and (value is None or value == "" or value != value):  # NaN
            value = OLDER[name]  # a knob older CSVs lack
        if name == "sink" and value != "none":
            value = repr(float(value))
        if name == "scale":
            value = repr(float(value))
        elif name == "grads":
            value = str(value).lower() in ("true", "1")
        elif name in ("n", "d", "block", "seed", "splits"):
            value = int(value)
        parts.append(f"{name}={value}")
    return "|".join(parts)


def expand(preset: dict[str, Any]) -> list[Point]:
    """Every point of the preset's grids (duplicates across grids removed, order kept)."""
    names = [f.name for f in fields(Point)]
    seen: dict[Point, None] = {}
    for grid in preset["grids"]:
        unknown = set(grid) - set(names)
        if unknown:
            raise ValueError(f"grid has unknown knobs {sorted(unknown)}; knobs are {names}")
        values = {**DEFAULTS, **grid, "seed": preset.get("seeds", [0])}
        missing = set(names) - set(values)
        if missing:
            raise ValueError(f"grid {grid} lacks knobs {sorted(missing)}")
        for combo in itertools.product(*(values[name] for name in names)):
            point = Point(**dict(zip(names, combo)))
            seen.setdefault(point, None)
    return list(seen)
