"""The skipped cases of a check by reason, each with what would run them.

A case is skipped when a variant does not take it (:meth:`~exactattn.targets.Variant.unsupported`:
a capability, its convention, a slow number system) or when the target refused it at run time
(its library's documented "not supported", :meth:`~exactattn.targets.Target.refuses`); the
gradients of a case are left unjudged when the target has none. What would run them:

* a capability that a user's function was assumed not to have, or was told it has not
  (``--supports``): ``--supports FIELD=yes`` (for ``v ≠ d``: ``equal_head_dims=no``; for mask
  kinds: ``masks=`` with the missing kinds added);
* a reason that names its own command in parentheses (``… (exactattn sweep --preset NAME)``);
* nothing, for the rest: the target's own limit (its library's refusal, what its calling
  convention cannot express, a slow number system), shown as ``—``.

:func:`rows` is the one listing; the terminal (:func:`terminal`), report.md and the zoo page
(:func:`markdown`) print it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..targets.variants import FEATURES, NEEDS_EQUAL_HEAD_DIMS

NO_FLAG = "—"


@dataclass(frozen=True)
class Skip:
    """``count`` cases of ``variant`` skipped (or, ``grads``, their gradients left unjudged)
    for ``reason``; ``runs_them``: the flag that would run them, or :data:`NO_FLAG`."""

    variant: str
    count: int
    reason: str
    runs_them: str
    grads: bool = False


def runs_them(target: Any, reason: str) -> str:
    """The flag that would run cases skipped for ``reason`` on ``target`` (module docstring)."""
    if "(exactattn " in reason:  # the reason names its own command
        return reason[reason.index("(exactattn ") + 1 :].rstrip(")")
    user = ":" in target.name  # a user's function (module:function or file.py:function)
    for field, what, _ in FEATURES:
        capability = getattr(target.caps, field)
        if reason.startswith(what) and isinstance(capability, str) and "--supports" in capability:
            return f"--supports {field}=yes"
    if reason.startswith("gradients") and "--supports" in str(target.caps.grads):
        return "--supports grads=yes"
    if user and reason == NEEDS_EQUAL_HEAD_DIMS:
        return "--supports equal_head_dims=no"
    if user and reason.startswith("mask kinds ") and target.caps.masks is not None:
        missing = reason.removeprefix("mask kinds ").partition("]")[0].strip("[")
        kinds = [*target.caps.masks, *(k.strip(" '") for k in missing.split(","))]
        return f"--supports masks={'+'.join(kinds)}"
    return NO_FLAG


def rows(result: Any) -> list[Skip]:
    """Every skip reason of ``result`` (a :class:`~.session.CheckResult`) per variant, the
    most frequent first, then the gradients left unjudged."""

    def target(variant: str) -> Any:
        return result.targets[variant.partition("[")[0]]

    found = []
    for name, reasons in sorted(result.report.skips.items()):
        for reason, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
            found.append(Skip(name, count, reason, runs_them(target(name), reason)))
    for name, reasons in sorted(result.report.grads_skipped.items()):
        for reason, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
            flag = runs_them(target(name), f"gradients: {reason}")
            found.append(Skip(name, count, reason, flag, grads=True))
    return found


def terminal(result: Any, width: int = 120) -> list[str]:
    """The listing as terminal lines (each reason cut to fit ``width``), or none."""
    found = rows(result)
    if not found:
        return []
    lines = [f"  skipped, by reason (what would run them; {NO_FLAG}: the target's own limit)"]
    for skip in found:
        what = f"gradients not judged: {skip.reason}" if skip.grads else skip.reason
        head = f"    {skip.variant:<26} {skip.count:>5} × "
        room = max(width - len(head) - len(skip.runs_them) - 3, 20)
        text = what if len(what) <= room else what[: room - 1] + "…"
        lines.append(f"{head}{text}  [{skip.runs_them}]")
    return lines


def markdown(result: Any) -> list[str]:
    """The listing as a markdown table (reasons in full), or none."""
    found = rows(result)
    if not found:
        return []
    lines = ["| variant | cases | reason | what would run them |", "| --- | --- | --- | --- |"]
    for skip in found:
        what = f"gradients not judged: {skip.reason}" if skip.grads else skip.reason
        text = what.replace("|", "\\|")
        flag = skip.runs_them if skip.runs_them == NO_FLAG else f"`{skip.runs_them}`"
        lines.append(f"| {skip.variant} | {skip.count} | {text} | {flag} |")
    return lines
