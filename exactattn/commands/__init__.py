"""The ``exactattn`` subcommands: one module per subcommand, each exposing ``main(argv) -> int``.

A command module only parses its arguments and calls into the feature packages
(:mod:`exactattn.difftest`, :mod:`exactattn.precision`, :mod:`exactattn.proofs`, ...), which
hold the logic and have no command line of their own; code that exists only for a command
(a benchmark, the demo) may stay in its module. :mod:`exactattn.cli` dispatches from one
table; a new command is a module here plus one entry in that table.
"""
