"""Certified arithmetic: python-flint ``arb`` balls in NumPy object arrays.

Every number is a ball ``[mid ± rad]`` and every operation returns a ball that contains
the exact result of the operation applied to any points of its input balls (Arb's
guarantee). Run through the library's tiled code, ``Y, ℓ, lse, dQ, dK, dV`` come out as
balls that *enclose the exact values* for the given (float) inputs; the radii say how
tight the enclosure is. The working precision ``prec`` (bits) is set on ``flint.ctx`` only
inside :meth:`FlintContext.scope` and restored in ``finally``.

The running max ``m``. The tiled forward needs ``m`` only as the *shift* in
``e^{s − m}``; ``Y = z/ℓ`` and ``lse = m + log ℓ`` are the same exact numbers for every
shift, because ``(ℓ·e^m, z·e^m)`` does not depend on it (docs/algorithm.md: the homomorphism of
⋆ into addition). So ``m`` may be *any* representative, provided the same value is used in
both passes: the reverse reads the forward's ``m`` (and the ``ℓ`` computed against it), so
``p = e^{s − m}/ℓ`` encloses the exact softmax weight. We take an *exact* representative,
the float64 rounding of the largest midpoint. An exact shift (radius 0) adds no width to
``e^{s − m}``; an overlapping ball max (``max`` of two balls whose order is undecided)
would otherwise have to be widened to cover both, and its radius would be counted twice,
once in ``s − m`` and once in the rescale ``α = e^{m_old − m_new}``. (Scores must stay
inside the float64 range for the representative to exist, which the inputs' finiteness
check and any realistic scale guarantee.)

Speed: the products go through flint's ``arb_mat`` (:meth:`FlintContext.matmul`); the rest
is elementwise on object arrays. At n = 1024, d = 64, 200 bits forward + backward takes
about 9 s of CPU: ~45% ``arb_mat`` products, ~20% the 2·n² elementwise ``exp``, ~20%
converting tiles between object arrays and ``arb_mat``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import mpmath
import numpy as np

from ..infra.optional import needs
from .protocol import ObjectContext

with needs("FlintContext (arb balls, exactattn.backends.flint_backend)"):
    import flint
    from flint import arb, arb_mat, fmpq, fmpz

_NEG_INF = arb("-inf")


def _representative(x: arb) -> float:
    """The float64 rounding of the midpoint: an exact number used as a shift."""
    return float(x)


class FlintContext(ObjectContext):
    """arb balls at ``prec`` bits; results enclose the exact values (radius reported)."""

    def __init__(self, prec: int = 200):
        if isinstance(prec, bool) or not isinstance(prec, int) or prec < 2:
            raise ValueError(f"prec must be an integer >= 2 bits; got {prec!r}")
        self.prec = prec
        self.name = f"flint[prec={prec}]"

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        saved = flint.ctx.prec
        flint.ctx.prec = self.prec
        try:
            yield
        finally:
            flint.ctx.prec = saved

    # --- numbers ------------------------------------------------------------------------
    def _convert(self, x: Any) -> arb:
        """An exact ball for a binary float or integer; arb balls pass through."""
        kind = type(x)
        if kind is arb:
            return x
        if kind is float or kind is np.float64:
            return arb(x)  # exact: every binary64 value is an exact arb midpoint
        if isinstance(x, arb):
            return x
        if isinstance(x, (bool, np.bool_)):
            raise TypeError(f"expected a real number, got a boolean {x!r}")
        if isinstance(x, (int, np.integer)):
            return arb(fmpz(int(x)))
        if isinstance(x, (float, np.float16, np.float32, np.float64)):
            return arb(float(x))
        if isinstance(x, np.longdouble):
            num, den = x.as_integer_ratio()
            return arb(fmpq(num, den))
        mpf = getattr(x, "_mpf_", None)
        if mpf is not None:  # mpmath mpf: (sign, mantissa, exponent, bits), exact
            sign, man, exp, _ = mpf
            if man == 0 and exp != 0:  # mpmath's encoding of inf / nan
                return arb(str(x))
            return arb(fmpz(-man if sign else man)) * arb(2) ** exp
        raise TypeError(f"cannot convert {type(x).__name__} {x!r} to an arb ball")

    def scalar(self, x: Any) -> arb:
        return self._convert(x)

    def default_scale(self, d: int) -> arb:
        return arb(d).rsqrt()

    @property
    def neg_inf(self) -> arb:
        return _NEG_INF

    def comparable(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The enclosure ``(midpoint, radius)``: exact ``mpf`` midpoints (a non-finite ball's
        as a float), float64 radii rounded up."""
        x = np.asarray(x, dtype=object)
        with mpmath.workprec(200):
            return np.asarray(_MID(x), dtype=object), np.asarray(_RAD(x), dtype=np.float64)

    # --- elementwise ----------------------------------------------------------------------
    _exp = staticmethod(arb.exp)
    _log = staticmethod(arb.log)
    _tanh = staticmethod(arb.tanh)
    _finite = staticmethod(arb.is_finite)

    def exp_shifted(self, s: np.ndarray, shift: np.ndarray) -> np.ndarray:
        """``e^{s − shift}`` in one pass over the tile (no (rows × b) temporary for s − m)."""
        return np.asarray(_EXP_SHIFTED(s, shift[..., None]), dtype=object)

    def rowmax(self, x: np.ndarray) -> np.ndarray:
        """An exact representative of each row's max (see the module docstring)."""
        if x.shape[-1] == 0:
            return self.full(x.shape[:-1], self.neg_inf)
        mids = _to_float(x).max(axis=-1)
        return _from_float(mids)

    def maximum(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Elementwise exact representative of ``max(a, b)`` (larger rounded midpoint)."""
        return _from_float(np.maximum(_to_float(a), _to_float(b)))

    # --- the native product ---------------------------------------------------------------
    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b`` with flint's ``arb_mat`` product on each last-two-axes tile.

        Leading dims broadcast as in NumPy; each (r × k)·(k × c) tile is one ``arb_mat``
        multiplication (block algorithm over exact integer matrices), which is orders of
        magnitude faster than the object-array ``@`` of Python-level ball operations.
        """
        a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
        if a.ndim < 2 or b.ndim < 2:
            raise ValueError(f"matmul needs arrays with ndim >= 2; got {a.shape} and {b.shape}")
        (r, k), (k2, c) = a.shape[-2:], b.shape[-2:]
        if k != k2:
            raise ValueError(f"matmul inner dims differ: {a.shape} @ {b.shape}")
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        out = np.empty((*batch, r, c), dtype=object)
        if r == 0 or c == 0:
            return out
        if k == 0:
            out.fill(arb(0))
            return out
        a = np.broadcast_to(a, (*batch, r, k))
        b = np.broadcast_to(b, (*batch, k, c))
        cache: dict[tuple, arb_mat] = {}
        for index in np.ndindex(*batch):
            left = _as_arb_mat(a[index], cache)
            right = _as_arb_mat(b[index], cache)
            product = left * right
            out[index] = np.fromiter(product.entries(), dtype=object, count=r * c).reshape(r, c)
        return out


def _as_arb_mat(tile: np.ndarray, cache: dict[tuple, arb_mat]) -> arb_mat:
    """Convert a 2-D object tile once per distinct view (broadcast batch dims repeat it).

    Within one product the operands stay alive, so (address, strides, shape) identifies a
    view's contents.
    """
    key = (tile.__array_interface__["data"][0], tile.strides, tile.shape)
    if key not in cache:
        cache[key] = arb_mat(tile.tolist())
    return cache[key]


_EXP_SHIFTED = np.frompyfunc(lambda s, m: (s - m).exp(), 2, 1)
_TO_FLOAT = np.frompyfunc(_representative, 1, 1)
_FROM_FLOAT = np.frompyfunc(arb, 1, 1)


def _to_float(x: np.ndarray) -> np.ndarray:
    return np.asarray(_TO_FLOAT(x), dtype=np.float64)


def _from_float(x: np.ndarray) -> np.ndarray:
    return np.asarray(_FROM_FLOAT(x), dtype=object)


def arb_mid(e: arb) -> Any:
    """The exact midpoint of an arb ball as an mpmath ``mpf`` (at the precision its
    mantissa needs, so nothing is rounded)."""
    man, exp = e.mid().man_exp()
    with mpmath.workprec(max(int(man).bit_length(), 2)):  # mpf() rounds to the working prec
        return mpmath.mpf((int(man), int(exp)))


def _midpoint(e: arb) -> Any:
    return arb_mid(e) if e.is_finite() else mpmath.mpf(float(e.mid()))


def _radius(e: arb) -> float:
    return float(e.rad()) * (1 + 2.0**-50)  # float() may round down: widened to round up


_MID = np.frompyfunc(_midpoint, 1, 1)
_RAD = np.frompyfunc(_radius, 1, 1)
