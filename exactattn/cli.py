"""``exactattn COMMAND [ARGS]``: dispatch to the subcommand's module, from one table.

Every subcommand is a module exposing ``main(argv) -> int`` — by the project's rule
``exactattn/commands/<name>.py`` (``-`` in a name becomes ``_``), which parses the
arguments and calls into the feature packages. :data:`COMMANDS` lists them all; a
subcommand's module is imported only when that subcommand runs, so ``exactattn --help``
and every command that needs no optional package work without them; a command that
needs a missing one fails with the extra to install instead of a traceback.
"""

from __future__ import annotations

import importlib
import sys

from .infra.optional import missing

# name -> (module exposing main(argv) -> int, one line for --help)
COMMANDS: dict[str, tuple[str, str]] = {
    "main": ("exactattn.commands.main", "the proofs, then the quick precision sweep"),
    "demo": (
        "exactattn.commands.demo",
        "the tiled algorithm on NumPy, mpmath and sympy vs naive",
    ),
    "prove": ("exactattn.commands.prove", "symbolic proofs that the tiled code is exact"),
    "sweep": ("exactattn.commands.sweep", "precision sweeps against the certified reference"),
    "difftest": ("exactattn.commands.difftest", "differential tests across backends"),
    "check": (
        "exactattn.commands.check",
        "any attention implementation against the certified reference",
    ),
    "zoo": (
        "exactattn.commands.zoo",
        "every available foreign kernel checked at one profile, written as a page",
    ),
    "bench": ("exactattn.commands.bench", "NumPy tiled vs naive: time and peak memory"),
    "bench-torch": ("exactattn.commands.bench_torch", "torch CPU: ours vs SDPA"),
}


def usage() -> str:
    """The ``--help`` text: every command with its one-line summary."""
    width = max(map(len, COMMANDS)) + 2
    lines = ["usage: exactattn COMMAND [ARGS]   (exactattn COMMAND --help for its options)"]
    lines += ["", "commands:"]
    lines += [f"  {name:<{width}}{text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"exactattn: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(rest) or 0)
    except ModuleNotFoundError as error:
        hint = missing(error)
        if hint is None:
            raise
        message = str(error) if hint in str(error) else f"{error}; {hint}"
        print(f"exactattn {name}: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
