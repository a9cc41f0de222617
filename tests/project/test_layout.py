"""README's Layout section names every top-level module and folder of the checkout."""

from __future__ import annotations

import re
from pathlib import Path

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


def _names(folder: Path) -> set[str]:
    """Modules and packages directly in ``folder`` (``name.py`` and ``name/``)."""
    modules = {p.name for p in folder.glob("*.py")}
    packages = {f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").exists()}
    return modules | packages


def test_layout_lists_every_top_level_folder_and_library_module():
    entries = _layout()
    folders = {f"{p.name}/" for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    folders -= {"build/", "dist/", "sweep-results/", "gpu-results/"}  # outputs, ignored by git
    folders = {f for f in folders if not f.endswith(".egg-info/")}
    library = {f"exactattn/{name}" for name in _names(ROOT / "exactattn")}
    missing = sorted((folders | library) - set(entries))
    assert not missing, f"README's Layout section does not list {missing}"
    tests = set(re.findall(r"[\w.]+/?", entries["tests/"]))
    missing = sorted(_names(ROOT / "tests") - {"__init__.py"} - tests)
    assert not missing, f"README's Layout line for tests/ does not name {missing}"
