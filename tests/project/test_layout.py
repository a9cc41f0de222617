"""The Layout block of docs/architecture.md is the tree: it lists every top-level folder, every
module of ``exactattn/`` and every package of ``exactattn/`` and ``proofs/`` with the modules
it holds, and every file it names is there."""

from __future__ import annotations

import re
from pathlib import Path

from tests.project.tracked import tracked

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
MODULE = re.compile(r"(?<![\w./-])((?:[\w-]+/)*\w+\.py)\b")  # algorithm.py, tests/optional.py


def _layout() -> dict[str, str]:
    """Entry -> its text. An entry's line starts at an even column, two deeper than its
    parent's (top-level lines in column 0, ``exactattn/``'s and ``proofs/``'s in column 2, one
    level further in column 4, ...); its description continues on deeper-indented lines."""
    section = DOC.read_text().split("## Layout", 1)[1]
    block = re.search(r"```\n(.+?)\n```", section, flags=re.S).group(1)
    entries: dict[str, str] = {}
    parents: list[str] = []  # the entry at each depth, outermost first
    key = ""
    for line in block.splitlines():
        depth = len(line) - len(line.lstrip())
        if depth % 2 == 0 and depth // 2 <= len(parents):
            level = depth // 2
            parent = parents[level - 1] if level else ""
            key = parent + line.split()[0]
            parents[level:] = [key]
            entries[key] = line.strip()
        else:
            entries[key] += " " + line.strip()
    return entries


def _folder(key: str) -> str:
    """The folder an entry's bare module names live in: the entry itself for a folder, else
    the folder holding it (``""``, the checkout's root, for a top-level file)."""
    return key if key.endswith("/") else key.rpartition("/")[0] + ("/" if "/" in key else "")


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


def _packages() -> set[str]:
    """Every package of ``exactattn/`` and ``proofs/`` (``exactattn/core/``, ...), as folders."""
    return {
        path.removesuffix("__init__.py")
        for path in tracked()
        if path.startswith(("exactattn/", "proofs/")) and path.endswith("/__init__.py")
    }


def test_layout_lists_every_top_level_folder_and_library_module():
    entries = _layout()
    folders = _folders()
    library = {f"exactattn/{name}" for name in _names("exactattn")}
    missing = sorted((folders | library) - set(entries))
    assert not missing, f"docs/architecture.md's Layout block does not list {missing}"
    tests = set(re.findall(r"[\w.]+/?", entries["tests/"]))
    missing = sorted(_names("tests") - {"__init__.py"} - tests)
    assert not missing, f"the Layout line for tests/ does not name {missing}"


def unlisted_packages(entries: dict[str, str]) -> list[str]:
    """The packages of ``exactattn/`` and ``proofs/`` with no line of their own."""
    return sorted(_packages() - set(entries))


def unnamed_modules(entries: dict[str, str]) -> list[str]:
    """The modules of a listed package that neither have a line nor are named on the
    package's line."""
    out = []
    for package in sorted(_packages() & set(entries)):
        named = set(MODULE.findall(entries[package]))
        for name in sorted(_names(package.rstrip("/"))):
            if name != "__init__.py" and package + name not in entries and name not in named:
                out.append(package + name)
    return out


def absent_files(entries: dict[str, str]) -> list[str]:
    """The modules the block names that are not there: a bare ``name.py`` in the folder of
    its line, a path with a folder from the checkout's root."""
    files = set(tracked())
    out = []
    for key, text in entries.items():
        for name in MODULE.findall(text):
            path = name if "/" in name else _folder(key) + name
            if path not in files:
                out.append(f"{path} (line {key})")
    return out


def test_every_package_has_its_line():
    missing = unlisted_packages(_layout())
    assert not missing, f"docs/architecture.md's Layout block has no line for {missing}"


def test_every_module_is_named_on_its_package_line():
    missing = unnamed_modules(_layout())
    assert not missing, f"the Layout line of their package does not name {missing}"


def test_every_module_the_layout_names_exists():
    gone = absent_files(_layout())
    assert not gone, f"docs/architecture.md's Layout block names files that are not there: {gone}"


def test_the_layout_checks_can_fail(tmp_path, monkeypatch):
    """A stale block is caught: a module named in the wrong folder, a package's modules left
    unnamed, a package without its line (names built in pieces: this file names none)."""
    py = ".py"
    doc = tmp_path / "architecture.md"
    doc.write_text(
        "## Layout\n\n```\nexactattn/     the library\n"
        f"  core/        the algorithm (algorithm{py}), the known bugs (known{py})\n"
        "  oracle/      the certified references\n"
        f"    gone{py}   a module of a folder that is no package\n```\n"
    )
    monkeypatch.setattr(__import__(__name__, fromlist=["DOC"]), "DOC", doc)
    entries = _layout()
    assert set(entries) == {
        "exactattn/",
        "exactattn/core/",
        "exactattn/oracle/",
        f"exactattn/oracle/gone{py}",
    }
    assert absent_files(entries) == [
        f"exactattn/core/known{py} (line exactattn/core/)",  # it lives in exactattn/testing/
        f"exactattn/oracle/gone{py} (line exactattn/oracle/gone{py})",
    ]
    assert f"exactattn/core/masks{py}" in unnamed_modules(entries)
    assert f"exactattn/core/algorithm{py}" not in unnamed_modules(entries)
    assert f"exactattn/oracle/certified{py}" in unnamed_modules(entries)
    assert "exactattn/testing/" in unlisted_packages(entries)
    assert "proofs/engine/" in unlisted_packages(entries)
