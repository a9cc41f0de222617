"""Optional packages: the library imports without them and names the extra that installs them.

Each optional package is hidden by putting ``None`` in ``sys.modules`` (Python's own way to
make ``import torch`` fail with ``ModuleNotFoundError``), so these tests hold whether or not
the package is installed here.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from exactattn import cli
from exactattn.infra.optional import PACKAGES, install_hint, needs

# Modules that exist to wrap an optional package, and one package each cannot do without.
WRAPPERS = {
    "exactattn.torch": "torch",
    "exactattn.torch.triton_kernels": "triton",
    "exactattn.backends.torch_backend": "torch",
    "exactattn.backends.fp8_backend": "torch",
    "exactattn.backends.flint_backend": "flint",
    "exactattn.precision.plots": "matplotlib",
    "exactattn.precision.sweep_report": "pandas",
}


def _declared_extras() -> set[tuple[str, str]]:
    """(requirement name with its own extras, exactattn extra) from the installed metadata."""
    pairs = set()
    for line in importlib.metadata.requires("exactattn") or []:
        requirement, _, marker = line.partition(";")
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        name = re.match(r"[A-Za-z0-9._-]+(\[[^\]]*\])?", requirement.strip())
        if extra and name:
            pairs.add((name.group(0).lower().replace("_", "-"), extra.group(1)))
    return pairs


def test_every_optional_package_is_installed_by_the_extra_its_hint_names():
    declared = _declared_extras()
    for module, (distribution, extra) in PACKAGES.items():
        assert (distribution.lower(), extra) in declared, (module, distribution, extra)
        assert install_hint(module) == f"pip install 'exactattn[{extra}]'"


def test_a_hint_is_only_given_for_optional_packages():
    with pytest.raises(ValueError, match=r"optional packages .*; got 'numpy'"):
        install_hint("numpy")


@pytest.mark.parametrize(("module", "package"), WRAPPERS.items())
def test_a_wrapper_without_its_package_names_the_extra(module, package, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ModuleNotFoundError) as error:
        importlib.import_module(module)
    missing = (error.value.name or "").partition(".")[0]
    # the hidden package, or another one it needs that is not installed here
    assert missing == package or importlib.util.find_spec(missing) is None, missing
    assert install_hint(missing) in str(error.value)


def test_needs_passes_other_import_errors_through(monkeypatch):
    monkeypatch.setitem(sys.modules, "exactattn_no_such_module", None)
    with pytest.raises(ModuleNotFoundError) as error, needs("this test"):
        import exactattn_no_such_module  # noqa: F401
    assert "exactattn[" not in str(error.value)


_IMPORT_ALL = """
import importlib, json, pkgutil, sys
for name in {packages}:
    sys.modules[name] = None
import exactattn
failed = {{}}
for info in pkgutil.walk_packages(exactattn.__path__, "exactattn."):
    try:
        importlib.import_module(info.name)
    except ImportError as error:
        failed[info.name] = str(error)
print(json.dumps(failed))
"""


def test_without_optional_packages_only_modules_that_need_them_fail_and_say_why():
    """Every module imports, or fails with the extra to install (wrappers and their users)."""
    script = _IMPORT_ALL.format(packages=sorted(PACKAGES))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    failed = json.loads(done.stdout)
    # a wrapper inside another (the kernels in exactattn.torch) is not reached without it
    outermost = {m for m in WRAPPERS if not any(m.startswith(f"{w}.") for w in WRAPPERS)}
    assert outermost <= set(failed)
    unexplained = {m: e for m, e in failed.items() if "pip install 'exactattn[" not in e}
    assert not unexplained
    for module in ("exactattn", "exactattn.cli", "exactattn.api", "exactattn.commands.bench"):
        assert module not in failed
    assert not any(m.startswith(("exactattn.commands.", "exactattn.proofs.")) for m in failed)


def test_a_command_missing_a_package_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert cli.main(["bench-torch", "--repeats", "1", "--no-memory"]) == 1
    assert "exactattn bench-torch:" in (err := capsys.readouterr().err)
    assert install_hint("torch") in err


def test_tests_need_optional_packages_one_way():
    """Only tests/optional.py calls importorskip; no folder hides modules by collect_ignore."""
    here = Path(__file__).resolve()
    tests = here.parents[1]
    allowed = {tests / "optional.py", here}  # the mechanism itself, and this check
    pattern = re.compile(r"importorskip\(|collect_ignore")
    offenders = [
        path.relative_to(tests).as_posix()
        for path in tests.rglob("*.py")
        if path not in allowed and pattern.search(path.read_text())
    ]
    assert not offenders, f"use tests.optional.requires(...) instead in {offenders}"
