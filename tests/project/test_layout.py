"""README's Layout section names every top-level module and folder of the checkout."""

from __future__ import annotations

import re
from pathlib import Path

from tests.project.tracked import tracked

ROOT = Path(__file__).resolve().parents[2]


def _layout() -> dict[str, str]:
    """Entry -> its text: top-level lines start in column 0, exactattn's modules in column 2,
    descriptions continue on deeper-indented lines."""
    section = (ROOT / "README.md").read_text().split("## Layout", 1)[1]
    block = re.search(r"```\n(.+?)\n```", section, flags=re.S).group(1)
    entries: dict[str, str] = {}
    parent, key = "", ""
    for line in block.splitlines():
        depth = len(line) - len(line.lstrip())
        if depth == 0:
            parent = key = line.split()[0]
        elif depth == 2:
            key = parent + line.split()[0]
        else:
            entries[key] += " " + line.strip()
            continue
        entries[key] = line.strip()
    return entries


def _names(folder: str) -> set[str]:
    """Tracked modules and packages directly in ``folder`` (``name.py`` and ``name/``; the
    top level with ``""``): a package is a folder that holds an ``__init__.py``."""
    prefix = f"{folder}/" if folder else ""
    names = set()
    for path in tracked():
        if not path.startswith(prefix):
            continue
        head, _, rest = path[len(prefix) :].partition("/")
        if not rest and head.endswith(".py"):
            names.add(head)
        elif rest == "__init__.py":
            names.add(f"{head}/")
    return names


def _folders() -> set[str]:
    """Tracked top-level folders (hidden ones aside)."""
    return {f"{p.split('/')[0]}/" for p in tracked() if "/" in p and not p.startswith(".")}


def test_layout_lists_every_top_level_folder_and_library_module():
    entries = _layout()
    folders = _folders()
    library = {f"exactattn/{name}" for name in _names("exactattn")}
    missing = sorted((folders | library) - set(entries))
    assert not missing, f"README's Layout section does not list {missing}"
    tests = set(re.findall(r"[\w.]+/?", entries["tests/"]))
    missing = sorted(_names("tests") - {"__init__.py"} - tests)
    assert not missing, f"README's Layout line for tests/ does not name {missing}"
