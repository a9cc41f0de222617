"""No module of exactattn (nor of its proofs) imports from a layer above its own, and no
imports form a cycle.

The layers, lowest first, are the table of ``docs/layers.md``: a module
imports only from its own layer or below. Imports are read from the source (every
``import`` and ``from … import`` statement, also those inside functions), so a lazy import
breaks the order as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "exactattn"
PROOFS = ROOT / "proofs"  # shipped as exactattn.proofs
DOC = ROOT / "docs" / "layers.md"


def layers() -> list[list[str]]:
    """The table of docs/layers.md: one row per layer, lowest first; each cell names modules
    or packages of exactattn (``backends/`` is the package and everything in it)."""
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            rows.append([name.strip(" `") for name in cells[2].split(",") if name.strip()])
    return rows


def module_names() -> dict[str, Path]:
    """Every module of ``exactattn/`` and ``proofs/`` by its dotted name (``proofs/x.py`` is
    ``exactattn.proofs.x``)."""
    out = {}
    for root, prefix in ((PACKAGE, ["exactattn"]), (PROOFS, ["exactattn", "proofs"])):
        for path in root.rglob("*.py"):
            parts = prefix + list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The exactattn modules ``name`` imports (``from PKG import x`` counts ``PKG.x`` when it
    is a module, else ``PKG``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                if f"{source}.{alias.name}" in known:
                    found.add(f"{source}.{alias.name}")
                elif source in known:
                    found.add(source)
    return found - {name}


def graph() -> dict[str, set[str]]:
    names = module_names()
    return {name: imports(name, path, set(names)) for name, path in names.items()}


def layer_of(module: str, table: list[list[str]]) -> int:
    """The layer of a module: the row naming it, its innermost package (``x/``, ``x/y/``)
    or, for the package face ``exactattn`` itself, the public API's row."""
    relative = module.removeprefix("exactattn").lstrip(".") or "__init__"
    parts = relative.split(".")
    for depth in range(len(parts), 0, -1):
        key = ".".join(parts[:depth])
        folder = "/".join(parts[:depth]) + "/"
        for index, row in enumerate(table):
            if key in row or folder in row or f"{key}.py" in row:
                return index
    raise AssertionError(f"{module} is in no layer of docs/layers.md: add it to the table")


def upward_imports() -> list[str]:
    table = layers()
    return sorted(
        f"{module} (layer {layer_of(module, table)}) imports {target} "
        f"(layer {layer_of(target, table)})"
        for module, targets in graph().items()
        for target in targets
        if layer_of(target, table) > layer_of(module, table)
    )


def cycles() -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm)."""
    edges, index, low, stack, on, out = graph(), {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_layer_table_names_every_top_level_module_and_package():
    table = layers()
    assert len(table) >= 5
    for module in module_names():
        layer_of(module, table)  # raises naming the module that has no layer


def test_no_module_imports_from_a_layer_above_its_own():
    assert upward_imports() == []


def test_no_import_cycles_between_modules():
    # a package's face importing its own submodules is not a cycle of layers, but two
    # modules importing each other (at the top or lazily) is
    faces = {name for name, path in module_names().items() if path.name == "__init__.py"}
    found = [c for c in cycles() if not any(m in faces for m in c)]
    assert found == []


def test_the_checker_sees_an_upward_import_and_a_cycle(tmp_path, monkeypatch):
    """The checks above can fail: a core module that imports the case model, and two modules
    that import each other, are both reported."""
    package = tmp_path / "exactattn"
    (package / "cases").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "masks.py").write_text("from .cases import spec\n")
    (package / "cases" / "__init__.py").write_text("")
    (package / "cases" / "spec.py").write_text("from . import case\n")
    (package / "cases" / "case.py").write_text("def f():\n    from . import spec\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "layers.md").write_text(
        "| 0 | core | `masks` |\n| 1 | api | `__init__` |\n| 2 | cases | `cases/` |\n"
    )
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", package)
    monkeypatch.setattr(__import__(__name__, fromlist=["PROOFS"]), "PROOFS", tmp_path / "proofs")
    monkeypatch.setattr(
        __import__(__name__, fromlist=["DOC"]), "DOC", tmp_path / "docs" / "layers.md"
    )
    assert upward_imports() == ["exactattn.masks (layer 0) imports exactattn.cases.spec (layer 2)"]
    assert cycles() == [["exactattn.cases.case", "exactattn.cases.spec"]]
