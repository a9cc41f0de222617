"""A foreign target in a child process: a native crash or a hang fails its own case alone.

A target whose ``Options.isolated`` is set (a C++ library: ONNX Runtime, OpenVINO, XLA) runs
each call in a child process (:class:`exactattn.infra.executors.Isolated`), one per target,
dtype and device; there :meth:`~exactattn.targets.Variant.run` rebuilds the variant from the
target's name, convention, claim and capabilities (:func:`exactattn.targets.variants.
run_in_child`). A child that dies (a segfault, an abort) or gives no answer within
``Options.case_timeout`` seconds is replaced, and the call raises
:class:`~.conventions.TargetError` naming the signal or the timeout: that case fails, and
the run goes on. A refusal of the target (:meth:`~exactattn.targets.Target.refuses`)
travels back as a :class:`Refused`.
"""

from __future__ import annotations

from collections.abc import Callable
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


def enter_child() -> None:
    global _IN_CHILD
    _IN_CHILD = True


def run(key: tuple[Any, ...], fn: Callable[..., Any], *args: Any, timeout: float) -> Any:
    """``fn(*args)`` in the child process of ``key`` (target name, dtype, device)."""
    child = _CHILDREN.setdefault(key, Isolated())
    try:
        return child.call(fn, *args, timeout=timeout)
    except WorkerDied as error:
        raise TargetError(f"the target's process died: {error}") from None
    except TimeoutError as error:
        raise TargetError(f"the target hung: {error}") from None
