"""``module:function`` → the function: the one loader of a user's callable.

``exactattn check`` (a target, ``--mask-mod``, ``--score-mod``), ``exactattn prove
--mask-mod`` and the replay of a case that names a user's program all read a callable from
a reference ``package.module:function`` (``function`` may be dotted: ``Class.method``) or
``path/to/file.py:function``. A module is also looked up in the current directory (last,
so it shadows no installed package): a console script does not put the working directory
on ``sys.path`` (``python -m`` does), and a user's ``doc_prog.py`` beside them is what
``doc_prog:document_mask`` means.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any


class LoadError(ValueError):
    """A reference that names no callable; the text says which part failed and why."""


def load_callable(reference: str, what: str = "the callable") -> Any:
    """The callable named by ``reference`` (see the module docstring); :class:`LoadError`
    naming ``what`` (e.g. ``--score-mod``) when the module does not import or has no such
    callable."""
    where, sep, attribute = str(reference).rpartition(":")
    if not sep or not where or not attribute:
        raise LoadError(f"{what} must be module:function or file.py:function; got {reference!r}")
    try:
        module = _module(where)
    except Exception as error:
        raise LoadError(
            f"{what}: cannot import {where!r} ({reference!r}): {type(error).__name__}: {error}"
        ) from error
    fn: Any = module
    for part in attribute.split("."):
        if not hasattr(fn, part):
            raise LoadError(f"{what}: {where!r} has no attribute {attribute!r} ({reference!r})")
        fn = getattr(fn, part)
    if not callable(fn):
        raise LoadError(f"{what}: {reference!r} is a {type(fn).__name__}, not a function")
    return fn


def _module(where: str) -> Any:
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {path}")
        name = f"_exactattn_user_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    return importlib.import_module(where)
