"""The built wheel holds every module of the checkout's library and proofs.

CI installs the wheel too (``.ci/run``), but only this test says which module a wheel
left out: a hand-written package list once shipped without ``exactattn.cases``, so
``check``, ``difftest`` and ``sweep`` failed on every non-editable install.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.project.tracked import tracked

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = {"exactattn/": "exactattn/", "proofs/": "exactattn/proofs/"}  # checkout -> wheel


def _expected() -> set[str]:
    """Each tracked module of ``exactattn/`` and ``proofs/`` at its path inside the wheel."""
    out = set()
    for path in tracked():
        for folder, inside in SHIPPED.items():
            if path.startswith(folder) and path.endswith(".py"):
                out.add(inside + path.removeprefix(folder))
    return out


def test_the_wheel_ships_every_module_on_disk(tmp_path):
    """Built from a copy of the tracked files alone, as a clean clone would (a checkout's
    old ``build/`` folder would otherwise put back what the configuration leaves out)."""
    expected = _expected()
    assert "exactattn/cases/__init__.py" in expected and "exactattn/proofs/__init__.py" in expected
    source = tmp_path / "source"
    for path in tracked():
        if (ROOT / path).is_file():
            (source / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, source / path)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path)]
    subprocess.run([*command, str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("exactattn-*.whl")
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")}
    assert sorted(expected - shipped) == []
    assert sorted(n for n in shipped - expected if not n.endswith("__init__.py")) == []
