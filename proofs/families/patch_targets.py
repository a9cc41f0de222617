"""What the mutants patch and how: a patch target (``module:attr``,
``module:Class.method``), a function set as a method, and the library mutant both mutant
families share (``window_tile_kind``'s FULL one key too wide)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    """``module.attribute`` or ``module.Class.method``; alternatives cover a rename."""

    module: str
    path: tuple[str, ...]

    def __str__(self) -> str:
        return ".".join((self.module.removeprefix("exactattn."), *self.path))

    def resolve(self) -> tuple[Any, str, Any] | None:
        """``(owner, attribute, original)`` or None if it does not exist."""
        owner: Any = importlib.import_module(self.module)
        for name in self.path[:-1]:
            owner = getattr(owner, name, None)
            if owner is None:
                return None
        original = getattr(owner, self.path[-1], None)
        return None if original is None else (owner, self.path[-1], original)


def target_of(spec: str) -> Target:
    """The target ``module:attr`` or ``module:Class.method`` names."""
    module, _, rest = spec.partition(":")
    return Target(module, tuple(rest.split(".")))


def as_method(fn: Callable) -> Callable:
    """``fn`` as a method (a patched function stays unbound when set on a class)."""

    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)

    return method


def full_one_key_wider(original: Callable) -> Callable:
    """``window_tile_kind``: a tile called FULL one key too wide (it keeps EMPTY)."""
    from exactattn.core.masks import INT

    def broken(left, right, offset, r0, r1, a, e, ops=INT):
        empty, _ = original(left, right, offset, r0, r1, a, e, ops)
        return empty, original(left, right, offset, r0, r1, a, e - 1, ops)[1]

    return broken
