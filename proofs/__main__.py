"""``python -m exactattn.proofs`` (installed) / ``python -m proofs`` (from a checkout)."""

import sys

from exactattn.commands.prove import main

sys.exit(main(sys.argv[1:]))
