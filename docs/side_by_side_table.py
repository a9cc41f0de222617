"""The side-by-side table (``docs/check.md``) from the measurement's JSON lines::

    python docs/side_by_side_table.py exactattn.jsonl peers_a.jsonl peers_b.jsonl

A correct twin's cell reads "passed" or "FALSE ALARM"; a bug's "caught" or "missed";
"n/a" where the peer's test file has no such interface, "–" where it was not measured.
"""

from __future__ import annotations

import json
import sys

from side_by_side_rows import ROWS

COLUMNS = ("exactattn", "flash-attn", "pytorch", "flex")


def cell(row, column, record) -> str:
    """The table's word for ``record`` (None: not measured). Merges and sinks have no grid
    in the three peers' files, nor varlen / kvcache in PyTorch's and Flex's."""
    dense = row.kind.startswith("dense")
    if record is None and column != "exactattn" and not dense:
        covered = column == "flash-attn" and row.kind in ("varlen", "kvcache")
        return "–" if covered else "n/a"
    if record is None:
        return "–"
    verdict = record["verdict"]
    if verdict == "n/a":
        return "n/a"
    if row.correct:
        return "FALSE ALARM" if verdict == "caught" else "passed"
    return verdict + (f" ({record['failed']}/{record['run']})" if "run" in record else "")


def main(paths: list[str]) -> None:
    records = {}
    for path in paths:
        with open(path) as lines:
            for line in lines:
                r = json.loads(line)
                records[r["row"], r["column"]] = r
    print("| kernel | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    caught = dict.fromkeys(COLUMNS, 0)
    for row in ROWS:
        cells = [cell(row, c, records.get((row.name, c))) for c in COLUMNS]
        for c, text in zip(COLUMNS, cells):
            caught[c] += (not row.correct) and text.startswith("caught")
        print(f"| {row.name} | " + " | ".join(cells) + " |")
    bugs = sum(not r.correct for r in ROWS)
    print(
        "| **caught of " + str(bugs) + "** | " + " | ".join(str(caught[c]) for c in COLUMNS) + " |"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
