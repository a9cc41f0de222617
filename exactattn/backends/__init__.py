"""Number systems (``ctx``) and how one is chosen for a call.

``backend_of(q, k, v)`` picks the context from the arguments, the way array-api-compat's
``array_namespace`` does: NumPy float arrays give :class:`NumpyContext` in their dtype,
object arrays of ``mpf`` give :class:`MpmathContext`, of sympy expressions
:class:`SympyContext`, of flint ``arb`` the ball context, torch tensors the torch context
(looked up in ``sys.modules`` only, so torch is never imported by accident). Mixing two
systems is a ``TypeError`` naming both.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .base import ArrayContext, ObjectContext
from .mpmath_backend import MpmathContext
from .numpy_backend import FLOAT_DTYPES, NumpyContext
from .sympy_backend import SympyContext

__all__ = [
    "ArrayContext",
    "MpmathContext",
    "NumpyContext",
    "ObjectContext",
    "SympyContext",
    "backend_of",
    "resolve_backend",
]


def _object_kind(arr: np.ndarray) -> str:
    import mpmath
    import sympy

    kinds = set()
    for element in arr.flat:
        if isinstance(element, mpmath.mpf):
            kinds.add("mpmath")
        elif isinstance(element, sympy.Basic):
            kinds.add("sympy")
        elif type(element).__module__.startswith("flint"):
            kinds.add("flint")
        else:
            kinds.add(type(element).__name__)
    if len(kinds) > 1:
        raise TypeError(f"object array mixes element types {sorted(kinds)}")
    return kinds.pop() if kinds else "empty"


def _mpf_precision(arrays: Any) -> int:
    """Enough bits for every mpf given (their significands' bit counts), at least mp.prec."""
    import mpmath

    bits = [e._mpf_[3] for arr in arrays for e in np.asarray(arr, dtype=object).flat]
    return max([mpmath.mp.prec, *bits])


def _describe(name: str, x: Any) -> tuple[str, Any]:
    """(system, detail) of one argument; raises TypeError for unsupported element types."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return "torch", x.dtype
    arr = x if isinstance(x, np.ndarray) else np.asarray(x)
    if arr.dtype == object:
        kind = _object_kind(arr)
        if kind not in ("mpmath", "sympy", "flint", "empty"):
            raise TypeError(
                f"{name} is an object array of {kind}; object arrays must hold mpmath mpf, "
                "sympy expressions or flint arb numbers"
            )
        return kind, None
    if arr.dtype.type not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} has dtype {arr.dtype}; attention needs real floating point "
            "(float16, float32, float64, longdouble) or a number system's object array"
        )
    return "numpy", arr.dtype


def backend_of(*named: tuple[str, Any]) -> ArrayContext:
    """The context of the arguments, given as ``(name, array)`` pairs."""
    seen: dict[str, tuple[str, Any]] = {}
    for name, x in named:
        if x is None:
            continue
        seen[name] = _describe(name, x)
    systems = {kind for kind, _ in seen.values() if kind != "empty"}
    if len(systems) > 1:
        listing = ", ".join(f"{n}: {k}" for n, (k, _) in seen.items())
        raise TypeError(f"inputs mix number systems ({listing}); convert them to one first")
    system = systems.pop() if systems else "numpy"
    if system in ("numpy", "torch"):
        dtypes = {detail for kind, detail in seen.values() if kind == system}
        if len(dtypes) > 1:
            listing = ", ".join(f"{n}: {d}" for n, (_, d) in seen.items())
            raise TypeError(f"inputs mix dtypes ({listing}); cast them to one dtype first")
    if system == "numpy":
        # Empty object arrays carry no element to tell their system: float64 holds nothing.
        dtype = next((d for kind, d in seen.values() if kind == "numpy"), np.float64)
        return NumpyContext(dtype)
    if system == "mpmath":
        return MpmathContext(_mpf_precision(x for _, x in named if x is not None))
    if system == "sympy":
        return SympyContext()
    if system == "flint":
        from .flint_backend import FlintContext

        return FlintContext()
    from .torch_backend import TorchContext

    tensor = next(x for _, x in named if x is not None)
    return TorchContext(tensor.dtype, device=tensor.device)


def resolve_backend(backend: Any, *named: tuple[str, Any]) -> ArrayContext:
    """``backend=`` as given (a ctx or a name), or :func:`backend_of` the arguments."""
    if backend is None:
        return backend_of(*named)
    if isinstance(backend, ArrayContext):
        return backend
    if isinstance(backend, str):
        if backend == "numpy":
            return NumpyContext("float64")
        if backend in ("float16", "float32", "float64", "longdouble"):
            return NumpyContext(backend)
        if backend == "mpmath":
            return MpmathContext()
        if backend == "sympy":
            return SympyContext()
        if backend == "flint":
            from .flint_backend import FlintContext

            return FlintContext()
    raise ValueError(
        f"backend must be a backend context or one of 'numpy', 'float16', 'float32', "
        f"'float64', 'longdouble', 'mpmath', 'sympy', 'flint'; got {backend!r}"
    )
