"""Skip the modules of this folder whose optional dependencies are not installed."""

import importlib.util

_NEEDS = {
    "test_flint_reference.py": ("flint",),
    "test_configs_bound.py": ("flint",),
    "test_sweep.py": ("flint", "pandas", "matplotlib", "rich"),
}

collect_ignore = [
    module
    for module, packages in _NEEDS.items()
    if any(importlib.util.find_spec(name) is None for name in packages)
]
