"""One registry of named attention targets: exactattn's own configurations and foreign ones.

A target (:class:`~exactattn.targets.target.Target`) is a callable with a calling convention
(:mod:`.conventions`: ``api``, ``exactattn``, ``sdpa``, ``flash``, ``hf``, ``flex``,
``xformers``), its capabilities and its claimed arithmetic. The entries are exactattn's
precision configurations and torch paths (:mod:`.builtin`) and the foreign
implementations (:mod:`.foreign`); ``mpN`` and a user's ``package.module:function`` or
``path/to/file.py:function`` resolve on demand (:func:`get`). ``exactattn sweep``,
``exactattn difftest``, ``exactattn check``, :func:`exactattn.testing.assert_attention_close`
and ``gpu/check.py`` all read this registry. Listing it imports nothing optional; a target
whose packages do not import, or that needs a CUDA device, says why (:func:`unavailable`).

A :class:`Variant` is a target in one dtype on one device: the unit that runs cases,
holds inputs in its format and has one derived tolerance.
"""

from .resolve import (
    UnknownTarget,
    from_callable,
    get,
    load_callable,
    names,
    registry,
    unavailable,
    user_capabilities,
    user_target,
)
from .target import Capabilities, Claim, Target
from .variants import Variant, claim_for, conventions, variant

__all__ = [
    "Capabilities",
    "Claim",
    "Target",
    "UnknownTarget",
    "Variant",
    "claim_for",
    "conventions",
    "from_callable",
    "get",
    "load_callable",
    "names",
    "registry",
    "unavailable",
    "user_capabilities",
    "user_target",
    "variant",
]
