"""``exactattn`` command line: ``main | demo | prove | sweep | difftest | bench | bench-torch``.

Each subcommand lives in the module that owns it and exposes ``main(argv) -> int``; this
file only dispatches, importing the subcommand's module on demand.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "main": ("exactattn.mainjob", "the proofs, then the quick precision sweep"),
    "demo": ("exactattn.demo", "the tiled algorithm on NumPy, mpmath and sympy vs naive"),
    "prove": ("exactattn.proofs.cli", "symbolic proof scripts (proofs/)"),
    "sweep": ("exactattn.precision.cli", "precision-sweep experiments"),
    "difftest": ("exactattn.difftest.cli", "differential tests across backends"),
    "bench": ("exactattn.bench", "NumPy tiled vs naive: time and peak memory"),
    "bench-torch": ("exactattn.bench_torch", "torch CPU: ours vs SDPA"),
}


def _usage() -> str:
    lines = ["usage: exactattn COMMAND [ARGS]", "", "commands:"]
    lines += [f"  {name:<12} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"exactattn: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
