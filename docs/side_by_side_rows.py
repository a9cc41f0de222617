"""The rows of the side-by-side measurement (``docs/side_by_side.py``): every planted bug of
the repository and each one's correct twin, with the convention, claim and supports an
author would state, as the repository's own tests state them.

Dense twins are the tiled kernel of ``tests/check/kernels.py``; they need a
``MODULE:FUNCTION`` target for ``exactattn check``, so each is bound here to a module-level
name (``sdpa__<bug>``, ``flash__<bug>``; ``__correct`` for the twin). Binding builds a
closure only: importing this module runs no kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.check import kernels
from tests.interfaces import test_check_conventions as conventions

SDPA_BLOCK = 32  # the slow reach tests' block at the default profile's sizes
MODULE = "docs.side_by_side_rows"
BROKEN = "tests.interfaces.broken_interfaces"


@dataclass(frozen=True)
class Row:
    """One kernel: ``kind`` picks the peers' grids (dense, varlen, kvcache, merge, sinks)."""

    name: str
    kind: str
    convention: str
    target: str  # MODULE:FUNCTION for `exactattn check`
    claim: str
    supports: str
    correct: bool


def _ident(bug: str | None) -> str:
    return "correct" if bug is None else bug.replace("-", "_")


def _dense_rows() -> list[Row]:
    rows = []
    sdpa_claim = f"scores=fp32,stats=fp32,acc=fp32,block={SDPA_BLOCK}"
    sdpa_bugs = [None, *(b for b in kernels.BUGS if b != "lse-without-max"), *kernels.REACH_BUGS]
    for bug in sdpa_bugs:
        name = f"sdpa__{_ident(bug)}"
        globals()[name] = kernels.sdpa(bug, SDPA_BLOCK)
        rows.append(Row(f"sdpa {bug or 'correct twin'}", "dense-sdpa", "sdpa",
                        f"{MODULE}:{name}", sdpa_claim, "dropout=no", bug is None))  # fmt: skip
    for bug in (None, "lse-without-max"):
        name = f"flash__{_ident(bug)}"
        globals()[name] = kernels.flash(bug)
        label, supports = f"flash {bug or 'correct twin'}", "dropout=no,lse=yes"
        rows.append(Row(label, "dense-flash", "flash", f"{MODULE}:{name}", kernels.CLAIM,
                        supports, bug is None))  # fmt: skip
    return rows


_KIND = {"flash-varlen": "varlen", "flash-kvcache": "kvcache", "exactattn-sinks": "sinks"}
_CORRECT_TARGET = {
    "flash-varlen": "exactattn.layouts.flash_attn:flash_attn_varlen_func",
    "flash-kvcache": "exactattn.layouts.flash_attn:flash_attn_with_kvcache",
    "fa4-combine": "exactattn.layouts.flash_attn:flash_attn_combine",
    "xformers-merge": f"{BROKEN}:xformers_merge_attentions",
    "flashinfer-merge": f"{BROKEN}:flashinfer_merge_state",
    "exactattn-sinks": "exactattn.torch:attention_with_lse",
}


def _interface_rows() -> list[Row]:
    claim = conventions.CLAIM
    rows = []
    for convention, (_, supports) in conventions.CORRECT.items():
        rows.append(Row(f"{convention} correct twin", _KIND.get(convention, "merge"), convention,
                        _CORRECT_TARGET[convention], claim, supports, True))  # fmt: skip
    broken = dict(conventions.BROKEN)
    for name in conventions.KVCACHE_BROKEN:
        broken.setdefault(name, ("flash-kvcache", conventions.FLASH, ""))
    for name, (convention, supports, _) in broken.items():
        rows.append(Row(name, _KIND.get(convention, "merge"), convention,
                        f"{BROKEN}:{name}", claim, supports, False))  # fmt: skip
    return rows


ROWS: list[Row] = _dense_rows() + _interface_rows()


def kernel_of(row: Row):
    """The callable ``row.target`` names."""
    import importlib

    module, name = row.target.split(":")
    return getattr(importlib.import_module(module), name)
