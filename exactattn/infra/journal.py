"""A run's results kept on disk as they arrive, so that an interrupted run resumes.

A journal is a JSON-lines file: the first line holds the run's settings, each further line
one task's result, ``{"key": ..., "note": ..., "value": ...}`` (``value`` pickled, base64;
``note`` a readable summary). Lines are flushed as they are written, so a killed run loses
at most the line it was writing (a torn last line is dropped on reading). With
``resume=True`` the results of a journal written under the same settings are kept
(:attr:`Journal.kept`) and the run appends the rest; a journal of other settings is a
ValueError that says which differ. The values are unpickled: read only journals you wrote.
"""

from __future__ import annotations

import base64
import hashlib
import json
import pickle
from pathlib import Path
from typing import Any


class Journal:
    """Append-only results of one run at ``path`` (see the module docstring)."""

    def __init__(self, path: str | Path, settings: dict[str, Any], resume: bool = False):
        self.path = Path(path)
        self.settings = json.loads(json.dumps(settings))  # as it reads back
        self.kept: dict[str, Any] = {}
        lines: list[str] = []
        if resume and self.path.exists():
            self.kept, lines = self._read()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w", encoding="utf-8") as fh:  # rewritten: drops a torn line
            fh.write(json.dumps({"settings": self.settings}) + "\n")
            fh.writelines(lines)
        self._fh = self.path.open("a", encoding="utf-8")

    def _read(self) -> tuple[dict[str, Any], list[str]]:
        text = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
        head = _parse(text[0]) if text else None
        if head is None or "settings" not in head:
            raise ValueError(f"{self.path} is not a journal of exactattn (no settings line)")
        if head["settings"] != self.settings:
            differ = sorted(
                k
                for k in {*head["settings"], *self.settings}
                if head["settings"].get(k) != self.settings.get(k)
            )
            raise ValueError(
                f"{self.path} was written by a run with other settings ({', '.join(differ)} "
                "differ); resume with the same settings, or use a new journal"
            )
        kept, lines = {}, []
        for line in text[1:]:
            record = _parse(line)
            if record is None or not {"key", "value"} <= set(record) or not line.endswith("\n"):
                continue  # a torn last line
            kept[record["key"]] = pickle.loads(base64.b64decode(record["value"]))
            lines.append(line)
        return kept, lines

    def add(self, key: str, value: Any, note: str = "") -> None:
        """Record one result (a later record of the same key replaces it on reading)."""
        data = base64.b64encode(pickle.dumps(value)).decode("ascii")
        self._fh.write(json.dumps({"key": key, "note": note, "value": data}) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def _parse(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def code_fingerprint(*roots: Path) -> str:
    """A hash of exactattn's sources (and those under ``roots``): results are kept for the
    code that reached them only."""
    digest = hashlib.sha256()
    for root in (Path(__file__).parent, *roots):
        for path in sorted(root.rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
