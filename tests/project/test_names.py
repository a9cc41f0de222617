"""One name, one meaning: no two modules of ``exactattn/`` and ``proofs/`` share a name, and
no module reaches into another's private names (shared code has its own public module)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = (ROOT / "exactattn", ROOT / "proofs")
FACES = {"__init__.py", "__main__.py"}


def _modules(folders=FOLDERS) -> list[Path]:
    return [p for folder in folders for p in folder.rglob("*.py") if "__pycache__" not in p.parts]


def duplicated_names(folders=FOLDERS) -> list[str]:
    counts = Counter(p.name for p in _modules(folders) if p.name not in FACES)
    return sorted(name for name, n in counts.items() if n > 1)


def private_reaches(folders=FOLDERS) -> list[str]:
    """``from m import _x`` and ``m._x`` (``m`` an imported module of the project) anywhere."""
    out = []
    for path in _modules(folders):
        tree = ast.parse(path.read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (
                node.level or (node.module or "").startswith("exactattn")
            ):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        out.append(f"{path.name}:{node.lineno} imports {alias.name}")
                    imported.add(alias.asname or alias.name)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in imported
            ):
                out.append(f"{path.name}:{node.lineno} reads {node.value.id}.{node.attr}")
    return sorted(out)


def test_no_two_modules_share_a_name():
    assert duplicated_names() == []


def test_no_module_imports_or_reads_another_modules_private_names():
    assert private_reaches() == []


def test_the_checks_see_a_shared_name_and_a_private_import(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "runner.py").write_text("from .helpers import _shared\n")
    (tmp_path / "b" / "runner.py").write_text("from . import tools\nx = tools._hidden\n")
    folders = (tmp_path / "a", tmp_path / "b")
    assert duplicated_names(folders) == ["runner.py"]
    assert private_reaches(folders) == [
        "runner.py:1 imports _shared",
        "runner.py:2 reads tools._hidden",
    ]
