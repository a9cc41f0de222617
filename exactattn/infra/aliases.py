"""The module names users write, kept importable after the modules moved into layer folders.

``import exactattn.masks`` (or ``from exactattn.bounds import bounds``) gives the module
itself, :mod:`exactattn.core.masks`: a meta-path finder answers each name of
:data:`PUBLIC_MODULES` with the real module object, not a copy, so ``exactattn.masks is
exactattn.core.masks`` and a monkeypatch through either name is seen through both. The real
module is imported on first use only (``exactattn.flash_attn`` needs torch).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

PUBLIC_MODULES = {  # the name README and docs/ tell users to write -> the module's own name
    "exactattn.masks": "exactattn.core.masks",
    "exactattn.ops": "exactattn.core.ops",
    "exactattn.dropout": "exactattn.core.dropout",
    "exactattn.bounds": "exactattn.error.bounds",
    "exactattn.expected_bounds": "exactattn.error.expected_bounds",
    "exactattn.certified": "exactattn.oracle.certified",
    "exactattn.fast_reference": "exactattn.oracle.float64",
    "exactattn.flash_attn": "exactattn.layouts.flash_attn",
}


class AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads each public name as the module it names (see the module docstring)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in PUBLIC_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(PUBLIC_MODULES[spec.name])
        self._specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system stamped the alias's spec on the module: give it back its own
        module.__spec__ = self._specs[module.__name__]


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (after the path finders: a real module of the
    same name would win)."""
    if not any(isinstance(finder, AliasFinder) for finder in sys.meta_path):
        sys.meta_path.append(AliasFinder())
