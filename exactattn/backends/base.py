"""The number-system protocol (``ctx``) that the tiled algorithm is written against.

Modelled on mpmath's contexts: the algorithm in :mod:`exactattn.algorithm` and the naive
reference in :mod:`exactattn.reference` call only the methods below, so the same code runs
over IEEE floats, arbitrary-precision mpf numbers, arb balls and exact sympy expressions.

:class:`ArrayContext` implements the protocol for NumPy arrays (any dtype, object arrays
included); a backend module is a thin subclass that fixes the element type, the working
precision and the few elementwise functions that differ.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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
    exact: bool = False  # True when ⋆, exp and + introduce no rounding at all (sympy)

    # --- construction -----------------------------------------------------------------
    def asarray(self, x: Any) -> Array:
        """Convert a caller's array to this system's storage type."""
        raise NotImplementedError

    def as_compute(self, x: Any) -> Array:
        """Convert a caller's array straight to the compute type (retained statistics)."""
        return self.compute(self.asarray(x))

    def compute(self, x: Array) -> Array:
        """Cast a storage array to the compute type (no copy when they agree)."""
        return x

    def output(self, x: Array) -> Array:
        """Cast a compute array back to the storage type for returning."""
        return x

    def round_p(self, p: Array) -> Array:
        """Round ``p`` as the precision policy prescribes before the ``p·V`` product."""
        return p

    def scalar(self, x: Any) -> Any:
        """A number of the compute type (the scale ``c``, constants)."""
        raise NotImplementedError

    def default_scale(self, d: int) -> Any:
        """The default score scale ``c = 1/sqrt(d)``."""
        raise NotImplementedError

    @property
    def neg_inf(self) -> Any:
        """−∞ of the compute type: the ``m`` of the empty summary ⊥."""
        raise NotImplementedError

    def full(self, shape: tuple[int, ...], value: Any) -> Array:
        out = np.empty(shape, dtype=self.compute_dtype)
        out.fill(value)
        return out

    def zeros(self, shape: tuple[int, ...]) -> Array:
        return self.full(shape, self.scalar(0))

    def adopt(self, x: Any) -> np.ndarray:
        """A caller-owned array (a dense mask, key lengths) as this system's array, dtype kept."""
        if hasattr(x, "detach"):  # a torch tensor, possibly on a GPU
            x = x.detach().cpu().numpy()
        return np.asarray(x)

    def index(self, start: int, stop: int) -> np.ndarray:
        """Integer positions ``start..stop-1`` for evaluating mask predicates."""
        return np.arange(start, stop)

    # --- arithmetic the algorithm needs -----------------------------------------------
    def matmul(self, a: Array, b: Array) -> Array:
        return a @ b

    def transpose(self, a: Array) -> Array:
        """Swap the last two axes."""
        return np.swapaxes(a, -1, -2)

    def exp(self, x: Array) -> Array:
        return np.exp(x)

    def log(self, x: Array) -> Array:
        return np.log(x)

    def exp_shifted(self, s: Array, shift: Array) -> Array:
        """``exp(s − shift[..., None])``; may overwrite ``s`` (it is a scratch tile)."""
        return self.exp(s - shift[..., None])

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

    def is_neg_inf(self, x: Array) -> np.ndarray:
        return np.isneginf(x)

    def any(self, x: Array) -> bool:
        return bool(np.any(x))

    def sum_to(self, x: Array, shape: tuple[int, ...]) -> Array:
        """Sum ``x`` over the leading axes that broadcasting added to reach ``shape``."""
        extra = x.ndim - len(shape)
        if extra:
            x = np.sum(x, axis=tuple(range(extra)))
        axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
        return np.sum(x, axis=axes, keepdims=True) if axes else x

    def broadcast_to(self, x: Array, shape: tuple[int, ...]) -> Array:
        return np.broadcast_to(x, shape)

    # --- checks and scoping ------------------------------------------------------------
    def nonfinite(self, x: Array) -> np.ndarray:
        """Boolean mask of entries that are NaN or ±∞."""
        return ~np.isfinite(x)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Precision scope for one public call (restored on exit); a no-op for IEEE."""
        yield

    compute_dtype: Any = None

    def __repr__(self) -> str:
        return f"<exactattn backend {self.name}>"


class ObjectContext(ArrayContext):
    """Numbers that ride in NumPy object arrays (mpf, arb, sympy expressions).

    ``@``, ``+``, ``*``, ``np.where`` and ``np.sum`` work on object arrays as they are;
    the subclass supplies the elementwise ``exp``, ``log`` and ``max`` of its number type.
    """

    compute_dtype = object

    def _convert(self, x: Any) -> Any:
        raise NotImplementedError

    def asarray(self, x: Any) -> np.ndarray:
        arr = np.asarray(x, dtype=object)
        return np.frompyfunc(self._convert, 1, 1)(arr).astype(object, copy=False)

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.full(shape, self.scalar(0))

    def exp_shifted(self, s: Array, shift: Array) -> Array:
        return self.exp(s - shift[..., None])

    def is_neg_inf(self, x: Array) -> np.ndarray:
        neg_inf = self.neg_inf
        return np.frompyfunc(lambda e: bool(e == neg_inf), 1, 1)(x).astype(bool)

    def rowmax(self, x: Array) -> Array:
        if x.shape[-1] == 0:
            return self.full(x.shape[:-1], self.neg_inf)
        return self._max.reduce(x, axis=-1)

    def maximum(self, a: Array, b: Array) -> Array:
        return self._max(a, b)

    @property
    def _max(self) -> np.ufunc:
        return np.frompyfunc(max, 2, 1)
