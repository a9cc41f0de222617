"""Every ``exactattn.X`` that README and docs/ tell users to write imports, and is the module
it names (the layer folders moved the modules; ``exactattn.infra.aliases`` keeps the names)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from exactattn.infra.aliases import PUBLIC_MODULES
from tests.optional import requires

NEEDS = {  # the names whose module needs an optional package
    "exactattn.flash_attn": "torch",
    "exactattn.certified": "flint",
    "exactattn.fast_reference": "flint",
}
DOCUMENTED = [  # (module, attribute) as README, docs/ and the docstrings write them
    ("exactattn", "attention"),
    ("exactattn", "attention_backward"),
    ("exactattn", "varlen_attention"),
    ("exactattn", "paged_attention"),
    ("exactattn", "merge_partials"),
    ("exactattn.masks", "causal"),
    ("exactattn.masks", "Mask"),
    ("exactattn.ops", "tanh"),
    ("exactattn.dropout", "Dropout"),
    ("exactattn.bounds", "bounds"),
    ("exactattn.expected_bounds", "expected_bounds"),
    ("exactattn.certified", "certified_attention"),
    ("exactattn.fast_reference", "fast_attention"),
    ("exactattn.testing", "assert_attention_close"),
]


@pytest.mark.parametrize(("alias", "real"), sorted(PUBLIC_MODULES.items()))
def test_each_public_name_imports_as_the_module_itself(alias, real):
    if alias in NEEDS:
        requires(NEEDS[alias])
    module = importlib.import_module(alias)
    assert module is importlib.import_module(real)
    assert module.__name__ == real and module.__spec__.name == real  # its own spec kept
    parent, _, leaf = alias.rpartition(".")
    assert getattr(importlib.import_module(parent), leaf) is module


@pytest.mark.parametrize(("module", "name"), DOCUMENTED)
def test_each_documented_name_is_there(module, name):
    if module in NEEDS:
        requires(NEEDS[module])
    assert callable(getattr(importlib.import_module(module), name))


def test_the_torch_faces_users_write():
    requires("torch")
    import exactattn.torch
    from exactattn.flash_attn import flash_attn_func, flash_attn_varlen_func

    assert callable(exactattn.torch.attention) and callable(exactattn.torch.flex_attention)
    assert callable(flash_attn_func) and callable(flash_attn_varlen_func)


def test_the_transformers_integration_name():
    requires("torch", "transformers")
    module = importlib.import_module("exactattn.integrations.transformers")
    assert callable(module.register)


def test_a_fresh_process_imports_each_name_first():
    """In a new interpreter, ``from exactattn.bounds import bounds`` is the first import of
    exactattn (the finder is installed by the package's own import)."""
    script = "from exactattn.bounds import bounds; import exactattn.error.bounds as b; "
    script += "assert bounds is b.bounds; import exactattn.masks as m; print(m.__name__)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "exactattn.core.masks", out.stderr


def test_a_name_that_was_never_public_is_not_found():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("exactattn.algorithm")
