"""The registry's entries by name: exactattn's own, foreign ones, ``mpN``/``emuN``, a user's.

:func:`get` resolves a name (a registered entry, ``mpN``, ``emuN-rn|rz``, or a user's
``package.module:function`` / ``path/to/file.py:function``); :func:`from_callable` makes a
target of any callable; :func:`unavailable` says why a target cannot run here.
"""

from __future__ import annotations

import functools
from typing import Any

from ..infra import loading
from . import (
    builtin,
    flashinfer_targets,
    foreign,
    jax_attention,
    onnx_attention,
    openvino_paged,
    openvino_sdpa,
    ort_kvcache,
    sageattention_target,
)
from .conventions import USER_CONVENTIONS
from .interface_table import FORWARD_ONLY
from .interface_table import NAMES as INTERFACE_CONVENTIONS
from .signature import keywords_taken, narrowed
from .target import Capabilities, Claim, Options, Target


class UnknownTarget(ValueError):
    """A target name that is neither registered nor a loadable ``module:function``."""


@functools.cache
def registry() -> dict[str, Target]:
    """Every registered target by name (exactattn's own first, then foreign ones)."""
    zoo = [
        *onnx_attention.entries(),
        *ort_kvcache.entries(),
        *openvino_sdpa.entries(),
        *openvino_paged.entries(),
        *jax_attention.entries(),
        *flashinfer_targets.entries(),
        *sageattention_target.entries(),
    ]
    return {t.name: t for t in [*builtin.entries(), *foreign.entries(), *zoo]}


def names() -> list[str]:
    return list(registry())


def get(
    name: str,
    *,
    convention: str | None = None,
    claim: Claim | None = None,
    supports: Capabilities | None = None,
) -> Target:
    """The target called ``name``: a registered name, ``mpN``, or a user's callable given as
    ``package.module:function`` / ``path/to/file.py:function`` (``convention`` default
    ``sdpa``, ``claim`` default: the input dtype throughout, block size unstated)."""
    if name in registry() and convention is None and claim is None and supports is None:
        return registry()[name]
    if builtin.MP.fullmatch(name) or builtin.EMU.fullmatch(name):
        return builtin.config_target(name)
    if ":" in name:
        return user_target(name, convention or "sdpa", claim or Claim(), supports)
    raise UnknownTarget(
        f"unknown target {name!r}; available: {', '.join(names())}, mpN (N >= 2), "
        "emuN-rn / emuN-rz (2 <= N <= 26; -fa2, -scalar), "
        "or your own as package.module:function or path/to/file.py:function"
    )


def user_target(
    spec: str, convention: str, claim: Claim, supports: Capabilities | None = None
) -> Target:
    """A user's function as a target; its module is imported now (errors name the cause)."""
    allowed = (*USER_CONVENTIONS, *INTERFACE_CONVENTIONS)
    if convention not in allowed:
        raise ValueError(f"--convention must be one of {allowed}; got {convention!r}")
    fn = load_callable(spec)
    return from_callable(fn, convention=convention, claim=claim, supports=supports, name=spec)


def from_callable(
    fn: Any,
    *,
    convention: str = "sdpa",
    claim: Claim | None = None,
    supports: Capabilities | None = None,
    name: str | None = None,
) -> Target:
    """A callable as a target (``exactattn.testing.assert_attention_close`` uses this); its
    signature narrows what it is given (:func:`.signature.narrowed`: no ``enable_gqa``, no
    ``dropout_p``, ...)."""
    if not callable(fn):
        raise TypeError(f"the target must be callable; got {type(fn).__name__}")
    takes = keywords_taken(fn)
    caps, notes = narrowed(supports or user_capabilities(convention), takes, convention)
    return Target(
        name=name or getattr(fn, "__qualname__", repr(fn)),
        convention=convention,
        loader=lambda: fn,
        caps=caps,
        claim=claim or Claim(),
        description=f"user function ({convention} convention)",
        requires=("torch",),
        options=Options(mask="bool", takes=takes, notes=notes),
    )


def user_capabilities(convention: str) -> Capabilities:
    """What a user's function is assumed to take before ``--supports`` says more, following
    its convention's library: a bias and a soft-cap only under the ``exactattn`` convention,
    whose keywords carry them (a function with SDPA's signature may take boolean masks only:
    ``--supports bias=yes``); rows with no allowed key under ``exactattn`` and ``sdpa``, whose
    semantics define them (torch SDPA returns ``Y = 0`` and zero gradients there, math and
    flash backends alike; a kernel that does not, a plain softmax's NaN, says so with
    ``--supports empty_rows=no``, which ``--discover`` finds), elsewhere only when told."""
    own = convention == "exactattn"
    unstated = "not stated for a user's function (--supports {}=yes)"
    return Capabilities(
        devices=("cpu", "cuda"),
        grads=f"the {convention} convention is forward only"
        if convention in FORWARD_ONLY
        else True,
        empty_rows=True if convention in ("exactattn", "sdpa") else unstated.format("empty_rows"),
        dropout=True if own else "own",
        bias=True if own else unstated.format("bias"),
        softcap=True if own else unstated.format("softcap"),
    )


def load_callable(spec: str) -> Any:
    """``package.module:function`` or ``path/to/file.py:function`` → the function
    (:func:`exactattn.infra.loading.load_callable`; an :class:`UnknownTarget` when it names
    none)."""
    try:
        return loading.load_callable(spec, f"target {spec!r}")
    except loading.LoadError as error:
        raise UnknownTarget(str(error)) from error


def unavailable(target: Target, device: str = "cpu", quick: bool = False) -> str | None:
    """Why ``target`` cannot run here on ``device`` (None when it can); ``quick``: without
    importing anything (see :meth:`Target.unavailable`)."""
    why = target.unavailable(quick)
    if why is None and device not in target.caps.devices:
        why = f"runs on {', '.join(target.caps.devices)}, not {device}"
    return why
