"""What an obligation covers, and the certificate's coverage matrix.

Each forward / reverse obligation declares the parameters that change what runs — the
mask kind and its alignment, the score modification (bias, soft-cap), ``n_q ≠ n_k``, batch
broadcasting or grouped-query heads, ``row_block`` splitting, dropout — and the largest
``n`` it reaches. The matrix has one row per (mask kind [+ score modification], alignment)
and one column per parameter; a cell lists the largest size at which a PROVED obligation
exercised that parameter with that mask, forward and reverse.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

MASK_KINDS = ("none", "every table", "causal", "window", "padding", "and", "or")
SCORE_MODS = ("", "bias", "softcap", "softcap+bias")
ALIGNMENTS = ("top-left", "bottom-right")
FEATURES = ("plain", "n_q ≠ n_k", "batch", "GQA", "row_block", "dropout", "empty rows")


@dataclass(frozen=True)
class Coverage:
    """One obligation's parameters (``alignment`` is "" for masks without one)."""

    direction: str  # "forward" or "reverse"
    mask: str = "none"
    alignment: str = ""
    n: int = 0
    cross: bool = False
    batch: str = ""  # "", "batch" or "GQA"
    row_block: bool = False
    dropout: bool = False
    empty_rows: bool = False
    score: str = ""  # a SCORE_MODS entry

    @property
    def row(self) -> str:
        """The matrix row's name: the mask kind, with the score modification if any."""
        return f"{self.mask} + {self.score}" if self.score else self.mask

    def features(self) -> list[str]:
        out = [
            name
            for name, on in (
                ("n_q ≠ n_k", self.cross),
                ("batch", self.batch == "batch"),
                ("GQA", self.batch == "GQA"),
                ("row_block", self.row_block),
                ("dropout", self.dropout),
                ("empty rows", self.empty_rows),
            )
            if on
        ]
        return out or ["plain"]


def matrix(covered: Iterable[Coverage], all_n: Callable[[str], str]) -> list[str]:
    """Markdown lines: the coverage matrix of the PROVED obligations' coverages."""
    best: dict[tuple[str, str, str, str], int] = {}
    rows: list[tuple[str, str]] = []
    for cov in covered:
        key_row = (cov.row, cov.alignment)
        if key_row not in rows:
            rows.append(key_row)
        for feature in cov.features():
            key = (*key_row, feature, cov.direction)
            best[key] = max(best.get(key, 0), cov.n)
    order = {kind: k for k, kind in enumerate(MASK_KINDS)}
    rows.sort(key=lambda r: (order.get(_kind(r[0]), len(order)), r[0], r[1]))
    lines = [
        "| mask | alignment | " + " | ".join(FEATURES) + " | for all n |",
        "| --- | --- | " + " | ".join("---" for _ in FEATURES) + " | --- |",
    ]
    for mask, alignment in rows:
        cells = []
        for feature in FEATURES:
            parts = [
                f"{d[0].upper()}≤{best[(mask, alignment, feature, d)]}"
                for d in ("forward", "reverse")
                if (mask, alignment, feature, d) in best
            ]
            cells.append(" ".join(parts) or "—")
        lines.append(
            f"| {mask} | {alignment or '—'} | " + " | ".join(cells) + f" | {all_n(mask)} |"
        )
    return lines


def _kind(row: str) -> str:
    return row.split(" + ")[0]
