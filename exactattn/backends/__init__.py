"""Number systems (``ctx``): the registry, and how one is chosen for a call.

``backend_of(q, k, v)`` picks the context from the arguments, the way array-api-compat's
``array_namespace`` does: each entry of :data:`BACKENDS` says which arguments belong to its
number system (a torch tensor, a NumPy float array, an object array of its element type)
and builds the context for them; torch is looked up in ``sys.modules`` only, so it is never
imported by accident. Mixing two systems is a ``TypeError`` naming both. A new number system
is one thin ctx module in this folder and one :class:`Backend` entry below.

The protocol a ctx implements is :class:`~exactattn.backends.protocol.ArrayContext` (documented
there, with its size).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .mpmath_backend import MpmathContext
from .numpy_backend import FLOAT_DTYPES, NumpyContext
from .protocol import ArrayContext, ObjectContext
from .sympy_backend import SympyContext

__all__ = [
    "BACKENDS",
    "ArrayContext",
    "Backend",
    "MpmathContext",
    "NumpyContext",
    "ObjectContext",
    "SympyContext",
    "backend_of",
    "resolve_backend",
]


@dataclass(frozen=True)
class Backend:
    """One number system: which arguments are its own, and how its context is built.

    ``element`` recognises the entries of an object array of this system (``None``: the
    system has its own array type, recognised in :func:`_system_of`); ``build`` makes the
    context for the arguments given (all of this system; ``None`` for a system whose values
    travel in another system's arrays, reached by name or context only); ``names`` are the
    strings ``backend=`` accepts, each with a factory.
    """

    name: str
    build: Callable[[list[Any]], ArrayContext] | None
    element: Callable[[Any], bool] | None = None
    names: dict[str, Callable[[], ArrayContext]] = field(default_factory=dict)


def _lazy(module: str, cls: str, *args: Any, **kwargs: Any) -> Callable[[], ArrayContext]:
    """A factory importing an optional backend's module only when called."""
    return lambda: getattr(importlib.import_module(f"exactattn.backends.{module}"), cls)(
        *args, **kwargs
    )


def _numpy_context(arrays: list[Any]) -> ArrayContext:
    # Empty object arrays carry no element to tell their system: float64 holds nothing.
    dtypes = [a.dtype for a in arrays if isinstance(a, np.ndarray) and a.dtype != object]
    return NumpyContext(dtypes[0] if dtypes else np.float64)


def _mpmath_context(arrays: list[Any]) -> ArrayContext:
    """Enough bits for every mpf given (their significands' bit counts), at least mp.prec."""
    import mpmath

    bits = [e._mpf_[3] for arr in arrays for e in np.asarray(arr, dtype=object).flat]
    return MpmathContext(max([mpmath.mp.prec, *bits]))


def _torch_context(arrays: list[Any]) -> ArrayContext:
    from .torch_backend import TorchContext

    return TorchContext(arrays[0].dtype, device=arrays[0].device)


def _is_mpf(e: Any) -> bool:
    import mpmath

    return isinstance(e, mpmath.mpf)


def _is_sympy(e: Any) -> bool:
    import sympy

    return isinstance(e, sympy.Basic)


def _is_arb(e: Any) -> bool:
    return type(e).__module__.startswith("flint")


BACKENDS: tuple[Backend, ...] = (
    Backend(
        "numpy",
        _numpy_context,
        names={
            "numpy": lambda: NumpyContext("float64"),
            **{t: (lambda t=t: NumpyContext(t)) for t in ("float16", "float32", "float64")},
            "longdouble": lambda: NumpyContext("longdouble"),
        },
    ),
    Backend("torch", _torch_context),
    Backend("mpmath", _mpmath_context, _is_mpf, {"mpmath": MpmathContext}),
    Backend("sympy", lambda arrays: SympyContext(), _is_sympy, {"sympy": SympyContext}),
    Backend(
        "emulated",  # float64 arrays holding an emulated format's values
        None,
        names={
            "emulated-fp16": _lazy("emulated_backend", "EmulatedContext", 11, exponent=5),
            "emulated-bf16": _lazy("emulated_backend", "EmulatedContext", 8, exponent=8),
        },
    ),
    Backend(
        "torch-fp8",  # float32 torch tensors, p rounded to FP8 before p·V (FlashAttention-3)
        None,
        names={
            f"torch-fp8-{fmt}": _lazy("fp8_backend", "Fp8Context", fmt) for fmt in ("e4m3", "e5m2")
        },
    ),
    Backend(
        "flint",
        lambda arrays: _lazy("flint_backend", "FlintContext")(),
        _is_arb,
        {"flint": _lazy("flint_backend", "FlintContext")},
    ),
)


def _object_system(name: str, arr: np.ndarray) -> str:
    """The system of an object array's entries ("empty" for no entries)."""
    kinds = set()
    for element in arr.flat:
        found = next((b.name for b in BACKENDS if b.element and b.element(element)), None)
        kinds.add(found or type(element).__name__)
    if len(kinds) > 1:
        raise TypeError(f"{name}: object array mixes element types {sorted(kinds)}")
    kind = kinds.pop() if kinds else "empty"
    if kind != "empty" and kind not in {b.name for b in BACKENDS if b.element}:
        systems = ", ".join(b.name for b in BACKENDS if b.element)
        raise TypeError(
            f"{name} is an object array of {kind}; object arrays must hold the numbers of "
            f"one of {systems}"
        )
    return kind


def _system_of(name: str, x: Any) -> tuple[str, Any]:
    """(system, dtype or None) of one argument; TypeError for unsupported element types."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return "torch", x.dtype
    arr = x if isinstance(x, np.ndarray) else np.asarray(x)
    if arr.dtype == object:
        return _object_system(name, arr), None
    if arr.dtype.type not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} has dtype {arr.dtype}; attention needs real floating point "
            "(float16, float32, float64, longdouble) or a number system's object array"
        )
    return "numpy", arr.dtype


def backend_of(*named: tuple[str, Any]) -> ArrayContext:
    """The context of the arguments, given as ``(name, array)`` pairs."""
    seen = {name: _system_of(name, x) for name, x in named if x is not None}
    systems = {kind for kind, _ in seen.values() if kind != "empty"}
    if len(systems) > 1:
        listing = ", ".join(f"{n}: {k}" for n, (k, _) in seen.items())
        raise TypeError(f"inputs mix number systems ({listing}); convert them to one first")
    system = systems.pop() if systems else "numpy"
    dtypes = {detail for kind, detail in seen.values() if kind == system and detail is not None}
    if len(dtypes) > 1:
        listing = ", ".join(f"{n}: {d}" for n, (_, d) in seen.items())
        raise TypeError(f"inputs mix dtypes ({listing}); cast them to one dtype first")
    arrays = [x for name, x in named if x is not None and seen[name][0] != "empty"]
    entry = next(b for b in BACKENDS if b.name == system)
    return entry.build(arrays)


def resolve_backend(backend: Any, *named: tuple[str, Any]) -> ArrayContext:
    """``backend=`` as given (a ctx or a name), or :func:`backend_of` the arguments."""
    if backend is None:
        return backend_of(*named)
    if isinstance(backend, ArrayContext):
        return backend
    factories = {name: f for b in BACKENDS for name, f in b.names.items()}
    if isinstance(backend, str) and backend in factories:
        return factories[backend]()
    raise ValueError(
        f"backend must be a backend context or one of {sorted(factories)}; got {backend!r}"
    )
