"""Low-precision binary formats emulated on float64 words: bit-level rounding and a ctx.

**The format.** ``F(p, e_min, e_max)`` holds ``0``, ``±∞``, NaN and ``±N·2^{e−p+1}`` with
``e = max(⌊log₂|x|⌋, e_min) ≤ e_max`` and ``N < 2^p`` an integer (``p`` significand bits
including the implicit one, like mpmath's ``prec``: 11 for fp16, 8 for bf16, 24 for fp32);
below ``2^{e_min}`` the spacing stays ``2^{e_min−p+1}`` (gradual underflow). An unbounded
exponent (``e_min = e_max = None``) is mpmath's model, limited only by float64's own range.

**Rounding** ``fl(x)`` of a float64 ``x`` (:func:`round_to_format`): write
``|x| = S·2^t`` with the 53-bit significand integer ``S`` of the float64 word, find the
format's quantum ``2^{t+k}`` at ``|x|`` and round ``S`` to a multiple of ``2^k`` — to nearest
with ties to the even multiple (``nearest``), or by clearing the ``k`` low bits
(``toward_zero``: truncation of the float64 mantissa). A carry out of the significand
moves into the exponent field by itself (the word is ``(E−1)·2^52 + S``). Overflow follows
IEEE 754 §7.4: to ``±∞`` when rounding to nearest, to ``±max`` toward zero. ``±0``, ``±∞``
and NaN pass unchanged; float64 subnormals are rounded like any other value. Every step
is an integer operation on the int64 view of the words, so the same code serves NumPy
arrays and torch float64 tensors (CPU or CUDA) with no loop over elements.

**The ctx** (:class:`EmulatedContext`) runs the tiled algorithm in such a format: its
arrays are float64 whose values are always in the format, and the result of every
operation is rounded — including the arithmetic :mod:`exactattn.core.algorithm` writes with
Python operators (``a.l * alpha + b.l * beta``, ``s *= scale``, ``z / ℓ``). Design: the
arrays are a thin ``ndarray`` subclass, :class:`EmulatedArray`, whose ``__array_ufunc__``
computes each ufunc in float64 and rounds its result (in place for ``out=``, so ``s *=
scale`` and ``dq[..., rows, :] += …`` round too). One hook covers operators, in-place
operators, ``np.exp``/``np.log``, ``np.sum``/``np.max`` (ufunc reductions) and ``@``
(``np.matmul`` is a ufunc); views, slicing, reshaping and slice assignment are inherited
unchanged. A wrapper class with explicit methods would have to re-implement indexing,
views and in-place slice updates, and an algorithm written with operators would bypass it.
NumPy functions that sum products in C without a ufunc (``np.dot``, ``np.einsum``,
``np.cumsum``, …) would return unrounded values and are refused. The public results
(``y`` and the gradients) come back as plain float64 arrays, so a caller's error
arithmetic on them is not rounded; the statistics stay :class:`EmulatedArray`.

Which results are rounded is the ``granularity``:

* ``"scalar"``: every scalar multiply and add. Dot products (``@``) and row sums
  accumulate **sequentially, left to right** over the reduced axis — ``acc = fl(a₀b₀)``,
  then ``acc = fl(acc + fl(a_r b_r))`` for ``r = 1, 2, …`` — a Python loop over the reduced
  axis, vectorised over all the others. This is exactly what mpmath does at ``prec = p``
  on object arrays (``@`` and ``np.sum`` accumulate sequentially, each ``+``/``×`` rounded).
* ``"op"``: each whole operation (a matmul, a row sum, an elementwise op) is computed in
  float64 and its result rounded once: what truncating an FP64 implementation's results
  after each operation does. Golden et al. (2024, "Is Flash Attention Stable?",
  arXiv:2405.02803) simulate lower precision inside an FP64 implementation by truncating
  the mantissas of its results; ``granularity="op", rounding="toward_zero",
  exponent=11`` (FP64's exponent range) is that method. (Only their abstract was
  readable from here; this follows issue 14's account of the method. Were their
  truncation applied per scalar multiply-add instead, ``"scalar"`` would be it.)
  A matmul costs one rounding per output element here, against ``2 × (inner length)``
  in ``"scalar"``.

Elementwise operations (``+ − × ÷``, ``exp``, ``log``, ``sqrt``) are one rounding in either
granularity. Each result is ``fl(float64 result)``: rounding twice, first to float64. For
``+ − × ÷`` (and ``sqrt``) with ``p ≤ 25`` the double rounding is harmless in ``nearest``
(``53 ≥ 2p + 2``), so results equal the correctly rounded ones — bit-identical to mpmath.
``exp``/``log`` come from libm, whose results are within about one float64 ulp of the true
value; ``fl`` of that differs from the correctly rounded value only where a midpoint of the
format lies between the two, and then by one ulp of the format (measured over 2·10^4
arguments per width: never for ``p ≤ 32``, at a rate near ``2^{p−54}`` above; mpmath's own
``exp`` at ``prec = p`` misrounds about 1 in 10^4 — see ``tests/emulated``).

``toward_zero`` rounds the float64 result down, so a float64 rounding *up* onto a format
number (a tiny addend far below the other's last bit) keeps that number: faithful
truncation of FP64 results, not IEEE round-toward-zero of the exact value (the two agree
for products and quotients at ``p ≤ 26``, and for sums unless the addends' exponents
differ by more than ``53 − p``).

The precision policy is the one :class:`~exactattn.backends.numpy_backend.NumpyContext`
has, in emulated formats: inputs are rounded to ``storage`` (default: the compute format),
arithmetic rounds to the compute format, ``p`` is rounded to ``p_cast`` before ``p·V``.
"""

from __future__ import annotations

import numbers
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .protocol import ArrayContext

ROUNDINGS = ("nearest", "toward_zero")
GRANULARITIES = ("scalar", "op")

_SIGN = -(1 << 63)  # the sign bit of an int64 view of a float64 word
_MAGNITUDE = (1 << 63) - 1
_FRACTION_BITS = 52
_EXPONENT_BIAS = 1023
_SPECIAL = 2047  # biased exponent field of ±∞ and NaN
_MAX_SHIFT = 62  # S < 2^53, so any k ≥ 54 already rounds S to 0 or 2^k; keeps shifts < 64


@dataclass(frozen=True)
class EmulatedFormat:
    """A binary format ``F(p, e_min, e_max)`` and a rounding mode.

    ``exponent`` is ``None`` (unbounded, mpmath's model), the IEEE exponent field width
    ``w`` (``e_max = 2^{w−1} − 1``, ``e_min = 1 − e_max``: 5 for fp16, 8 for bf16 and fp32,
    11 for float64) or a pair ``(e_min, e_max)`` with ``−1022 ≤ e_min ≤ e_max ≤ 1023``.
    """

    mantissa_bits: int
    emin: int | None
    emax: int | None
    rounding: str

    @classmethod
    def of(
        cls, mantissa_bits: int, exponent: Any = None, rounding: str = "nearest"
    ) -> EmulatedFormat:
        if (
            isinstance(mantissa_bits, bool)
            or not isinstance(mantissa_bits, numbers.Integral)
            or not 2 <= mantissa_bits <= 53
        ):
            raise ValueError(
                f"mantissa_bits must be an integer in 2..53 (significand bits including the "
                f"implicit one: 11 for fp16, 8 for bf16, 24 for fp32); got {mantissa_bits!r}"
            )
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}; got {rounding!r}")
        emin, emax = _exponent_range(exponent)
        return cls(int(mantissa_bits), emin, emax, rounding)

    @property
    def max_finite(self) -> float:
        """The largest finite value ``(2 − 2^{1−p})·2^{e_max}`` (float64's for unbounded)."""
        if self.emax is None:
            return float(np.finfo(np.float64).max)
        return float(np.ldexp(2.0 - 2.0 ** (1 - self.mantissa_bits), self.emax))

    @property
    def is_float64(self) -> bool:
        """Whether rounding is the identity on float64 (53 bits, float64's exponent range)."""
        return self.mantissa_bits == 53 and self.emin in (None, -1022) and self.emax in (None, 1023)

    def __str__(self) -> str:
        exponent = "unbounded" if self.emin is None else f"[{self.emin},{self.emax}]"
        return f"p={self.mantissa_bits},e={exponent},{self.rounding}"


def _exponent_range(exponent: Any) -> tuple[int | None, int | None]:
    if exponent is None:
        return None, None
    if isinstance(exponent, numbers.Integral) and not isinstance(exponent, bool):
        if not 2 <= exponent <= 11:
            raise ValueError(f"exponent field width must be in 2..11 bits; got {exponent}")
        emax = 2 ** (int(exponent) - 1) - 1
        return 1 - emax, emax
    if (
        isinstance(exponent, tuple)
        and len(exponent) == 2
        and all(isinstance(e, numbers.Integral) and not isinstance(e, bool) for e in exponent)
        and -1022 <= exponent[0] <= exponent[1] <= 1023
    ):
        return int(exponent[0]), int(exponent[1])
    raise ValueError(
        "exponent must be None (unbounded), a field width in bits (5 for fp16, 8 for bf16) "
        f"or a pair (emin, emax) with -1022 <= emin <= emax <= 1023; got {exponent!r}"
    )


# --- rounding, on int64 views of float64 words ------------------------------------------
class _NumpyWords:
    """The non-operator steps of the rounding for NumPy int64 arrays."""

    where = staticmethod(np.where)
    clip = staticmethod(np.clip)

    @staticmethod
    def isnan(words: np.ndarray) -> np.ndarray:
        return np.isnan(words.view(np.float64))

    @staticmethod
    def log2_floor(s: np.ndarray) -> np.ndarray:
        """``⌊log₂ s⌋`` for ``1 ≤ s < 2^53``: the exponent field of ``float(s)`` (exact)."""
        return (s.astype(np.float64).view(np.int64) >> _FRACTION_BITS) - _EXPONENT_BIAS


class _TorchWords:
    """The same steps for torch int64 tensors."""

    @staticmethod
    def where(cond: Any, a: Any, b: Any) -> Any:
        import torch

        return torch.where(cond, a, b)

    @staticmethod
    def clip(x: Any, lo: int, hi: int) -> Any:
        return x.clamp(lo, hi)

    @staticmethod
    def isnan(words: Any) -> Any:
        import torch

        return words.view(torch.float64).isnan()

    @staticmethod
    def log2_floor(s: Any) -> Any:
        import torch

        bits = s.to(torch.float64).view(torch.int64)
        return (bits >> _FRACTION_BITS) - _EXPONENT_BIAS


def round_significand(s: Any, k: Any, rounding: str) -> Any:
    """``S`` rounded to a multiple of ``2^k`` (``0 ≤ k ≤ 62``), ties to the even multiple.

    ``toward_zero`` clears the ``k`` low bits. ``nearest`` adds ``2^{k−1} − 1`` plus the
    last kept bit ``(S >> k) & 1`` before clearing them: the sum reaches the next multiple
    exactly when the cleared part exceeds half of ``2^k``, or equals half and the kept part
    is odd. (``& (2^k − 1)`` makes the addend 0 where ``k = 0``.) One new array, updated in
    place: several live temporaries of a large tile cost more than the arithmetic.
    """
    unit = 1 << k
    if rounding == "toward_zero":
        return s & ~(unit - 1)
    out = s >> k
    out &= 1
    out += (unit >> 1) - 1
    out &= unit - 1
    out += s
    out &= ~(unit - 1)
    return out


_INF = _SPECIAL << _FRACTION_BITS  # the magnitude word of ±∞


def _irregular(words: Any, fmt: EmulatedFormat, xp: Any) -> Any:
    """Where the quantum is not ``2^{53−p}`` float64 units: nonzero magnitudes below
    ``max(2^{e_min}, 2^-1022)`` (subnormals of the format or of float64), and NaN.

    ``(|x| − 1) & MAGNITUDE`` sends 0 to the top, so one comparison tests both ends.
    """
    emin = -1022 if fmt.emin is None else fmt.emin
    t = words & _MAGNITUDE
    t -= 1
    t &= _MAGNITUDE
    below = t < ((emin + _EXPONENT_BIAS) << _FRACTION_BITS) - 1
    return below | xp.isnan(words)


def _round_words(words: Any, fmt: EmulatedFormat, xp: Any) -> Any:
    """The rounded words: ``fl(x)`` for every float64 word ``x`` (int64 view in and out).

    Every regular word (0, ±∞, or a float64 in the format's normal range) is rounded as a
    whole — its low bits are the significand's, and two's complement adds and masks them
    like unsigned bits, sign and carries included; the few irregular ones go through
    :func:`_round_magnitudes`. Each step makes one new array and updates it in place:
    several live temporaries of a large tile cost more than the arithmetic.
    """
    if words.ndim == 0:  # NumPy turns 0-d results into scalars, which cannot be indexed
        return _round_words(words.reshape(1), fmt, xp).reshape(())
    rounded = round_significand(words, _FRACTION_BITS + 1 - fmt.mantissa_bits, fmt.rounding)
    irregular = _irregular(words, fmt, xp)
    if irregular.any():
        odd = words[irregular]
        rounded[irregular] = (odd & _SIGN) | _round_magnitudes(odd & _MAGNITUDE, fmt, xp)
    if fmt.emax is None:
        return rounded
    overflow_from = (fmt.emax + 1 + _EXPONENT_BIAS) << _FRACTION_BITS  # 2^{e_max+1}
    magnitude = rounded & _MAGNITUDE
    if magnitude.max() < overflow_from:
        return rounded
    over = (magnitude >= overflow_from) & (magnitude <= _INF)  # not NaN
    if fmt.rounding == "nearest":
        limit = _INF
    else:
        over &= magnitude < _INF  # ±∞ given stays ±∞
        limit = int(np.float64(fmt.max_finite).view(np.int64))
    return xp.where(over, (rounded & _SIGN) | limit, rounded)


def _round_magnitudes(a: Any, fmt: EmulatedFormat, xp: Any) -> Any:
    """Rounded magnitudes for any words: subnormals (either format's), ±0, ±∞ and NaN."""
    p = fmt.mantissa_bits
    biased = a >> _FRACTION_BITS  # E: 0 for ±0 and subnormals, 2047 for ±∞ and NaN
    e1 = xp.clip(biased, 1, _SPECIAL)
    base = (e1 - 1) << _FRACTION_BITS
    s = a - base  # |x| = S·2^t with t = e1 − 1075 and S < 2^53 (the implicit bit included)
    if fmt.emin is None:
        exponent = xp.where(biased == 0, xp.log2_floor(s) - 1074, e1 - _EXPONENT_BIAS)
    else:
        exponent = xp.clip(e1 - _EXPONENT_BIAS, fmt.emin, None)  # subnormals: e_min
    k = xp.clip(exponent - (p - 1) - (e1 - 1075), 0, _MAX_SHIFT)  # quantum 2^{t+k}
    r = round_significand(s, k, fmt.rounding)
    magnitude = xp.where(r == 0, 0, base + r)
    return xp.where(biased == _SPECIAL, a, magnitude)  # ±∞ and NaN unchanged


def round_to_format(x: Any, fmt: EmulatedFormat) -> Any:
    """``fl(x)``: a float64 NumPy array or torch tensor rounded to ``fmt``, as a new array."""
    if not isinstance(fmt, EmulatedFormat):
        raise TypeError(f"fmt must be an EmulatedFormat (EmulatedFormat.of(p, ...)); got {fmt!r}")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.dtype != torch.float64:
            raise TypeError(f"x must be a float64 tensor; got {x.dtype}")
        if fmt.is_float64:
            return x.clone()
        return _round_words(x.view(torch.int64), fmt, _TorchWords).view(torch.float64)
    x = np.asarray(x)
    if x.dtype != np.float64:
        raise TypeError(f"x must be a float64 array; got dtype {x.dtype}")
    if fmt.is_float64:
        return x.copy()
    return _round_words(x.view(np.int64), fmt, _NumpyWords).view(np.float64)


def round_in_place(x: np.ndarray, fmt: EmulatedFormat) -> None:
    """Replace every value of the float64 array ``x`` (a view is fine) by ``fl(x)``."""
    if fmt.is_float64 or x.size == 0:
        return
    words = x.view(np.int64)
    words[...] = _round_words(words, fmt, _NumpyWords)


# --- the arrays -------------------------------------------------------------------------
# Ufuncs whose float64 result is already in the format when their operands are: no
# rounding needed (max/min select, negation and |x| flip a sign bit).
_EXACT = {np.maximum, np.minimum, np.fmax, np.fmin, np.negative, np.positive, np.absolute}
_EXACT_REDUCTIONS = {np.maximum, np.minimum, np.fmax, np.fmin}
# NumPy functions that sum products or accumulate in C, outside the ufunc machinery: on
# these arrays they would return unrounded values, so they are refused.
_UNROUNDED = {
    np.dot,
    np.vdot,
    np.inner,
    np.outer,
    np.tensordot,
    np.einsum,
    np.cumsum,
    np.cumprod,
    np.nancumsum,
    np.nancumprod,
}


class EmulatedArray(np.ndarray):
    """A float64 array whose values are in a format; every ufunc result is rounded to it.

    Create one with :meth:`EmulatedContext.asarray`; ``.view(np.ndarray)`` gives the plain
    float64 values. The context travels with views, slices and results.
    """

    _ctx: EmulatedContext | None

    def __array_finalize__(self, obj: Any) -> None:
        self._ctx = getattr(obj, "_ctx", None)

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        ctx = _context_of((*inputs, *kwargs.get("out", ())))
        return ctx._apply(ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if func in _UNROUNDED:
            _refuse(f"np.{func.__name__}")
        return super().__array_function__(func, types, args, kwargs)

    def dot(self, *args: Any, **kwargs: Any) -> Any:
        _refuse("ndarray.dot")

    def __reduce__(self) -> Any:
        constructor, arguments, state = super().__reduce__()
        return constructor, arguments, (state, self._ctx)

    def __setstate__(self, state: Any) -> None:
        array_state, self._ctx = state
        super().__setstate__(array_state)


def _refuse(what: str) -> None:
    raise TypeError(
        f"{what} does not round its arithmetic to an emulated format; use @ (np.matmul), "
        "ufuncs and np.sum, or .view(np.ndarray) for plain float64"
    )


def _context_of(values: tuple[Any, ...]) -> EmulatedContext:
    contexts = {v._ctx for v in values if isinstance(v, EmulatedArray) and v._ctx is not None}
    if not contexts:
        raise TypeError("an EmulatedArray without a context; make arrays with ctx.asarray")
    if len(contexts) > 1:
        names = sorted(c.name for c in contexts)
        raise TypeError(f"an operation mixes arrays of different emulated formats: {names}")
    return contexts.pop()


def _plain(x: Any) -> Any:
    return x.view(np.ndarray) if isinstance(x, EmulatedArray) else x


# --- the context ------------------------------------------------------------------------
class EmulatedContext(ArrayContext):
    """float64 arrays holding values of an emulated format; every operation rounds.

    ``EmulatedContext(11, exponent=5)`` is fp16 arithmetic, ``EmulatedContext(8,
    exponent=8)`` bf16, ``EmulatedContext(p)`` mpmath at ``prec = p`` (unbounded exponent).
    ``rounding`` is ``"nearest"`` (ties to even) or ``"toward_zero"`` (truncation);
    ``granularity`` is ``"scalar"`` or ``"op"`` (see the module docstring). ``storage`` and
    ``p_cast`` are :class:`EmulatedFormat` s for the inputs/outputs and for ``p`` before
    ``p·V`` (the FlashAttention-2 policy: fp32 compute, fp16 ``storage`` and ``p_cast``).
    """

    compute_dtype = np.float64

    def __init__(
        self,
        mantissa_bits: int,
        *,
        exponent: Any = None,
        rounding: str = "nearest",
        granularity: str = "scalar",
        storage: EmulatedFormat | None = None,
        p_cast: EmulatedFormat | None = None,
    ):
        self.format = EmulatedFormat.of(mantissa_bits, exponent, rounding)
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}; got {granularity!r}")
        for name, fmt in (("storage", storage), ("p_cast", p_cast)):
            if fmt is not None and not isinstance(fmt, EmulatedFormat):
                raise TypeError(f"{name} must be an EmulatedFormat or None; got {fmt!r}")
        self.granularity = granularity
        self.storage = storage or self.format
        self.p_cast = p_cast
        parts = [str(self.format), granularity]
        if self.storage != self.format:
            parts.append(f"storage=({self.storage})")
        if p_cast is not None:
            parts.append(f"p_cast=({p_cast})")
        self.name = "emulated[" + ",".join(parts) + "]"

    def all_finite(self, x: Any) -> bool:
        """Checked on the stored float64 words: no rounded arithmetic is needed to look."""
        return bool(np.isfinite(_plain(x)).all())

    # --- construction -----------------------------------------------------------------
    def _wrap(self, x: np.ndarray) -> EmulatedArray:
        out = np.asarray(x).view(EmulatedArray)
        out._ctx = self
        return out

    def _rounded(self, x: Any, fmt: EmulatedFormat) -> EmulatedArray:
        """A new array of this context holding ``fl(x)`` in ``fmt``."""
        x = _plain(x)
        if hasattr(x, "detach"):  # a torch tensor, possibly on a GPU
            x = x.detach().cpu().numpy()
        arr = np.asarray(x)
        if arr.dtype.kind not in "fiub":
            raise TypeError(f"expected real numbers; got an array of dtype {arr.dtype}")
        return self._wrap(round_to_format(arr.astype(np.float64), fmt))

    def asarray(self, x: Any) -> EmulatedArray:
        return self._rounded(x, self.storage)

    def as_compute(self, x: Any) -> EmulatedArray:
        return self._rounded(x, self.format)

    def compute(self, x: Any) -> EmulatedArray:
        return x if self.storage == self.format else self._rounded(x, self.format)

    def output(self, x: Any) -> np.ndarray:
        """Plain float64 values in the storage format (so the caller's arithmetic is exact)."""
        if self.storage == self.format:
            return _plain(x).copy()
        return round_to_format(np.asarray(_plain(x)), self.storage)

    def round_p(self, p: Any) -> Any:
        if self.p_cast is None:
            return p
        return self.as_compute(round_to_format(_plain(p), self.p_cast))

    def scalar(self, x: Any) -> EmulatedArray:
        """A 0-d array of ``fl(x)``: constant arithmetic rounds like everything else."""
        return self._rounded(float(x), self.format)

    def default_scale(self, d: int) -> EmulatedArray:
        return self.scalar(1) / np.sqrt(self.scalar(d))

    @property
    def neg_inf(self) -> float:
        return float("-inf")  # in every format

    def full(self, shape: tuple[int, ...], value: Any) -> EmulatedArray:
        return self._rounded(np.full(shape, float(value)), self.format)

    # --- arithmetic the algorithm needs (the rest is inherited: ufuncs round) --------------
    def exp_shifted(self, s: EmulatedArray, shift: EmulatedArray) -> EmulatedArray:
        # In place: the score tile is scratch; each ufunc rounds its result as it goes.
        np.subtract(s, shift[..., None], out=s)
        return np.exp(s, out=s)

    def where(self, cond: Any, a: Any, b: Any) -> EmulatedArray:
        """Selects values, computes none; operands from outside this context are rounded."""
        return self._wrap(np.where(_plain(cond), self._operand(a), self._operand(b)))

    def broadcast_to(self, x: Any, shape: tuple[int, ...]) -> EmulatedArray:
        return self._wrap(np.broadcast_to(self._operand(x), shape))

    def _operand(self, x: Any) -> Any:
        if isinstance(x, EmulatedArray) and x._ctx == self:
            return x.view(np.ndarray)
        return self._rounded(x, self.format).view(np.ndarray)

    # --- the ufunc hook --------------------------------------------------------------------
    def _apply(self, ufunc: np.ufunc, method: str, inputs: tuple, kwargs: dict) -> Any:
        """Run ``ufunc.method`` on the plain values and round its float64 results."""
        out = kwargs.pop("out", None)
        args = tuple(_plain(x) for x in inputs)
        sequential = self.granularity == "scalar"
        if sequential and (ufunc, method) in ((np.matmul, "__call__"), (np.add, "reduce")):
            run = self._sequential_matmul if ufunc is np.matmul else self._sequential_sum
            results, rounded = (run(*args, **kwargs),), True
            if out is not None:
                np.copyto(_plain(out[0]), results[0])
        elif method == "__call__" or (
            method == "reduce" and (ufunc is np.add or ufunc in _EXACT_REDUCTIONS)
        ):
            if out is not None:
                kwargs["out"] = tuple(_plain(o) for o in out)
            results = getattr(ufunc, method)(*args, **kwargs)
            results = kwargs.get("out", results if isinstance(results, tuple) else (results,))
            rounded = ufunc in _EXACT or ufunc in _EXACT_REDUCTIONS
        else:
            raise TypeError(
                f"{ufunc.__name__}.{method} is not emulated in {self.name}: only elementwise "
                "ufuncs, add/maximum/minimum reductions and matmul are"
            )
        delivered = []
        for i, result in enumerate(results):
            arr = np.asarray(result)  # an ``out`` buffer stays that buffer
            if arr.dtype == np.float64 and not rounded:
                round_in_place(arr, self.format)
            if out is not None:
                delivered.append(out[i])
            else:
                delivered.append(self._wrap(arr) if arr.dtype == np.float64 else result)
        return delivered[0] if len(delivered) == 1 else tuple(delivered)

    def _round(self, x: np.ndarray) -> np.ndarray:
        round_in_place(x, self.format)
        return x

    def _sequential_matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b`` with ``acc = fl(a₀b₀)``, ``acc = fl(acc + fl(a_r b_r))`` left to right."""
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.ndim < 2 or b.ndim < 2:
            raise ValueError(
                f"emulated matmul needs operands with ndim >= 2; got {a.shape} @ {b.shape}"
            )
        if a.shape[-1] != b.shape[-2]:
            raise ValueError(f"matmul: inner dimensions differ: {a.shape} @ {b.shape}")
        shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
        acc = np.zeros(shape)
        term = np.empty(shape)
        for r in range(a.shape[-1]):
            target = acc if r == 0 else term
            np.multiply(a[..., :, r : r + 1], b[..., r : r + 1, :], out=target)
            self._round(target)
            if r:
                self._round(np.add(acc, term, out=acc))
        return acc

    def _sequential_sum(
        self, x: np.ndarray, axis: Any = 0, dtype: Any = None, keepdims: bool = False, **rest: Any
    ) -> np.ndarray:
        """``Σ`` over ``axis`` (int, tuple or None) left to right, rounding after each add.

        Several axes are moved to the end and flattened in C order first.
        """
        if dtype not in (None, np.float64) or rest.get("initial") is not None:
            raise TypeError(f"emulated sum supports axis and keepdims only; got {rest}")
        if rest.get("where", True) is not True:
            raise TypeError("emulated sum does not support where=")
        x = np.asarray(x, dtype=np.float64)
        axes = tuple(range(x.ndim)) if axis is None else np.atleast_1d(axis).tolist()
        axes = tuple(sorted(a % x.ndim for a in axes))
        kept = [i for i in range(x.ndim) if i not in axes]
        moved = np.transpose(x, (*kept, *axes))
        terms = moved.reshape(*[x.shape[i] for i in kept], -1)
        acc = np.zeros(terms.shape[:-1])
        if terms.shape[-1]:
            acc[...] = terms[..., 0]
        for r in range(1, terms.shape[-1]):
            self._round(np.add(acc, terms[..., r], out=acc))
        if keepdims:
            acc = acc.reshape([1 if i in axes else n for i, n in enumerate(x.shape)])
        return acc
