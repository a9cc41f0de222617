"""The files git tracks in the checkout: what a clone holds, the project's own layout."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tracked() -> list[str]:
    """Tracked paths relative to the checkout (a test that needs them is skipped outside
    a git checkout, with the reason)."""
    try:
        out = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the layout and its citations are what git tracks")
    return out.splitlines()
