"""``python -m proofs`` (from a checkout) / ``python -m exactattn.proofs`` (installed)."""

import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
