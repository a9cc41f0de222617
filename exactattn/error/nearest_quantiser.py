"""The quantisation a low-bit claim with ``quantiser=nearest`` states, written from its
definition, with what a kernel's own arithmetic may change in it.

The claim says the kernel computes each group's scale by the rule of its scale format and
rounds ``x/s`` to nearest in the element format, saturating (OCP FP8 and MX v1.0;
SageAttention's symmetric INT8/INT4). The checker can then form the quantised inputs
``x̃ = s·RN_F(x/s)`` itself, and the quantisation is no longer an error to bound: the
reference is exact attention at ``x̃`` (what the kernel is asked to compute), and the bound
charges only what separates the kernel's ``x̂`` from ``x̃``:

* the kernel's pre-quantisation values ``x'`` differ from the exact ``x`` by at most
  ``near`` (its rotation or smoothing, in its own arithmetic);
* its scale ``s' = s(1 + θ)`` (``amax`` of ``x'``, the division by ``max_F`` and, for two
  levels, the tensor scale, rounded in its arithmetic of unit roundoff ``u``: ``θ ≤ (1 +
  near/amax)(1 + u)³ − 1``, room for a cast and a prescaling of ``x'`` before its amax, as
  SageAttention's ``x·c·log₂e``);
* so its ``t'`` (``x'/s'`` with up to four roundings: a cast of its input to its
  arithmetic, a prescaling, a reciprocal, the division) lies
  within ``w = (|t|(θ + 4u) + near/s)(1 + u)/(1 − θ)`` of ``t = x/s``, and ``RN_F`` is
  monotone: ``n' ∈ [RN_F(t − w), RN_F(t + w)]``. Where both ends round alike (almost every
  entry), ``n' = ñ`` and ``x̂ = s'ñ = x̃(1 + θ)``; else ``x̂`` is off by the distance to the
  farther candidate too: ``|x̂ − x̃| ≤ (s·D + θ|x̃|)(1 + θ)``
  (``D = 0`` where decided), plus the descale's own rounding ``u|x̃|``.

A scale the window leaves undecided (an e8m0 exponent or an e4m3 block scale at a
rounding boundary of its own) may be either neighbour: each entry is charged the farther of
what both would give it. Where more than two are possible, and in a group whose ``amax`` is
not well above ``near``, the group is charged as a whole: ``|x̂ − x̃| ≤ |x̃| + 2(amax +
near)`` (a saturating kernel's values stay within ``s'·max_F``). The error model returned
is :class:`Held` (``|x̂ − x̃| ≤ rel·|x̃| + each``).

Nothing here calls :mod:`exactattn.backends.quantize` (the emulated kernels' quantiser,
which this reference judges): the formats' parameters, the groups and the rounding are
restated from the definitions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# (significand bits p, least exponent, largest finite): OCP OFP8 e4m3fn / e5m2, MX e2m1
MINIFLOATS = {"e4m3": (4, -6, 448.0), "e5m2": (3, -14, 57344.0), "e2m1": (2, 0, 6.0)}
FLOAT16 = (11, -14, 65504.0)
INTEGERS = {"int8": 127.0, "int4": 7.0}  # symmetric: ±(2^{k−1} − 1)
# the largest exponent of each minifloat (MX's X = 2^{⌊log₂ amax⌋ − E_MAX})
E_MAX = {"e4m3": 8, "e5m2": 15, "e2m1": 2}
TWO_LEVEL_TOP = 448.0  # NVFP4's tensor scale maps amax to max_F·448 (e4m3's largest)
WHOLE_GROUP = 2.0**-4  # near/amax above which a group is charged as a whole


@dataclass(frozen=True)
class Held:
    """``values``: ``x̃`` (float64); a kernel of the claim holds ``x̂`` with
    ``|x̂ − x̃| ≤ rel·|x̃| + each`` (``each`` shaped like ``values``)."""

    values: np.ndarray
    rel: float
    each: np.ndarray


def round_nearest(t: np.ndarray, number: str) -> np.ndarray:
    """``RN_F(t)``: to nearest (ties to even), saturated at ``±max_F``; ``F`` a minifloat of
    :data:`MINIFLOATS`, ``float16`` or an integer of :data:`INTEGERS`."""
    if number in INTEGERS:
        return np.clip(np.round(t), -INTEGERS[number], INTEGERS[number])
    p, e_min, top = FLOAT16 if number == "float16" else MINIFLOATS[number]
    _, e = np.frexp(np.abs(t))  # |t| = f·2^e, f ∈ [½, 1): its exponent is e − 1
    quantum = np.ldexp(1.0, np.maximum(e - 1, e_min) - (p - 1))
    return np.clip(np.round(t / quantum) * quantum, -top, top)


def group_labels(shape: tuple[int, ...], granularity: str, block: int | None) -> np.ndarray:
    """Each entry's group, an integer array of ``shape`` (``(*batch, n, d)``): ``tensor``
    (one), ``head`` (per batch index), ``token`` (per row), ``channel`` (per column over
    the rows), ``block`` (``block`` consecutive rows), ``group`` (``block`` consecutive
    elements of a row)."""
    *batch, n, d = shape
    index = np.indices(shape)
    flat = np.ravel_multi_index(index[:-2], batch) if batch else np.zeros(shape, dtype=int)
    row, col = index[-2], index[-1]
    if granularity == "tensor":
        return np.zeros(shape, dtype=int)
    if granularity == "head":
        return flat
    if granularity == "token":
        return flat * n + row
    if granularity == "channel":
        return flat * d + col
    if granularity == "block":
        return flat * -(-n // block) + row // block
    if granularity == "group":
        return (flat * n + row) * (d // block) + col // block
    raise ValueError(f"granularity {granularity!r} has no groups here")


def _per_group(labels: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``max`` of ``values`` over each entry's group, laid out like ``labels``."""
    top = np.zeros(int(labels.max(initial=0)) + 1)
    np.maximum.at(top, labels.ravel(), np.broadcast_to(values, labels.shape).ravel())
    return top[labels]


def hold(
    number: str | None,
    granularity: str,
    block: int | None,
    scale_format: str,
    x: np.ndarray,
    near: np.ndarray | float,
    u: float,
) -> Held:
    """``x̃`` and the error model of the module docstring for the exact pre-quantisation
    values ``x`` (float64), a kernel whose own ``x'`` is within ``near`` of them and whose
    arithmetic has unit roundoff ``u``; ``number`` None: held as given (``x̃ = x``, off by
    ``near``); ``float16``: a plain cast."""
    x = np.asarray(x, dtype=np.float64)
    near = np.broadcast_to(np.asarray(near, dtype=np.float64), x.shape)
    if number is None:
        return Held(x, 0.0, near.copy())
    if number == "float16":
        one = np.ones(x.shape)
        return _elements(x, one, (one, one), 0.0, near, u, "float16", np.zeros(x.shape, bool))
    labels = group_labels(x.shape, granularity, block)
    amax, slack = _per_group(labels, np.abs(x)), _per_group(labels, near)
    top = INTEGERS.get(number) or MINIFLOATS[number][2]
    loose = slack > WHOLE_GROUP * amax  # amax not well above the kernel's slack (0 when exact)
    with np.errstate(divide="ignore", invalid="ignore"):
        spread = np.where(amax > 0, slack / amax, 0.0)
        if scale_format == "fp32":  # s = amax/max_F, held in fp32
            scale = np.where(amax > 0, amax / top, 1.0)
            candidates, theta = (scale, scale), (1 + spread) * (1 + u) ** 3 - 1
        elif scale_format == "e8m0":  # X = 2^{⌊log₂ amax⌋ − E_MAX}
            scale, candidates, undecided = _power_of_two(amax, slack, E_MAX[number])
            loose |= undecided
            theta = 0.0
        elif scale_format == "e4m3":
            scale, candidates, theta, undecided = _two_level(x, amax, slack, top, u)
            loose |= undecided
        else:
            raise ValueError(f"scale format {scale_format!r}: use fp32, e8m0 or e4m3")
    theta = np.where(loose, 0.0, theta)
    return _elements(x, scale, candidates, theta, near, u, number, loose, amax + slack)


def _elements(
    x: np.ndarray,
    scale: np.ndarray,
    candidates: tuple[np.ndarray, np.ndarray],
    theta: np.ndarray | float,
    near: np.ndarray,
    u: float,
    number: str,
    loose: np.ndarray,
    reach: np.ndarray | None = None,
) -> Held:
    """``x̃ = s·RN_F(x/s)`` and each entry's window (module docstring) for a kernel whose
    scale is either of ``candidates`` (the ends of its scale's window: both ``s`` where the
    rule decides it, two neighbours where the kernel's rounding may pick either) times
    ``1 + θ``; ``loose`` groups charged as a whole (``reach``: their ``amax + near``); a zero
    scale (an e4m3 block scale that underflows) zeroes the group, in the kernel too."""
    theta = np.broadcast_to(np.asarray(theta, dtype=np.float64), x.shape)
    zero = scale == 0
    s = np.where(zero, 1.0, scale)
    values = np.where(zero, 0.0, s * round_nearest(x / s, number))
    each = np.zeros(x.shape)
    for c in candidates:
        c = np.broadcast_to(c, x.shape)
        cs = np.where(c == 0, 1.0, c)
        t = x / cs
        w = (np.abs(t) * (theta + 4 * u) + near / cs) * (1 + u) / (1 - theta) * (1 + 2**-20)
        for end in (round_nearest(t - w, number), round_nearest(t + w, number)):
            kernel = np.where(c == 0, 0.0, cs * end)
            each = np.maximum(each, np.abs(kernel - values) + theta * np.abs(kernel))
    each = each * (1 + theta)
    if reach is not None:
        each = np.where(loose, np.abs(values) + 2 * reach, each)
    return Held(values, u + 2.0**-52, each)  # rel: the descale's rounding, and s·ñ's


def _floor_log2(a: np.ndarray) -> np.ndarray:
    """``⌊log₂ a⌋`` for ``a > 0`` (exact, from the binary exponent); 0 where ``a`` is 0."""
    _, e = np.frexp(a)
    return np.where(a > 0, e - 1, 0)


def _power_of_two(
    amax: np.ndarray, slack: np.ndarray, e_max: int
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray], np.ndarray]:
    """MX's ``X = 2^{⌊log₂ amax⌋ − e_max}`` (1 where ``amax`` is 0), the kernel's candidates
    (its amax within ``slack``: the exponents at both ends) and where they are not
    neighbours (``undecided``: charged whole)."""
    low = _floor_log2(np.maximum(amax - slack, 0.0))
    high = _floor_log2(amax + slack)

    def scale_of(e: np.ndarray) -> np.ndarray:
        return np.where(amax > 0, np.ldexp(1.0, e - e_max), 1.0)

    return scale_of(_floor_log2(amax)), (scale_of(low), scale_of(high)), high - low > 1


def _two_level(
    x: np.ndarray, amax: np.ndarray, slack: np.ndarray, top: float, u: float
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray], np.ndarray, np.ndarray]:
    """NVFP4's scale ``s_b·s_t``: ``s_t = fl32(amax_tensor/(max_F·448))``, ``s_b =
    RN_e4m3(amax_b/(max_F·s_t))``; the kernel's ``s_t' = s_t(1 + θ_t)`` and its ``s_b``
    one of ``RN_e4m3`` at both ends of its window (``undecided`` where they are not
    neighbours: charged whole)."""
    a_t = float(np.abs(x).max(initial=0.0))
    if a_t == 0:
        one = np.ones(x.shape)
        return one, (one, one), np.zeros(x.shape), np.zeros(x.shape, bool)
    s_t = float(np.float32(a_t / (top * TWO_LEVEL_TOP)))
    theta_t = (1 + float(slack.max(initial=0.0)) / a_t) * (1 + u) ** 2 - 1 + 2.0**-24
    r = amax / (top * s_t)
    eps = (1 + slack / np.where(amax > 0, amax, 1.0)) * (1 + u) / (1 - theta_t) - 1
    low, high = round_nearest(r * (1 - eps), "e4m3"), round_nearest(r * (1 + eps), "e4m3")
    p, e_min, _ = MINIFLOATS["e4m3"]
    step = np.ldexp(1.0, np.maximum(_floor_log2(low), e_min) - (p - 1))  # to low's neighbour
    undecided = high > low + step
    scale = round_nearest(r, "e4m3") * s_t
    theta = np.full(x.shape, (1 + theta_t) * (1 + u) ** 3 - 1)
    return scale, (low * s_t, high * s_t), theta, undecided
