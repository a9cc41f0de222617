"""Optional packages in tests: one way to need them, and a skip that says what to install.

``requires("torch")`` at the top of a test module skips the whole module when torch is not
installed; inside a test it skips that test. It returns the imported module (a tuple of
them for several names or none). The skip reason names the extra that installs the package, so
``pytest -rs`` lists every skipped test with its cure, e.g.
``needs flint: pip install 'exactattn[flint]'``. This is the only mechanism the tests use
for optional packages: no ``collect_ignore``, no bare ``pytest.importorskip``.
"""

from __future__ import annotations

from types import ModuleType

import pytest

from exactattn.infra.optional import install_hint


def requires(*modules: str) -> ModuleType | tuple[ModuleType, ...]:
    """Import each optional package, or skip (the module or the test) naming its extra."""
    __tracebackhide__ = True  # the skip is reported at the caller's line
    loaded = []
    for name in modules:  # a loop, not a generator: its frame would be the reported one
        loaded.append(pytest.importorskip(name, reason=f"needs {name}: {install_hint(name)}"))
    return loaded[0] if len(loaded) == 1 else tuple(loaded)
