"""A seed draws the same cases in every process, whatever that process imported.

Hypothesis mixes the literal constants of the local modules imported so far into its
choices; the runner's draws hold them out (:func:`exactattn.testing.search.seed_only`), so
``exactattn check --seed S`` draws the same cases before and after more code is loaded: a
check of a correct kernel once changed the cases drawn for the broken one checked after it
(tests/check/test_broken_kernels.py then passed the no-max-subtraction kernel). Each run is
a fresh process, so what it imports before the second draw is the same every time.
"""

from __future__ import annotations

import subprocess
import sys

from tests.optional import requires

requires("torch", "flint")

SCRIPT = """
import contextlib, sys
sys.path.insert(0, {root!r})
from exactattn.cases import paths
from exactattn.testing import assert_attention_close, search
from tests.check import kernels
if {without}:
    search.seed_only = contextlib.nullcontext
strategy = paths.check_draws(blocks=(4,), max_n=64, dtypes=("float32",))
before = search.draw(strategy, 60, 0)
assert_attention_close(kernels.sdpa(None), convention="sdpa", claim=kernels.CLAIM,
                       supports="dropout=no", examples=60, dtypes=("float32",), max_n=12,
                       dropout_probe=False)
print("same" if search.draw(strategy, 60, 0) == before else "different")
"""


def _draws_after_a_check(without: bool) -> str:
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    code = SCRIPT.format(root=root, without=without)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    return out.stdout.split()[-1]


def test_a_seed_draws_the_same_cases_after_a_check_imported_more():
    assert _draws_after_a_check(without=False) == "same"


def test_without_it_the_imports_change_the_draws():
    """The check above can fail: with the local constants left in, the check's imports
    change the cases the same seed draws."""
    assert _draws_after_a_check(without=True) == "different"
