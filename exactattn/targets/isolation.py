"""A foreign target in a child process: a native crash or a hang fails its own case alone.

A target whose ``Options.isolated`` is set (a C++ library: ONNX Runtime, OpenVINO, XLA) runs
each call in a child process (:class:`exactattn.infra.executors.Isolated`), one per target,
dtype and device, rebuilt there from the target's name, convention, claim and capabilities.
A child that dies (a segfault, an abort) or gives no answer within ``Options.case_timeout``
seconds is replaced, and the call raises :class:`~.conventions.TargetError` naming the
signal or the timeout: that case fails, and the run goes on. A refusal of the target
(:meth:`~exactattn.targets.Target.refuses`) travels back as a :class:`Refused`.
"""

from __future__ import annotations

import functools
from typing import Any

from ..infra.executors import Isolated, WorkerDied
from .conventions import TargetError

_CHILDREN: dict[tuple[Any, ...], Isolated] = {}
_IN_CHILD = False  # set in the child: its variant runs in place


class Refused(NotImplementedError):
    """A target's refusal of an input, as it crosses from the child (its text names the
    library's exception and message)."""


def in_child() -> bool:
    return _IN_CHILD


def run(variant: Any, case: Any, held: dict, grads: bool) -> dict[str, Any]:
    """``variant.run(case, held, grads)`` in the variant's child process."""
    target = variant.target
    recipe = (target.name, target.convention, target.claim, target.caps)
    key = (*recipe[:1], variant.dtype, variant.device)
    child = _CHILDREN.setdefault(key, Isolated())
    try:
        return child.call(
            _run_here, recipe, variant.dtype, variant.device, case, held, grads,
            timeout=target.options.case_timeout,
        )  # fmt: skip
    except WorkerDied as error:
        raise TargetError(f"the target's process died: {error}") from None
    except TimeoutError as error:
        raise TargetError(f"the target hung: {error}") from None


def _run_here(recipe: tuple, dtype: str, device: str, case: Any, held: dict, grads: bool) -> Any:
    global _IN_CHILD
    _IN_CHILD = True
    variant = _variant(recipe, dtype, device)
    try:
        return variant.run(case, held, grads)
    except Exception as error:
        refused = variant.target.refuses(error)
        if refused is None:
            raise  # as it is (the worker sends a picklable stand-in if it is not)
        raise Refused(f"{type(error).__name__}: {refused}") from None


@functools.cache
def _variant(recipe: tuple, dtype: str, device: str) -> Any:
    from .resolve import get, registry
    from .variants import Variant

    name, convention, claim, caps = recipe
    if name in registry():
        return Variant(registry()[name], dtype, device)
    return Variant(get(name, convention=convention, claim=claim, supports=caps), dtype, device)
