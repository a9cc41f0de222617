"""A FlexAttention mod traced over symbolic indices into z3, for every sequence length.

:func:`trace` calls ``mask_mod(b, h, q_idx, kv_idx)`` once with :class:`Traced` integers
(z3 terms) in place of the index tensors. The operations FlexAttention programs use are
recorded as z3 terms: ``+ − ×``, ``//`` and ``%`` by a positive constant (floor division,
as torch and Python do), comparisons, ``& | ^ ~`` on booleans, ``abs``, and — through
``__torch_function__`` — ``torch.where``, ``torch.logical_and/or/not/xor``,
``torch.minimum/maximum`` and ``torch.abs``. A tensor the program reads from its globals
or closure (document ids, a prefix length table) becomes an *uninterpreted* integer array
of any length: ``doc[b, q_idx]`` is ``doc(b, q_idx)``, a z3 function, so the theorem holds
for every content the array may have — or for every content meeting what the user states
(``nondecreasing`` along the last axis, given as ``--assume NAME:nondecreasing``). Any other
operation (a Python ``if`` on a traced value, ``.item()``, a float, a torch function not
listed) raises :class:`Untraceable` naming it: the all-n proof is then not made, and the
enumerated proof still runs.

A stated ``nondecreasing`` is added as its ground instances ``p ≤ p' ⇒ doc(p) ≤ doc(p')``
over every pair of index terms the formula reads the array at: a model of them gives the
array's values at those points in nondecreasing order, which extends to a nondecreasing
array of any length (repeat the previous value in between), so a counterexample found
under them is a real one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .solver import load

CONSTRAINTS = ("nondecreasing",)


class Untraceable(Exception):
    """The mod uses an operation the tracer does not model (the message names it)."""


def _z3_of(x: Any) -> Any:
    if isinstance(x, Traced):
        return x.term
    if isinstance(x, (bool, np.bool_)):
        return load().BoolVal(bool(x))
    if isinstance(x, (int, np.integer)):
        return load().IntVal(int(x))
    raise Untraceable(f"a {type(x).__name__} value ({x!r}) in a traced expression")


def _positive_constant(x: Any, op: str) -> int:
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x > 0:
        return int(x)
    raise Untraceable(f"{op} by {x!r}: only a positive integer constant is traced")


class Traced:
    """An integer or boolean z3 term standing for an index tensor (or an expression of one)."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, term: Any, reads: list | None = None) -> None:
        self.term = term
        self.reads = reads if reads is not None else []

    def _new(self, term: Any, *others: Any) -> Traced:
        reads = list(self.reads)
        for o in others:
            if isinstance(o, Traced):
                reads += o.reads
        return Traced(term, reads)

    def _is_bool(self) -> bool:
        return load().is_bool(self.term)

    def _int(self, op: str) -> Any:
        if self._is_bool():
            raise Untraceable(f"{op} on a boolean")
        return self.term

    # arithmetic
    def __add__(self, o: Any) -> Traced:
        return self._new(self._int("+") + _z3_of(o), o)

    __radd__ = __add__

    def __sub__(self, o: Any) -> Traced:
        return self._new(self._int("−") - _z3_of(o), o)

    def __rsub__(self, o: Any) -> Traced:
        return self._new(_z3_of(o) - self._int("−"), o)

    def __mul__(self, o: Any) -> Traced:
        return self._new(self._int("×") * _z3_of(o), o)

    __rmul__ = __mul__

    def __neg__(self) -> Traced:
        return self._new(-self._int("unary −"))

    def __floordiv__(self, o: Any) -> Traced:
        return self._new(self._int("//") / _positive_constant(o, "//"))  # z3: floor for d > 0

    def __mod__(self, o: Any) -> Traced:
        return self._new(self._int("%") % _positive_constant(o, "%"))

    def __abs__(self) -> Traced:
        t = self._int("abs")
        return self._new(load().If(t >= 0, t, -t))

    def __truediv__(self, o: Any) -> Traced:
        raise Untraceable("true division / (a float): use // for integer division")

    __rtruediv__ = __truediv__

    def __pow__(self, o: Any) -> Traced:
        raise Untraceable("** on a traced index")

    # comparisons
    def __lt__(self, o: Any) -> Traced:
        return self._new(self._int("<") < _z3_of(o), o)

    def __le__(self, o: Any) -> Traced:
        return self._new(self._int("≤") <= _z3_of(o), o)

    def __gt__(self, o: Any) -> Traced:
        return self._new(self._int(">") > _z3_of(o), o)

    def __ge__(self, o: Any) -> Traced:
        return self._new(self._int("≥") >= _z3_of(o), o)

    def __eq__(self, o: Any) -> Traced:  # type: ignore[override]
        return self._new(self.term == _z3_of(o), o)

    def __ne__(self, o: Any) -> Traced:  # type: ignore[override]
        return self._new(self.term != _z3_of(o), o)

    # connectives
    def _bool(self, op: str) -> Any:
        if not self._is_bool():
            raise Untraceable(f"bitwise {op} on integers")
        return self.term

    def __and__(self, o: Any) -> Traced:
        return self._new(load().And(self._bool("&"), _bool_of(o, "&")), o)

    __rand__ = __and__

    def __or__(self, o: Any) -> Traced:
        return self._new(load().Or(self._bool("|"), _bool_of(o, "|")), o)

    __ror__ = __or__

    def __xor__(self, o: Any) -> Traced:
        return self._new(load().Xor(self._bool("^"), _bool_of(o, "^")), o)

    __rxor__ = __xor__

    def __invert__(self) -> Traced:
        return self._new(load().Not(self._bool("~")))

    # what cannot be traced
    def __bool__(self) -> bool:
        raise Untraceable(
            "a Python if / and / or / not on a traced value (write & | ~ or torch.where)"
        )

    def __index__(self) -> int:
        raise Untraceable("a traced index used as a Python integer (indexing a list, range)")

    def __float__(self) -> float:
        raise Untraceable("float() of a traced index")

    def __getattr__(self, name: str) -> Any:
        if name in ("long", "int", "to", "clone", "detach"):
            return lambda *args, **kwargs: self  # integer conversions keep the value
        raise Untraceable(f"the tensor method .{name}()")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        handler = TORCH_FUNCTIONS.get(name)
        if handler is None:
            raise Untraceable(f"torch.{name}")
        return handler(*args, **(kwargs or {}))


def _bool_of(x: Any, op: str) -> Any:
    if isinstance(x, Traced):
        return x._bool(op)
    if isinstance(x, (bool, np.bool_)):
        return load().BoolVal(bool(x))
    raise Untraceable(f"{op} with a {type(x).__name__}")


def _lift(x: Any) -> Traced:
    return x if isinstance(x, Traced) else Traced(_z3_of(x))


def _where(cond: Any, a: Any, b: Any) -> Traced:
    c = _lift(cond)
    return c._new(load().If(c._bool("torch.where"), _z3_of(a), _z3_of(b)), a, b)


def _minimum(a: Any, b: Any) -> Traced:
    x, y = _lift(a), _lift(b)
    return x._new(load().If(x.term <= y.term, x.term, y.term), y)


def _maximum(a: Any, b: Any) -> Traced:
    x, y = _lift(a), _lift(b)
    return x._new(load().If(x.term >= y.term, x.term, y.term), y)


def where(cond: Any, a: Any, b: Any) -> Any:
    """``torch.where`` for a block mod written without torch (traced values or Python's)."""
    if isinstance(cond, Traced):
        return _where(cond, a, b)
    return a if cond else b


TORCH_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "where": _where,
    "logical_and": lambda a, b: _lift(a) & b,
    "logical_or": lambda a, b: _lift(a) | b,
    "logical_xor": lambda a, b: _lift(a) ^ b,
    "logical_not": lambda a: ~_lift(a),
    "minimum": _minimum,
    "maximum": _maximum,
    "abs": lambda a: abs(_lift(a)),
    "__and__": lambda a, b: _lift(a) & b,
    "__or__": lambda a, b: _lift(a) | b,
    "__invert__": lambda a: ~_lift(a),
    "__getitem__": lambda a, index: a[index],
}


# --- arrays the program reads ---------------------------------------------------------------
@dataclass
class Array:
    """An integer tensor of the program, uninterpreted: ``name(index…)`` for any content."""

    name: str
    ndim: int
    values: Any  # the program's own tensor (for the cross-check at its length)
    reads: list = field(default_factory=list)  # (index terms) it was read at

    def __getitem__(self, index: Any) -> Traced:
        index = index if isinstance(index, tuple) else (index,)
        if len(index) != self.ndim:
            raise Untraceable(f"{self.name}[…] with {len(index)} of its {self.ndim} indices")
        terms = tuple(_z3_of(i) for i in index)
        z3 = load()
        fn = z3.Function(self.name, *([z3.IntSort()] * (self.ndim + 1)))
        self.reads.append(terms)
        return Traced(fn(*terms), [(self, terms)])

    def __getattr__(self, name: str) -> Any:
        raise Untraceable(f"{self.name}.{name} (an array's shape or method)")


def _is_array(x: Any) -> bool:
    if isinstance(x, np.ndarray):
        return x.dtype.kind in "iub"
    module = type(x).__module__
    return module.startswith("torch") and hasattr(x, "dtype") and not x.dtype.is_floating_point


def _arrays_of(fn: Callable) -> dict[str, Any]:
    """The integer tensors ``fn`` reads by name: its globals and closure cells."""
    code = fn.__code__
    found = {}
    for name in code.co_names:
        value = fn.__globals__.get(name)
        if value is not None and _is_array(value):
            found[name] = value
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        if _is_array(cell.cell_contents):
            found[name] = cell.cell_contents
    return found


@dataclass
class Trace:
    """A traced mask_mod: ``allowed`` over the z3 integers ``b, h, i, j`` and its arrays."""

    allowed: Any
    indices: tuple[Any, Any, Any, Any]
    arrays: dict[str, Array]
    assumptions: dict[str, str]

    def facts(self) -> list[Any]:
        """The stated constraints, as ground instances over the points each array is read at."""
        z3 = load()
        out = []
        for name, constraint in self.assumptions.items():
            array = self.arrays[name]
            if constraint != "nondecreasing":
                raise ValueError(f"--assume {name}:{constraint}: known are {CONSTRAINTS}")
            fn = z3.Function(name, *([z3.IntSort()] * (array.ndim + 1)))
            points = list(dict.fromkeys(array.reads, None))
            for p, r in itertools.permutations(points, 2):
                same_lead = [x == y for x, y in zip(p[:-1], r[:-1])]
                out.append(z3.Implies(z3.And(*same_lead, p[-1] <= r[-1]), fn(*p) <= fn(*r)))
        return out


def trace(fn: Callable, assumptions: dict[str, str] | None = None, names: str = "b h i j") -> Trace:
    """``fn(b, h, q_idx, kv_idx)`` over z3 integers; :class:`Untraceable` if it cannot be."""
    z3 = load()
    indices = tuple(z3.Ints(names))
    arrays = {name: Array(name, np.ndim(value), value) for name, value in _arrays_of(fn).items()}
    assumptions = dict(assumptions or {})
    for name in assumptions:
        if name not in arrays:
            raise ValueError(
                f"--assume names {name!r}, but {getattr(fn, '__qualname__', fn)} reads no "
                f"integer array of that name (it reads: {', '.join(arrays) or 'none'})"
            )
    patched = _with_globals(fn, arrays)
    try:
        out = patched(*(Traced(t) for t in indices))
    except Untraceable:
        raise
    except Exception as error:  # the program did something the tracer has no model of
        raise Untraceable(f"{type(error).__name__}: {error}") from error
    if isinstance(out, (bool, np.bool_)):
        out = Traced(z3.BoolVal(bool(out)))
    if not isinstance(out, Traced) or not out._is_bool():
        raise Untraceable(f"the mod returned {type(out).__name__}, not a traced boolean")
    return Trace(out.term, indices, arrays, assumptions)


def _with_globals(fn: Callable, arrays: dict[str, Array]) -> Callable:
    """``fn`` with its arrays (globals and closure cells) replaced by :class:`Array` s."""
    import types

    glob = dict(fn.__globals__)
    glob.update({k: v for k, v in arrays.items() if k in fn.__code__.co_names})
    cells = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        cells.append(types.CellType(arrays[name]) if name in arrays else cell)
    return types.FunctionType(fn.__code__, glob, fn.__name__, fn.__defaults__, tuple(cells))
