"""The number-system protocol (``ctx``) that the tiled algorithm is written against.

Modelled on mpmath's contexts: the algorithm (:mod:`exactattn.core.algorithm`), the naive
reference (:mod:`exactattn.core.naive`), the score modifications (:mod:`exactattn.core.scores`),
the masks and the input checks call only the methods below, so the same code runs over IEEE
floats, arbitrary-precision mpf numbers, arb balls, emulated formats and exact sympy
expressions.

The protocol, 34 methods and one flag (``running_max``) in all:

* converting — ``asarray``, ``compute``, ``output``, ``round_p``, ``pv_product`` (the policy's
  three element types, see :class:`ArrayContext`), ``as_compute``, ``adopt``, ``comparable``
  (an output as a comparison with a reference reads it);
* numbers — ``scalar``, ``scalar_arg``, ``default_scale``, ``neg_inf``, ``exact_floats`` (binary
  floats as the exact numbers this system's conversions take);
* building — ``full``, ``zeros``, ``index``, ``broadcast_to``;
* the algorithm's arithmetic — ``matmul``, ``transpose``, ``exp``, ``exp_shifted``, ``log``,
  ``tanh``, ``maximum``, ``rowmax``, ``rowsum``, ``where``, ``sum_to``;
* tests the checks need — ``is_neg_inf``, ``nonfinite``, ``all_finite``, ``nonpositive``,
  ``any``;
* scoping — ``scope`` (precision for one public call).

``+ − × ÷`` and indexing are the arrays' own operators. :class:`ArrayContext` implements
everything for NumPy arrays (any dtype, object arrays included); a backend module is a thin
subclass that fixes the element type, the working precision and the few elementwise
functions that differ. Two contexts are equal when they are the same number system at the
same precision (type and :attr:`name`).
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

Array = Any  # an array of the backend (np.ndarray, torch.Tensor)


class ArrayContext:
    """Base number system over NumPy arrays.

    Three kinds of element type meet in a run:

    * *storage*: what the inputs and outputs are held in (``float16`` for an fp16 run);
    * *compute*: what scores, the running summary (m, ℓ, z) and the gradient accumulators
      are held in (``float32`` for the FlashAttention-2 policy on fp16 inputs);
    * *p cast*: the element type ``p`` is rounded to before the ``p·V`` product (FA-2
      rounds ``p`` to the input dtype); ``None`` keeps ``p`` in the compute type.
    """

    name: str = "abstract"
    compute_dtype: Any = None

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.name == self.name

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.name))

    def __repr__(self) -> str:
        return f"<exactattn backend {self.name}>"

    # --- converting -------------------------------------------------------------------
    def asarray(self, x: Any) -> Array:
        """Convert a caller's array to this system's storage type."""
        raise NotImplementedError

    def compute(self, x: Array) -> Array:
        """Cast a storage array to the compute type (no copy when they agree)."""
        return x

    def output(self, x: Array) -> Array:
        """Cast a compute array back to the storage type for returning."""
        return x

    def round_p(self, p: Array) -> Array:
        """Round ``p`` as the precision policy prescribes before the ``p·V`` product."""
        return p

    def pv_product(self, p: Array, v: Array) -> Array:
        """``round_p(p) · V``: the product a low-bit context accumulates in its own format
        (:mod:`exactattn.backends.lowbit_backend`); everyone else's ``matmul``."""
        return self.matmul(self.round_p(p), v)

    #: FlashAttention-2's online softmax: a block's ``p`` is taken against the running max
    #: ``max(m_old, m_block)`` (the same summary; what a cast of ``p`` sees differs).
    running_max: bool = False

    def as_compute(self, x: Any) -> Array:
        """Convert a caller's array straight to the compute type (retained statistics)."""
        return self.compute(self.asarray(x))

    def adopt(self, x: Any) -> np.ndarray:
        """A caller-owned array (a dense mask, key lengths) as this system's array, dtype kept."""
        if hasattr(x, "detach"):  # a torch tensor, possibly on a GPU
            x = x.detach().cpu().numpy()
        return np.asarray(x)

    def comparable(self, x: Array) -> Any:
        """An output as a comparison with a reference reads it: float64 NumPy, the exact
        conversion of every binary format below it (``longdouble`` is kept, float64 would round
        it); object contexts give their numbers (``mpf``) or an enclosure's ``(midpoint,
        radius)``."""
        arr = np.asarray(x)
        return arr if arr.dtype == np.longdouble else arr.astype(np.float64)

    # --- numbers ------------------------------------------------------------------------
    def scalar(self, x: Any) -> Any:
        """A number of the compute type (the scale ``c``, constants)."""
        raise NotImplementedError

    def scalar_arg(self, name: str, x: Any) -> Any:
        """A caller's real scalar argument (``scale``, ``softcap``) checked and converted."""
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise TypeError(f"{name} must be a real number; got {type(x).__name__} {x!r}")
        if not np.isfinite(float(x)):
            raise ValueError(f"{name} must be finite; got {x}")
        converted = self.scalar(x)
        if not np.isfinite(float(converted)):
            raise FloatingPointError(f"{name} {x} overflows {self.name}; use a wider compute type")
        return converted

    def default_scale(self, d: int) -> Any:
        """The default score scale ``c = 1/sqrt(d)``."""
        raise NotImplementedError

    def exact_floats(self, x: Any) -> Any:
        """Binary floats (a float, a float array) as the exact numbers they denote, in the form
        ``asarray``, ``as_compute`` and ``scalar_arg`` convert without rounding a value the
        system holds: the floats themselves for a binary number system (its conversions round
        only what it cannot hold). An exact system whose own conversion of a float is not
        exact gives its exact numbers instead (sympy: ``sympify(0.1)`` is a 15-digit
        ``Float``, the rational ``3602879701896397/2^55`` is what ``0.1`` is)."""
        return x

    @property
    def neg_inf(self) -> Any:
        """−∞ of the compute type: the ``m`` of the empty summary ⊥."""
        raise NotImplementedError

    # --- building -----------------------------------------------------------------------
    def full(self, shape: tuple[int, ...], value: Any) -> Array:
        out = np.empty(shape, dtype=self.compute_dtype)
        out.fill(value)
        return out

    def zeros(self, shape: tuple[int, ...]) -> Array:
        return self.full(shape, self.scalar(0))

    def index(self, start: int, stop: int) -> np.ndarray:
        """Integer positions ``start..stop-1`` (int64) for masks, dropout and score mods."""
        return np.arange(start, stop, dtype=np.int64)

    def broadcast_to(self, x: Array, shape: tuple[int, ...]) -> Array:
        return np.broadcast_to(x, shape)

    # --- the algorithm's arithmetic ----------------------------------------------------
    def matmul(self, a: Array, b: Array) -> Array:
        return a @ b

    def transpose(self, a: Array) -> Array:
        """Swap the last two axes."""
        return np.swapaxes(a, -1, -2)

    def exp(self, x: Array) -> Array:
        return np.exp(x)

    def exp_shifted(self, s: Array, shift: Array) -> Array:
        """``exp(s − shift[..., None])``; may overwrite ``s`` (it is a scratch tile)."""
        return self.exp(s - shift[..., None])

    def log(self, x: Array) -> Array:
        return np.log(x)

    def tanh(self, x: Array) -> Array:
        return np.tanh(x)

    def maximum(self, a: Array, b: Array) -> Array:
        return np.maximum(a, b)

    def rowmax(self, x: Array) -> Array:
        """Maximum over the last axis; −∞ for a row of −∞ (or an empty row)."""
        if x.shape[-1] == 0:
            return self.full(x.shape[:-1], self.neg_inf)
        return np.max(x, axis=-1)

    def rowsum(self, x: Array) -> Array:
        return np.sum(x, axis=-1)

    def where(self, cond: Array, a: Any, b: Any) -> Array:
        return np.where(cond, a, b)

    def sum_to(self, x: Array, shape: tuple[int, ...]) -> Array:
        """Sum ``x`` over the leading axes that broadcasting added to reach ``shape``."""
        extra = x.ndim - len(shape)
        if extra:
            x = np.sum(x, axis=tuple(range(extra)))
        axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
        return np.sum(x, axis=axes, keepdims=True) if axes else x

    # --- tests the checks need ---------------------------------------------------------
    def is_neg_inf(self, x: Array) -> np.ndarray:
        return np.isneginf(x)

    def nonfinite(self, x: Array) -> np.ndarray:
        """Boolean mask of entries that are NaN or ±∞."""
        return ~np.isfinite(x)

    def all_finite(self, x: Array) -> bool:
        """No NaN or ±∞ in ``x``.

        One reduction first: a NaN or ±inf entry makes the sum NaN or ±inf, so a finite sum
        clears the whole array; only a non-finite sum (or one that overflowed) is searched.
        """
        if not self.any(self.nonfinite(self.rowsum(x.reshape(-1)))):
            return True
        return not self.any(self.nonfinite(x))

    def nonpositive(self, x: Array) -> Array:
        """Boolean mask of entries provably ``≤ 0``."""
        return x <= 0

    def any(self, x: Array) -> bool:
        # the method skips np.any's dispatch, the cost of a small tile's test
        return bool(x.any()) if isinstance(x, np.ndarray) else bool(np.any(x))

    # --- scoping -----------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Precision scope for one public call (restored on exit); a no-op for IEEE."""
        yield


def elementwise(fn: Callable[[Any], Any], x: np.ndarray) -> np.ndarray:
    """``fn`` on every entry of an object array (the numbers' own functions)."""
    return np.asarray(np.frompyfunc(fn, 1, 1)(x), dtype=object)


class ObjectContext(ArrayContext):
    """Numbers that ride in NumPy object arrays (mpf, arb, sympy expressions).

    ``@``, ``+``, ``*``, ``np.where`` and ``np.sum`` work on object arrays as they are;
    the subclass supplies the elementwise ``exp``, ``log``, ``tanh``, the max and the
    finiteness test of its number type (as ``_exp``, ``_log``, ``_tanh``, ``_max2``,
    ``_finite``).
    """

    compute_dtype = object
    _exp: Callable[[Any], Any]
    _log: Callable[[Any], Any]
    _tanh: Callable[[Any], Any]
    _max2: Callable[[Any, Any], Any] = staticmethod(max)
    _finite: Callable[[Any], bool]

    def _convert(self, x: Any) -> Any:
        raise NotImplementedError

    def asarray(self, x: Any) -> np.ndarray:
        arr = np.asarray(x, dtype=object)
        return np.frompyfunc(self._convert, 1, 1)(arr).astype(object, copy=False)

    def comparable(self, x: Array) -> np.ndarray:
        """The numbers themselves (``mpf`` entries are read as they are)."""
        return np.asarray(x, dtype=object)

    def exp(self, x: np.ndarray) -> np.ndarray:
        return elementwise(self._exp, x)

    def log(self, x: np.ndarray) -> np.ndarray:
        return elementwise(self._log, x)

    def tanh(self, x: np.ndarray) -> np.ndarray:
        return elementwise(self._tanh, x)

    def is_neg_inf(self, x: Array) -> np.ndarray:
        neg_inf = self.neg_inf
        return np.frompyfunc(lambda e: bool(e == neg_inf), 1, 1)(x).astype(bool)

    def nonfinite(self, x: np.ndarray) -> np.ndarray:
        finite = self._finite
        return np.frompyfunc(lambda e: not finite(e), 1, 1)(x).astype(bool)

    def all_finite(self, x: Array) -> bool:
        return not self.any(self.nonfinite(x))

    def nonpositive(self, x: Array) -> Array:
        return np.frompyfunc(lambda e: bool(e <= 0), 1, 1)(x).astype(bool)

    def rowmax(self, x: Array) -> Array:
        if x.shape[-1] == 0:
            return self.full(x.shape[:-1], self.neg_inf)
        return np.frompyfunc(self._max2, 2, 1).reduce(x, axis=-1)

    def maximum(self, a: Array, b: Array) -> Array:
        return np.frompyfunc(self._max2, 2, 1)(a, b)
