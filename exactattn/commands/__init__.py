"""The ``exactattn`` subcommands: one module per subcommand, each exposing ``main(argv) -> int``."""
