"""Grid points of a preset: the knobs of one run, and the problem (reference) they share."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, fields
from typing import Any

from .presets import DEFAULTS

KNOBS = ("config", "n", "d", "block", "dist", "scale", "mask", "score", "seed", "grads")


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
    score: str = "none"  # a score modification (exactattn.precision.tasks.score_terms)


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
    score: str = "none"  # a score modification (exactattn.precision.tasks.score_terms)

    @property
    def problem(self) -> Problem:
        return Problem(
            self.n, self.d, self.dist, self.scale, self.mask, self.seed, self.grads, self.score
        )

    @property
    def key(self) -> str:
        """A stable text key (the CSV's knob columns joined), used for resume."""
        return key_of(asdict(self))


def key_of(row: dict[str, Any]) -> str:
    parts = []
    for name in KNOBS:
        value = (row.get(name) or "none") if name == "score" else row[name]  # older CSVs: none
        if name == "scale":
            value = repr(float(value))
        elif name == "grads":
            value = str(value).lower() in ("true", "1")
        elif name in ("n", "d", "block", "seed"):
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
