"""Optional packages: which extra of exactattn installs each, and the error that says so.

exactattn needs only numpy, sympy and mpmath; every other package is optional and is
imported where it is used, so ``import exactattn`` and the modules that do not need one
work without it. A module that cannot work without an optional package imports it inside
:func:`needs`; when the package is missing, the error names what needed it and the extra
to install, e.g. ``pip install 'exactattn[flint]'``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# import name -> (distribution, the extra of exactattn that installs it; see pyproject.toml)
PACKAGES: dict[str, tuple[str, str]] = {
    "torch": ("torch", "torch"),
    "triton": ("triton", "triton"),
    "flint": ("python-flint", "flint"),
    "matplotlib": ("matplotlib", "plots"),
    "pandas": ("pandas", "sweep"),
    "rich": ("rich", "sweep"),
    "dask": ("dask[distributed]", "dask"),
    "transformers": ("transformers", "hf"),
    "z3": ("z3-solver", "proofs"),
    "cvc5": ("cvc5", "proofs"),
    "ml_dtypes": ("ml-dtypes", "lowbit"),
    "onnxruntime": ("onnxruntime", "onnx"),
    "onnx": ("onnx", "onnx"),
    "openvino": ("openvino", "openvino"),
    "jax": ("jax", "jax"),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "sageattention": ("sageattention", "sage"),
}


def install_hint(module: str) -> str:
    """``pip install 'exactattn[EXTRA]'`` for an optional import name (``dask.distributed``)."""
    top = module.partition(".")[0]
    if top not in PACKAGES:
        raise ValueError(
            f"module must be one of the optional packages {sorted(PACKAGES)}; got {module!r}"
        )
    return f"pip install 'exactattn[{PACKAGES[top][1]}]'"


def missing(error: ModuleNotFoundError) -> str | None:
    """The install hint when ``error`` is an optional package's absence, else None."""
    top = (error.name or "").partition(".")[0]
    return install_hint(top) if top in PACKAGES else None


@contextlib.contextmanager
def needs(what: str) -> Iterator[None]:
    """Import optional packages for ``what`` inside this block.

    A missing optional package raises :class:`ModuleNotFoundError` (an ``ImportError``)
    naming ``what``, the distribution and the extra that installs it; any other import
    error passes through unchanged.
    """
    try:
        yield
    except ModuleNotFoundError as error:
        hint = missing(error)
        if hint is None:
            raise
        distribution = PACKAGES[error.name.partition(".")[0]][0]
        raise ModuleNotFoundError(
            f"{what} needs {distribution}, which is not installed: {hint}", name=error.name
        ) from error
