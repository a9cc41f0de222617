"""What a user's function can be called with: its signature decides what a case passes.

A function written as ``def attn(q, k, v, *, is_causal=False, scale=None, attn_mask=None)``
is an SDPA-convention function without ``enable_gqa`` and ``dropout_p``; calling it with
either raises ``TypeError`` before anything is checked. :func:`keywords_taken` reads the
keyword names it takes (None: any, a ``**kwargs`` or a callable without an inspectable
signature), and :func:`narrowed` turns what is missing into capabilities and notes:

* no ``enable_gqa``: a GQA case is called with ``K, V`` expanded to one head per query head,
  as SDPA's ``enable_gqa`` defines it (query head ``h`` reads key/value head ``h // g``),
  and the expanded heads' gradients are summed over each group in float64 (exact to far
  below the target's formats); without ``attn_mask`` either way nothing changes there;
* no ``dropout_p``: no dropout case and no dropout probe (said once, as a note);
* no ``attn_mask``: only masks ``is_causal`` expresses (none, causal top-left or square) and
  no bias; no ``is_causal``: a causal mask goes as a boolean ``attn_mask``; without both,
  unmasked cases only;
* no ``scale``: only cases at the default scale ``1/√d``.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

from .target import Capabilities

SDPA_KEYWORDS = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def keywords_taken(fn: Any) -> frozenset[str] | None:
    """The keyword names ``fn`` accepts (None: any — ``**kwargs``, or no signature)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in parameters if p.kind in keyword)


def narrowed(
    caps: Capabilities, takes: frozenset[str] | None, convention: str
) -> tuple[Capabilities, tuple[str, ...]]:
    """``caps`` narrowed to what an SDPA-convention function's keywords ``takes`` can be
    given, and the notes the check prints once (see the module docstring)."""
    if takes is None or convention != "sdpa":
        return caps, ()
    missing = [name for name in SDPA_KEYWORDS if name not in takes]
    if not missing:
        return caps, ()
    changes: dict[str, Any] = {}
    notes = [f"its signature takes no {', '.join(missing)}"]
    if "dropout_p" not in takes and caps.dropout is not False:
        changes["dropout"] = "the function takes no dropout_p (its signature)"
        notes.append("no dropout cases and no dropout probe (it takes no dropout_p)")
    if "enable_gqa" not in takes and caps.gqa is True:
        notes.append(
            "GQA cases are called with K, V expanded to one head per query head "
            "(it takes no enable_gqa); dK, dV summed over each group in float64"
        )
    if "attn_mask" not in takes:
        changes["bias"] = "the function takes no attn_mask (its signature)"
        kinds = "unmasked and is_causal cases" if "is_causal" in takes else "unmasked cases"
        notes.append(f"only {kinds} (it takes no attn_mask; the others skip with the reason)")
    return replace(caps, **changes), tuple(notes)
