"""The one adapter from a case to the certified reference (:mod:`exactattn.oracle.certified`).

Check, difftest, the sweep, ``gpu/check.py`` and the tests ask for the exact answer of a
:class:`~exactattn.cases.Case` here and nowhere else: :func:`certified` hands
:func:`~exactattn.oracle.certified.certified_attention` the inputs exactly as a target holds them
(``held``; the case's own float64 arrays by default), the allowed set from the mask spec's
definition (:meth:`Case.allowed`; ``None`` for every pair), the keep-bits of the documented
hash (:func:`keep_bits`, :func:`exactattn.cases.spec.keep`), never the library's masks or
dropout, and the score modification as the case holds it (the bias as held, the soft-cap,
a user's ``score_mod`` evaluated over the balls by the reference itself). What comes back
is a :class:`Reference`: per output the value (double-double midpoints ``hi + lo``, and the
exact midpoints as mpmath numbers), the radius of each entry, the precision used and the
time; the gradients ``dq, dk, dv`` (and ``dbias``) when asked.

Two references answer: arb balls (:func:`certified`, any case, slow beyond n ≈ 1000) and
float64 with a rounding budget (:func:`fast`, O(n·d) memory, BLAS speed); :func:`serves`
decides per case and tolerance (the float64 one where its radius is below 2^-20 of the
target's allowed error, output by output: never for float64 targets or exact ones);
``Reference.served`` says which answered.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import mpmath
import numpy as np

from ..infra import loading
from . import spec
from .case import Case

OUTPUTS = ("y", "lse", "dq", "dk", "dv", "dbias")
REF_PREC = 160  # bits: far below the finest format judged (mpmath at 80 bits)


@dataclass
class Reference:
    """The certified values of one case: per output the double-double midpoints ``hi + lo``
    and the radii ``rad`` (the exact value lies within ``rad`` of ``hi + lo``, entrywise),
    the precision used, the time; ``case`` and ``held`` are the problem it answers (``held``:
    the inputs the variant judged received; a low-bit claim that states its quantiser is
    answered at their quantisation, :meth:`exactattn.targets.Variant.reference_inputs`)."""

    enclosure: Any  # exactattn.oracle.certified.Enclosure (Ball.error, Ball.contains)
    case: Case
    held: dict[str, np.ndarray]
    program_bias: np.ndarray | None = None  # a user's additive score_mod as a bias (float64)
    unbounded: str = ""  # why no error bound can be derived for this case ("" when one can)
    served: str = "arb"  # which reference computed it: "arb" or "float64" (fast_reference)
    names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.names = tuple(name for name in OUTPUTS if name in self.enclosure.balls)

    @property
    def balls(self) -> Any:
        return self.enclosure

    @functools.cached_property
    def hi(self) -> dict[str, np.ndarray]:
        return {name: self.enclosure[name].hi for name in self.names}

    @functools.cached_property
    def lo(self) -> dict[str, np.ndarray]:
        return {name: self.enclosure[name].lo for name in self.names}

    @functools.cached_property
    def rad(self) -> dict[str, np.ndarray]:
        return {name: self.enclosure[name].rad for name in self.names}

    @functools.cached_property
    def near(self) -> dict[str, np.ndarray]:
        """The float64 nearest the value, ``hi + lo``."""
        with np.errstate(invalid="ignore"):
            return {name: self.hi[name] + self.lo[name] for name in self.names}

    @functools.cached_property
    def mid(self) -> dict[str, np.ndarray]:
        """The exact midpoints as mpmath numbers (object arrays)."""
        with mpmath.workprec(self.enclosure.prec + 64):
            return {name: self.enclosure[name].mpf() for name in self.names}

    @property
    def prec(self) -> int:
        return self.enclosure.prec

    @property
    def seconds(self) -> float:
        return self.enclosure.seconds

    def largest_radius(self, names: tuple[str, ...] = OUTPUTS) -> float:
        """The largest radius over the outputs ``names`` (those computed)."""
        return max(self.enclosure[name].max_radius for name in self.names if name in names)


def require() -> Any:
    """:func:`exactattn.oracle.certified.certified_attention`, or an ImportError that says what to
    install (a command can call this before it starts drawing cases)."""
    try:
        from ..oracle.certified import certified_attention
    except ImportError as error:
        raise ImportError(
            "the reference is certified (arb balls) and needs python-flint: "
            "pip install 'exactattn[flint]'"
        ) from error
    return certified_attention


def keep_bits(case: Case) -> np.ndarray | None:
    """The keep-bits ``r`` of the case's dropout, from their definition (None without)."""
    if not case.dropout_p:
        return None
    n = case.sizes
    return spec.keep(case.dropout_p, case.seed, case.batch, n["n_q"], n["n_k"])


FAST_SHARE = 2.0**-20  # the float64 reference serves where its radius is below this share


def fast(case: Case, held: dict[str, np.ndarray] | None = None, *, grads: bool = True):
    """The float64 certified reference of ``case`` (:func:`exactattn.oracle.float64.
    fast_attention`: naive attention a block of query rows at a time, the allowed set read a
    strip of rows at a time from the spec's definition, :meth:`Case.allowed_rows`), or None
    where it cannot serve: a ``score_mod``, or a row whose float64 budget is vacuous (an
    infinite radius: scores near float64's range)."""
    if case.score_mod is not None:
        return None
    from ..oracle.float64 import fast_attention

    held = held if held is not None else case.arrays()
    enclosure = fast_attention(
        held["q"],
        held["k"],
        held["v"],
        held["g"] if grads else None,
        scale=case.scale,
        allowed=case.allowed_rows if case.masked else None,
        keep=keep_bits(case),
        dropout_p=case.dropout_p,
        enable_gqa=case.group > 1,
        bias=held.get("bias"),
        softcap=case.softcap,
    )
    if not all(np.isfinite(ball.rad).all() for ball in enclosure.balls.values()):
        return None
    return Reference(enclosure, case, held, served="float64")


def serves(ref: Reference, bound: dict[str, np.ndarray]) -> bool:
    """Whether ``ref``'s radius is below :data:`FAST_SHARE` of the allowed error ``bound``:
    per output, the largest radius against the largest bound (the judge adds the radius to
    each entry's limit all the same, so this decides sharpness, never soundness; an exact
    target's bound 0: never)."""
    return all(
        float(np.max(ref.rad[name], initial=0.0))
        <= FAST_SHARE * float(np.max(bound[name], initial=0.0))
        for name in ref.names
        if name in bound
    )


def certified(
    case: Case,
    held: dict[str, np.ndarray] | None = None,
    *,
    grads: bool = True,
    prec: int | None = REF_PREC,
    workers: int = 1,
) -> Reference:
    """The certified reference of ``case`` on the inputs exactly as ``held`` (default: the
    case's float64 arrays, bias included); ``grads=False``: the forward only; ``prec``:
    bits (``None``: the lowest rung of :data:`exactattn.oracle.certified.LADDER` that certifies
    every output to 2^-70 of its summands); ``workers``: processes sharing the blocks of rows.
    The arb reference; :func:`fast` is the float64 one, which a caller uses where
    :func:`serves` says its radius is small enough for the tolerance at hand."""
    held = held if held is not None else case.arrays()
    score_mod = None
    if case.score_mod is not None:
        score_mod = loading.load_callable(case.score_mod, "--score-mod")
    enclosure = require()(
        held["q"],
        held["k"],
        held["v"],
        held["g"] if grads else None,
        scale=case.scale,
        allowed=case.allowed() if case.masked else None,
        keep=keep_bits(case),
        dropout_p=case.dropout_p,
        prec=prec,
        workers=workers,
        enable_gqa=case.group > 1,
        bias=held.get("bias"),
        softcap=case.softcap,
        score_mod=score_mod,
    )
    ref = Reference(enclosure, case, held)
    if score_mod is not None:
        ref.program_bias, ref.unbounded = program_bias(score_mod, case, held)
    return ref


def program_bias(fn: Any, case: Case, held: dict[str, np.ndarray]) -> tuple[Any, str]:
    """A user's score_mod as the bias ``β = mod(0)`` when it is additive, ``mod(s) = s + β``
    — else ``(None, why)``. Judged in float64 on the case's scores ``s = c·q·k``: the slope
    ``∂mod/∂s`` (a :class:`exactattn.core.ops.Dual`'s tangent) is 1 at ``s`` and at 0, and
    ``mod(s)`` is ``s + β`` to float64 rounding, at every pair the mask allows (a check on
    these scores, not a proof that the mod is additive everywhere)."""
    from ..backends import NumpyContext
    from ..core.ops import Dual, grid_indices

    q, k = held["q"].astype(np.float64), held["k"].astype(np.float64)
    if case.group > 1:
        k = np.repeat(k, case.group, axis=-3)
    n = case.sizes
    lifted = spec.lift(case.batch)
    grid = (*lifted, n["n_q"], n["n_k"])
    s = (case.c() * (q @ np.swapaxes(k, -1, -2))).reshape(grid)
    ctx, indices = NumpyContext("float64"), grid_indices(lifted, n["n_q"], n["n_k"])

    def mod(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = fn(Dual(ctx, x, 1.0), *indices)
        value = np.broadcast_to(out.value if isinstance(out, Dual) else out, grid)
        tangent = 0.0 if not isinstance(out, Dual) or out.tangent is None else out.tangent
        return np.asarray(value, dtype=np.float64), np.broadcast_to(tangent, grid)

    with np.errstate(all="ignore"):
        at_s, slope_s = mod(s)
        beta, slope_0 = mod(np.zeros(grid))
        apart = np.abs(at_s - (s + beta)) > 2.0**-50 * (np.abs(s) + np.abs(beta))
    on = case.allowed().reshape(grid) & (beta != -np.inf)
    if (on & ((slope_s != 1) | (slope_0 != 1) | apart)).any():
        return None, (
            f"score_mod {case.score_mod} is not an additive bias (∂mod/∂s ≠ 1 on this case): "
            "no error bound is derived for it, only enclosures are judged"
        )
    return beta.reshape((*case.batch, n["n_q"], n["n_k"])), ""
