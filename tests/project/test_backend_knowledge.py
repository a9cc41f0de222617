"""What a number system is lives in ``exactattn/backends/``: no other module of ``exactattn/``
or ``proofs/`` tests a context's class (``isinstance(ctx, SympyContext)``,
``type(ctx).__name__ == "EmulatedContext"``); it asks the context (a protocol method or
attribute) instead. Subclassing a context, as the proofs' contexts do, is not a test."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ROOT / "exactattn" / "backends"
FOLDERS = (ROOT / "exactattn", ROOT / "proofs")
# Arith.of_context reads mpmath's precision and the emulated formats from the class: the
# error model's room, left to its own change (the bound of a context it does not know raises)
KNOWN = ["exactattn/error/bounds.py EmulatedContext", "exactattn/error/bounds.py MpmathContext"]


def context_classes(backends: Path = BACKENDS) -> set[str]:
    """The names of the context classes the backends define."""
    return {
        node.name
        for path in backends.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name.endswith("Context")
    }


def _named(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def class_tests(folders=FOLDERS, backends: Path = BACKENDS, root: Path = ROOT) -> list[str]:
    """``path class`` for each ``isinstance`` / ``issubclass`` against a context class and
    each comparison of ``type(x).__name__`` with a context's name, outside ``backends``."""
    classes = context_classes(backends)
    out = []
    for folder in folders:
        for path in folder.rglob("*.py"):
            if backends in path.parents or "__pycache__" in path.parts:
                continue
            name = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                named: list[str | None] = []
                if isinstance(node, ast.Call) and _named(node.func) in ("isinstance", "issubclass"):
                    kinds = node.args[1:2]
                    if kinds and isinstance(kinds[0], ast.Tuple):
                        kinds = kinds[0].elts
                    named = [_named(kind) for kind in kinds]
                if isinstance(node, ast.Compare) and _named(node.left) == "__name__":
                    named = [c.value for c in node.comparators if isinstance(c, ast.Constant)]
                out += [f"{name} {cls}" for cls in named if cls in classes]
    return sorted(out)


def test_no_module_outside_the_backends_tests_a_contexts_class():
    assert class_tests() == KNOWN


def test_the_check_sees_an_isinstance_and_a_class_name(tmp_path):
    backends = tmp_path / "exactattn" / "backends"
    backends.mkdir(parents=True)
    (backends / "x_backend.py").write_text("class XContext:\n    pass\n")
    core = tmp_path / "exactattn" / "core"
    core.mkdir()
    (core / "ops.py").write_text(
        "def f(ctx):\n"
        "    if isinstance(ctx, (int, backends.XContext)):\n"
        "        return 1\n"
        "    return type(ctx).__name__ == 'XContext'\n"
        "class Sub(XContext):\n"
        "    pass\n"
    )
    (backends / "own.py").write_text("def g(ctx):\n    return isinstance(ctx, XContext)\n")
    found = class_tests((tmp_path / "exactattn",), backends, tmp_path)
    assert found == ["exactattn/core/ops.py XContext"] * 2
