"""The functions a ``score_mod`` may call, on every number system, and its derivative.

A FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)`` maps one score to another. On
torch the score is a tensor and the mod may call torch functions directly. On the NumPy,
mpmath, flint and sympy backends the score is a :class:`Dual`: the score tile of that
backend, carried with a tangent, so that one evaluation of the mod gives both ``mod(s)``
and ``∂mod/∂s`` (forward-mode differentiation: ``f(x + εẋ) = f(x) + ε·f′(x)·ẋ`` with
``ε² = 0``). The reverse pass needs exactly that factor: ``γ ↦ γ·∂mod/∂s``.

A mod written with arithmetic operators (``+ − × ÷``, a constant power), constants
(Python numbers, NumPy arrays, torch tensors indexed by the index tensors, such as
``alibi_slopes[h]`` or ``bias_table[h, q_idx − kv_idx]``) and the functions of this module
(:func:`exp`, :func:`log`, :func:`tanh`, :func:`sqrt`, :func:`abs`, :func:`where`,
:func:`minimum`, :func:`maximum`) therefore runs on every backend. Each function dispatches
on its argument's type: a :class:`Dual` (the rule of its derivative), a torch tensor
(torch's function), a NumPy float array or number (NumPy's), an object array of mpmath
``mpf``, python-flint ``arb`` or sympy entries (that library's function per entry). A torch
function given a :class:`Dual` raises :class:`TorchFunctionOnScore`, which the score_mod's
caller turns into an error naming the mod.

Comparisons of scores give boolean arrays; on sympy a comparison of symbols stays a
relation and :func:`where` becomes ``Piecewise``; on flint a comparison of overlapping
balls is undecided and raises (a certified result cannot pick a side).

:func:`specification` evaluates a mask_mod and a score_mod on the whole index grid with
sympy scores, straight from their definitions (the specification side of a proof).
"""

from __future__ import annotations

import builtins
import functools
import importlib
import operator
import sys
from collections.abc import Callable
from typing import Any

import numpy as np


class TorchFunctionOnScore(TypeError):
    """A torch function was called with a :class:`Dual` score (a non-torch backend).

    A ``TypeError``: torch's operators catch it and let Python try the :class:`Dual`'s
    reflected operator (``tensor + score``), so only genuine torch function calls surface.
    """

    def __init__(self, function: str):
        self.function = function
        super().__init__(f"torch.{function} was called on a score that is not a torch tensor")


# --- dual numbers -----------------------------------------------------------------------------
class Dual:
    """``value + ε·tangent`` with ``ε² = 0``: arrays of one backend ``ctx``.

    ``tangent`` is ``None`` for a constant (derivative 0). Constants met in arithmetic
    (numbers, NumPy arrays, torch tensors) are converted to ``ctx``'s compute type.
    """

    __slots__ = ("ctx", "tangent", "value")
    __array_ufunc__ = None  # NumPy operators defer to the reflected operators below

    def __init__(self, ctx: Any, value: Any, tangent: Any = None):
        self.ctx, self.value, self.tangent = ctx, value, tangent

    @property
    def shape(self) -> tuple[int, ...]:
        shapes = [np.shape(self.value)]
        if self.tangent is not None:
            shapes.append(np.shape(self.tangent))
        return tuple(np.broadcast_shapes(*shapes))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise TorchFunctionOnScore(getattr(func, "__name__", str(func)))

    def lift(self, x: Any) -> Dual:
        """``x`` as a :class:`Dual` of this context (a constant unless it is one already)."""
        return x if isinstance(x, Dual) else Dual(self.ctx, constant(self.ctx, x))

    def __add__(self, other: Any) -> Dual:
        other = self.lift(other)
        return Dual(self.ctx, self.value + other.value, _sum(self.tangent, other.tangent))

    __radd__ = __add__

    def __neg__(self) -> Dual:
        return Dual(self.ctx, -self.value, None if self.tangent is None else -self.tangent)

    def __sub__(self, other: Any) -> Dual:
        return self + (-self.lift(other))

    def __rsub__(self, other: Any) -> Dual:
        return self.lift(other) + (-self)

    def __mul__(self, other: Any) -> Dual:
        other = self.lift(other)
        tangent = _sum(_times(self.tangent, other.value), _times(other.tangent, self.value))
        return Dual(self.ctx, self.value * other.value, tangent)

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> Dual:
        """``(a/b)′ = a′/b − (a/b)·b′/b``."""
        other = self.lift(other)
        value = self.value / other.value
        tangent = _sum(
            _times(self.tangent, 1 / other.value), _times(other.tangent, -value / other.value)
        )
        return Dual(self.ctx, value, tangent)

    def __rtruediv__(self, other: Any) -> Dual:
        return self.lift(other) / self

    def __pow__(self, exponent: Any) -> Dual:
        """``(aⁿ)′ = n·aⁿ⁻¹·a′`` for a constant exponent ``n``."""
        if isinstance(exponent, Dual):
            raise TypeError("a score in an exponent is not supported; write exp(y * log(x))")
        n = constant(self.ctx, exponent)
        return Dual(self.ctx, self.value**n, _times(self.tangent, n * self.value ** (n - 1)))

    def __abs__(self) -> Dual:
        return abs(self)

    def __lt__(self, other: Any) -> Any:
        return _compare(operator.lt, *_comparable(self, other))

    def __le__(self, other: Any) -> Any:
        return _compare(operator.le, *_comparable(self, other))

    def __gt__(self, other: Any) -> Any:
        return _compare(operator.gt, *_comparable(self, other))

    def __ge__(self, other: Any) -> Any:
        return _compare(operator.ge, *_comparable(self, other))


def primal(x: Any) -> Any:
    """The value of ``x`` with every tangent dropped (a nested :class:`Dual` — the
    second-order reverse's ``(s + ε₁) + ε₂`` — unwrapped to its innermost value)."""
    while isinstance(x, Dual):
        x = x.value
    return x


def _sum(a: Any, b: Any) -> Any:
    """Tangents add; ``None`` is 0."""
    return b if a is None else a if b is None else a + b


def _times(tangent: Any, factor: Any) -> Any:
    return None if tangent is None else tangent * factor


def constant(ctx: Any, x: Any) -> Any:
    """A constant of a score_mod (number, NumPy array, torch tensor) in ``ctx``'s compute type.

    Binary floats and integers convert exactly: a float32 tensor's entries become float64
    numbers, mpf numbers, arb midpoints, and on sympy the exact rationals (not ``Float``,
    whose functions sympy would evaluate at 15 digits: ``ctx.exact_floats``); booleans count
    as 0 and 1.
    """
    if hasattr(x, "detach"):  # a torch tensor (an index tensor, or a table indexed by one)
        x = x.detach().cpu().numpy()
    if isinstance(x, (bool, np.bool_)) or (isinstance(x, np.ndarray) and x.dtype == bool):
        x = np.asarray(x).astype(np.int64)
    if np.asarray(x).dtype.kind == "f":
        x = ctx.exact_floats(x)
    if np.ndim(x) == 0:
        return ctx.scalar(x.item() if isinstance(x, (np.ndarray, np.generic)) else x)
    return ctx.as_compute(np.asarray(x))


# --- elementwise functions, dispatched on the argument's type ----------------------------------
def _torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _entry_library(x: np.ndarray) -> str:
    """``mpmath``, ``flint`` or ``sympy``: the library of an object array's entries."""
    first = next(iter(x.flat), None)
    library = type(first).__module__.split(".")[0]
    if library not in _ENTRY_FUNCTIONS:
        raise TypeError(
            f"exactattn.core.ops works on mpmath, python-flint or sympy entries; got {type(first)}"
        )
    return library


def _sympy(name: str) -> Callable[[Any], Any]:
    sympy = importlib.import_module("sympy")
    return getattr(sympy, {"abs": "Abs"}.get(name, name))


def _mpmath(name: str) -> Callable[[Any], Any]:
    mpmath = importlib.import_module("mpmath")
    return builtins.abs if name == "abs" else getattr(mpmath, name)


def _flint(name: str) -> Callable[[Any], Any]:
    if name == "abs":
        return builtins.abs
    method = "sgn" if name == "sign" else name
    return lambda e: getattr(e, method)()


_ENTRY_FUNCTIONS = {"mpmath": _mpmath, "flint": _flint, "sympy": _sympy}


def _apply(name: str, x: Any) -> Any:
    """NumPy's / torch's / the entries' library's function ``name`` on ``x`` (not a Dual)."""
    if _torch_tensor(x):
        return getattr(sys.modules["torch"], name)(x)
    arr = np.asarray(x)
    if arr.dtype != object:
        return getattr(np, name)(arr)
    fn = _ENTRY_FUNCTIONS[_entry_library(arr)](name)
    return np.asarray(np.frompyfunc(fn, 1, 1)(arr), dtype=object)


def exp(x: Any) -> Any:
    """``e^x``; derivative ``e^x``."""
    if isinstance(x, Dual):
        value = exp(x.value)
        return Dual(x.ctx, value, _times(x.tangent, value))
    return _apply("exp", x)


def log(x: Any) -> Any:
    """``log x`` (natural); derivative ``1/x``."""
    if isinstance(x, Dual):
        return Dual(x.ctx, log(x.value), _times(x.tangent, 1 / x.value))
    return _apply("log", x)


def tanh(x: Any) -> Any:
    """``tanh x``; derivative ``1 − tanh² x``."""
    if isinstance(x, Dual):
        value = tanh(x.value)
        return Dual(x.ctx, value, _times(x.tangent, 1 - value * value))
    return _apply("tanh", x)


def sqrt(x: Any) -> Any:
    """``√x``; derivative ``1/(2√x)``."""
    if isinstance(x, Dual):
        value = sqrt(x.value)
        return Dual(x.ctx, value, _times(x.tangent, 1 / (2 * value)))
    return _apply("sqrt", x)


def abs(x: Any) -> Any:  # the name torch and NumPy use
    """``|x|``; derivative ``sign x`` (0 at 0, as torch's)."""
    if isinstance(x, Dual):
        return Dual(x.ctx, abs(x.value), _times(x.tangent, _apply("sign", primal(x.value))))
    return _apply("abs", x)


# --- comparisons and selection ----------------------------------------------------------------
def _condition(cond: Any) -> np.ndarray:
    """A condition as a NumPy array: bool, or object (sympy relations) when undecided."""
    if _torch_tensor(cond):
        cond = cond.detach().cpu().numpy()
    return np.asarray(cond)


def _decided(op: Callable[[Any, Any], Any], a: Any, b: Any) -> Any:
    """``op(a, b)`` on two entries; arb balls must be ordered (both outcomes tested)."""
    out = op(a, b)
    if type(out).__module__.startswith("sympy") and out in (True, False):
        return bool(out)
    if out is False and any(type(x).__module__.startswith("flint") for x in (a, b)):
        negated = {operator.lt: operator.ge, operator.le: operator.gt,
                   operator.gt: operator.le, operator.ge: operator.lt}[op]  # fmt: skip
        if negated(a, b) is False:
            raise ValueError(
                f"comparing the balls {a} and {b} is undecided (they overlap): a certified "
                "result cannot choose a branch; raise the precision or avoid the comparison"
            )
    return out


def _compare(op: Callable[[Any, Any], Any], a: Any, b: Any) -> Any:
    """``op`` elementwise: a boolean array, or an object array of sympy relations."""
    if _torch_tensor(a) or _torch_tensor(b):
        return op(a, b)
    if np.asarray(a).dtype != object and np.asarray(b).dtype != object:
        return op(a, b)
    out = np.frompyfunc(functools.partial(_decided, op), 2, 1)(a, b)
    out = np.asarray(out, dtype=object)
    if builtins.all(isinstance(e, (bool, np.bool_)) for e in out.flat):
        return out.astype(bool)
    return out


def _piecewise(c: Any, a: Any, b: Any) -> Any:
    if isinstance(c, (bool, np.bool_)):
        return a if c else b
    sympy = importlib.import_module("sympy")
    return sympy.Piecewise((a, c), (b, True))


def _select(cond: np.ndarray, a: Any, b: Any) -> Any:
    """``where`` on backend arrays; an undecided (sympy) condition gives ``Piecewise``."""
    if cond.dtype == object:
        return np.asarray(np.frompyfunc(_piecewise, 3, 1)(cond, a, b), dtype=object)
    return np.where(cond, a, b)


def where(cond: Any, a: Any, b: Any) -> Any:
    """``a`` where ``cond`` holds, else ``b``; the derivative is selected the same way."""
    duals = [x for x in (a, b) if isinstance(x, Dual)]
    if not duals:
        if _torch_tensor(cond) or _torch_tensor(a) or _torch_tensor(b):
            return sys.modules["torch"].where(cond, a, b)
        return _select(_condition(cond), a, b)
    a, b = (duals[0].lift(x) for x in (a, b))
    cond = _condition(cond)
    tangent = None
    if a.tangent is not None or b.tangent is not None:
        zero = a.ctx.scalar(0)
        tangent = _either(
            cond, zero if a.tangent is None else a.tangent, zero if b.tangent is None else b.tangent
        )
    return Dual(a.ctx, _either(cond, a.value, b.value), tangent)


def _either(cond: np.ndarray, a: Any, b: Any) -> Any:
    """:func:`_select`, or :func:`where` again when a side is itself a :class:`Dual`."""
    if isinstance(a, Dual) or isinstance(b, Dual):
        return where(cond, a, b)
    return _select(cond, a, b)


def _comparable(a: Any, b: Any) -> tuple[Any, Any]:
    """The values to compare: a :class:`Dual`'s value, constants in its context."""
    dual = a if isinstance(a, Dual) else b if isinstance(b, Dual) else None
    return (a, b) if dual is None else (primal(dual.lift(a)), primal(dual.lift(b)))


def minimum(a: Any, b: Any) -> Any:
    """The smaller of ``a`` and ``b`` (at a tie, ``a`` and its derivative)."""
    if _torch_tensor(a) and _torch_tensor(b):
        return sys.modules["torch"].minimum(a, b)
    return where(_compare(operator.le, *_comparable(a, b)), a, b)


def maximum(a: Any, b: Any) -> Any:
    """The larger of ``a`` and ``b`` (at a tie, ``a`` and its derivative)."""
    if _torch_tensor(a) and _torch_tensor(b):
        return sys.modules["torch"].maximum(a, b)
    return where(_compare(operator.ge, *_comparable(a, b)), a, b)


# --- the specification side of a proof --------------------------------------------------------
def grid_indices(batch: tuple[int, int], n_q: int, n_k: int) -> tuple[Any, Any, Any, Any]:
    """``(b, h, q_idx, kv_idx)`` over the whole grid, broadcasting to ``(B, H, n_q, n_k)``:
    int64 torch tensors (NumPy arrays when torch is not installed)."""
    shapes = ((-1, 1, 1, 1), (1, -1, 1, 1), (1, 1, -1, 1), (1, 1, 1, -1))
    sizes = (*batch, n_q, n_k)
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return tuple(np.arange(n, dtype=np.int64).reshape(s) for n, s in zip(sizes, shapes))
    return tuple(torch.arange(n, dtype=torch.int64).reshape(s) for n, s in zip(sizes, shapes))


def specification(
    n_q: int,
    n_k: int,
    *,
    batch: tuple[int, int] = (1, 1),
    mask_mod: Callable[..., Any] | None = None,
    score_mod: Callable[..., Any] | None = None,
    scores: Any = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """A mask_mod and a score_mod on the whole ``(B, H, n_q, n_k)`` grid, from their definitions.

    For the specification side of a proof: the mods are called once on the grid's index
    tensors (:func:`grid_indices`, built here; never through the tile iterator), the score
    being sympy. Returns ``(allowed, modified)``: ``allowed`` a NumPy bool array, the
    mask_mod at every ``(b, h, i, j)`` (all True without one); ``modified`` an object array
    of ``score_mod(s_bhij, b, h, i, j)`` with ``s`` the given ``scores`` (sympy expressions
    broadcastable to the grid; default fresh real symbols ``s_b_h_i_j``), or None without a
    score_mod. The naive attention over ``allowed`` with the ``modified`` scores, and its
    sympy derivative, is then the specification.
    """
    sympy = importlib.import_module("sympy")
    from ..backends import SympyContext

    shape = (*batch, n_q, n_k)
    b, h, i, j = grid_indices(batch, n_q, n_k)
    allowed = np.ones(shape, dtype=bool)
    if mask_mod is not None:
        out = mask_mod(b, h, i, j)
        out = out.detach().cpu().numpy() if hasattr(out, "detach") else np.asarray(out)
        if out.dtype != bool:
            raise TypeError(f"mask_mod must return booleans; got dtype {out.dtype}")
        allowed = np.broadcast_to(out, shape).copy()
    if score_mod is None:
        return allowed, None
    if scores is None:
        scores = np.empty(shape, dtype=object)
        for index in np.ndindex(*shape):
            scores[index] = sympy.Symbol("s_" + "_".join(map(str, index)), real=True)
    ctx = SympyContext()
    out = score_mod(Dual(ctx, np.broadcast_to(np.asarray(scores, dtype=object), shape)), b, h, i, j)
    value = out.value if isinstance(out, Dual) else constant(ctx, out)
    return allowed, np.asarray(np.broadcast_to(value, shape), dtype=object)
