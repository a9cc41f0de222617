"""``exactattn zoo [TARGET ...] [--zoo-out FILE] [check's options]``: ``exactattn check --zoo``.

Every available foreign target (or the TARGETs named) at check's profile (default:
``default``), judged on one set of drawn cases through check's one runner (``--workers``,
``--scheduler``, ``--journal``/``--resume``), and the zoo page written to ``--zoo-out``
(:mod:`exactattn.testing.zoo_page`); the exit status is check's.
"""

from __future__ import annotations

import sys

from . import check


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return check.main(["--zoo", *argv], prog="exactattn zoo")
