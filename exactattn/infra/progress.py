"""Progress of a long run: a rich bar with the time left, and result lines that do not tear it.

:class:`Progress` draws ``what: done/total, elapsed, ETA`` on stderr (rich, the optional
``sweep`` extra; without rich, or when disabled, there is no bar) and prints each result
line on stdout — through the bar's console when both go to the same terminal, so the bar
stays below the lines.
"""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """A bar over ``total`` tasks when ``enabled`` (``console``: a rich Console, for tests)."""

    def __init__(self, total: int, what: str, enabled: bool = True, console: Any = None):
        self._bar = None
        if not enabled:
            return
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar
        except ModuleNotFoundError:
            return
        self._bar = Bar(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            "ETA",
            TimeRemainingColumn(),
            console=console or Console(file=sys.stderr),
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._task = self._bar.add_task(what, total=total)
        self._bar.start()

    def advance(self, count: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, count)

    def print(self, line: str) -> None:
        """``line`` on stdout, above the bar when they share a terminal."""
        if self._bar is not None and sys.stdout.isatty() and self._bar.console.is_terminal:
            self._bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
