"""The certified reference: naive softmax attention over arb balls, a block of query rows at a time.

For real inputs ``Q (n_q×d)``, ``K (n_k×d)``, ``V (n_k×v)`` and an upstream ``G (n_q×v)``,
all taken as the exact binary values their floats hold, this module returns balls that
*enclose* the exact values of

    s_ij = c·q_i·k_j,  then  cap·tanh(s_ij/cap) (softcap),  then  + B_ij (bias),
    then  s̃_ij = mod(s_ij, b, h, i, j) (a FlexAttention score_mod; s̃ = s without one),
    A_i  = {j : allowed_ij and B_ij ≠ −∞ and s̃_ij ≠ −∞},   m_i = max_{j∈A_i} s̃_ij,
    P_ij = e^{s_ij − m_i} / ℓ_i,   ℓ_i = Σ_{j∈A_i} e^{s_ij − m_i},   Y = (P∘ρ)V,
    lse_i = m_i + log ℓ_i,
    dP = G Vᵀ,   δ_i = Σ_j P_ij ρ_ij dP_ij,   dS = P∘(ρ∘dP − δ),   dB = dS,
    dB = dS∘σ,   dS̃ = dS∘σ∘(1 − tanh²(c·q_i·k_j/cap)),   dQ = c·dS̃ K,   dK = c·dS̃ᵀ Q,
    dV = (P∘ρ)ᵀ G,   σ_ij = ∂mod/∂s at s_ij

(with P, lse over s̃; ``σ = 1`` without a score_mod, no tanh factor without softcap; softcap →
bias → score_mod → mask is the order of the core, flash-attn and Gemma 2, and FlexAttention
applies its score_mod before the mask). The score_mod is evaluated over the balls, written
with operators, constants and :mod:`exactattn.core.ops`: its value is ``mod`` of the ball, and
``σ`` is the tangent of :class:`exactattn.core.ops.Dual` (forward-mode, ``f(s + ε) = f(s) +
ε·f′(s)``), a ball too; the same mod in float64 gives the shift and which pairs it
sends to −∞. The index arguments are FlexAttention's: ``b, h`` the batch dims lifted to
``(B, H)`` (``()`` → ``(0, 0)``, ``(B,)`` → ``(b, 0)``), ``q_idx``, ``kv_idx`` int64 torch
tensors (NumPy arrays without torch) broadcasting to the tile. Dropout factors are
``ρ_ij = r_ij/(1 − p)`` with keep-bits ``r = keep``; ``1/(1 − p)`` is enclosed in arb,
not rounded to a float, so the reference is the exact dropout of the definition. A row
with no allowed key has ``Y = 0``, ``lse = −∞`` and zero gradients
(:attr:`Enclosure.empty_rows`). Leading (batch/head) dims broadcast; each
gradient is summed to its input's shape, ``dbias`` to the bias's.

This is the naive computation, written independently of the tiled algorithm
(:mod:`exactattn.core.algorithm`): each block of ``r`` query rows sees its whole rows of scores
over all keys, and ``δ`` is summed over ``P`` (not read from ``G·Y``), so it shares no
step with the code it judges. Memory is ``O(r·n_k)`` balls, never ``(n_q, n_k)``.

**Rigour.** Every number is an Arb ball (python-flint) and every operation returns a ball
containing the exact result, so each output encloses the exact value. The shift ``m_i`` is
the float64 row maximum of the scores computed in NumPy: any *exact* number serves as the
shift, because ``P``, ``Y`` and ``lse = m + log ℓ`` do not depend on it (docs/algorithm.md: the
homomorphism of ⋆ into addition); a float near the true maximum keeps ``e^{s−m} ≲ 1``
and, being exact, adds no radius. Outputs come back as double-double midpoints
``hi + lo`` with float64 radii rounded up that also cover ``mid − (hi + lo)``, so
``[hi + lo ± rad]`` itself encloses the exact value (and no radius is below ~2^-104 of
its midpoint, the double-double's own resolution).

**Speed.** Every product is an ``arb_mat`` product (FLINT's block algorithm over exact
integer matrices); the shift rides in the score product as an extra column,
``[q_i, −m_i]·[c·k_j; 1] = s_ij − m_i``; ``e^{s−m}`` is computed once per allowed pair and
reused by the reverse; the normalisation ``1/ℓ_i`` is applied to the (r × d) operands,
never to the (r × n_k) tiles. What is left per pair is Python-level: one ``exp``, two
products and a difference (plus ``tanh`` with softcap). ``workers > 1`` splits the blocks
of rows over processes; each returns its gradient sums as enclosures ``[hi + lo ± rad]``,
added in double-double with the rounding of that sum bounded into the radius.

**Precision.** Next to the balls, the float64 *magnitudes of the summands* of every output
element are formed (``Σ_j P_ij ρ_ij |V_ja|`` for ``Y``, ``|m| + log ℓ`` for lse, and the
same with ``|dP|``, ``|δ|`` for the gradients). ``prec=None`` tries :data:`LADDER` in order
and keeps the first precision at which every radius is at most ``2^-TARGET_BITS``
(2^-70) times its element's summand magnitude (plus 2^-1060 absolute): 2^-17 below the
unit roundoff at which float64 rounds the same sum, so the reference never limits what it
measures, even for elements that cancel to ~0 (``dbias`` rows sum to exactly 0). The last
rung is kept if none meets it (:attr:`Enclosure.target_met`); an explicit ``prec`` is
used as given.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import numbers
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import mpmath
import numpy as np

from ..infra.optional import needs
from .problem import (
    FLOOR,
    Problem,
    batch_source,
    check_int,
    check_problem,
    check_real,
    meets_target,
)

with needs("exactattn.certified"):
    import flint
    from flint import arb, arb_mat, fmpq, fmpz

LADDER = (96, 128, 192, 320)
ROW_BLOCK_BALLS = 2**19  # r·n_k balls per block of rows (~50 MB per tile of balls)

_ZERO = arb(0)
_ONE = arb(1)
_TINY = 2.0**-1074


# --- the result -------------------------------------------------------------------------
@dataclass(frozen=True)
class Ball:
    """One output: the exact value lies within ``rad`` of ``hi + lo``, elementwise.

    ``terms`` is the float64 magnitude of the summands of each element (the scale that
    the precision target is measured against).
    """

    hi: np.ndarray
    lo: np.ndarray
    rad: np.ndarray
    terms: np.ndarray

    @property
    def max_radius(self) -> float:
        return float(self.rad.max(initial=0.0))

    def accuracy_bits(self) -> float:
        """``min log2(terms / rad)`` over the elements whose radius exceeds the 2^-1060 floor
        (inf if none): how far below its summands' magnitude each element is certified."""
        wide = self.rad > FLOOR
        with np.errstate(divide="ignore"):
            bits = np.log2(self.terms[wide]) - np.log2(self.rad[wide])
        return float(bits.min(initial=math.inf))

    def error(self, x: Any) -> np.ndarray:
        """``|x − (hi + lo)|`` as float64, the difference formed in double-double.

        ``x``: a real float array shaped like the output (float16/32/64 convert exactly).
        ``x − hi`` is formed exactly (TwoSum), so float64 results are measured to ~2^-104
        relative. Equal infinities (an empty row's ``lse``) have error 0, others inf.
        """
        x = self._like(check_real("x", x)).astype(np.float64)
        with np.errstate(invalid="ignore"):
            s = x - self.hi
            b = s - x
            t = (x - (s - b)) + (-self.hi - b)  # s + t = x − hi exactly
            err = np.abs(s + (t - self.lo))
        same = (x == self.hi) & np.isinf(x)
        return np.where(same, 0.0, np.where(np.isnan(err), np.inf, err))

    def distance(self, x: Any) -> np.ndarray:
        """An upper bound on ``|x − exact|``: :meth:`error` widened by its own two roundings
        (≤ 2u of ``|s| + |t − lo|`` ≤ 2u·(error + |lo|), taken as 2^-50), plus ``rad``."""
        err = self.error(x)
        bound = (err + 2.0**-50 * (err + np.abs(self.lo)) + self.rad) * (1 + 2.0**-50)
        return bound + np.where(bound > 0, _TINY, 0.0)  # an exact 0 had no rounding

    def contains(self, x: Any) -> np.ndarray:
        """Elementwise ``|x − (hi + lo)| ≤ rad``, decided exactly (arb at 4096 bits).

        ``x``: real floats, or an object array of mpmath ``mpf`` (e.g. a 300-bit witness).
        """
        x = self._like(np.asarray(x))
        out = np.empty(x.shape, dtype=bool)
        with _precision(4096):
            for index in np.ndindex(*x.shape):
                point, hi = x[index], float(self.hi[index])
                if math.isinf(hi) or _is_infinite(point):
                    out[index] = _is_infinite(point) and float(point) == hi
                    continue
                gap = _exact(point) - arb(hi) - arb(float(self.lo[index]))
                out[index] = bool(abs(gap) <= arb(float(self.rad[index])))
        return out

    def mpf(self) -> np.ndarray:
        """Midpoints ``hi + lo`` as an object array of exact mpmath ``mpf``."""
        out = np.empty(self.hi.shape, dtype=object)
        for index in np.ndindex(*self.hi.shape):
            hi, lo = mpmath.mpf(float(self.hi[index])), mpmath.mpf(float(self.lo[index]))
            out[index] = mpmath.fadd(hi, lo, exact=True) if mpmath.isfinite(hi) else hi
        return out

    def _like(self, x: np.ndarray) -> np.ndarray:
        if x.shape != self.hi.shape:
            raise ValueError(f"x has shape {x.shape}; this output has shape {self.hi.shape}")
        return x


@dataclass(frozen=True)
class Enclosure:
    """Enclosures of ``y``, ``lse`` (and ``dq``, ``dk``, ``dv``, ``dbias`` when computed):
    ``enc["y"]`` is a :class:`Ball` (midpoints, radii, error and containment helpers)."""

    balls: dict[str, Ball]
    prec: int
    seconds: float
    empty_rows: np.ndarray  # bool (*batch, n_q): rows with no allowed key
    target_met: bool

    def __getitem__(self, name: str) -> Ball:
        if name not in self.balls:
            raise KeyError(f"no output {name!r}; this enclosure has {sorted(self.balls)}")
        return self.balls[name]

    @property
    def max_radius(self) -> float:
        """The largest radius over every output."""
        return max((b.max_radius for b in self.balls.values()), default=0.0)


def _is_infinite(x: Any) -> bool:
    return isinstance(x, (float, np.floating, mpmath.mpf)) and mpmath.isinf(x)


def _exact(x: Any) -> arb:
    """An exact ball for a float or an mpf."""
    mpf = getattr(x, "_mpf_", None)
    if mpf is None:
        return _exact_float(x)
    sign, man, exp, _ = mpf
    return arb(fmpz(-man if sign else man)) * arb(2) ** exp


def _exact_float(x: Any) -> arb:
    if isinstance(x, numbers.Integral):
        return arb(fmpz(int(x)))
    if isinstance(x, np.longdouble) and np.finfo(np.longdouble).nmant > 52:
        return arb(fmpq(*x.as_integer_ratio()))
    return arb(float(x))


@contextmanager
def _precision(bits: int) -> Iterator[None]:
    saved = flint.ctx.prec
    flint.ctx.prec = bits
    try:
        yield
    finally:
        flint.ctx.prec = saved


# --- the public functions ---------------------------------------------------------------
def certified_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray | None = None,
    *,
    scale: float | None = None,
    allowed: np.ndarray | None = None,
    keep: np.ndarray | None = None,
    dropout_p: float = 0.0,
    bias: np.ndarray | None = None,
    softcap: float | None = None,
    score_mod: Callable[..., Any] | None = None,
    prec: int | None = None,
    row_block: int | None = None,
    workers: int = 1,
    enable_gqa: bool = False,
) -> Enclosure:
    """Enclosures of naive attention and, with ``g``, of its VJP (see the module docstring).

    ``q (..., n_q, d)``, ``k (..., n_k, d)``, ``v (..., n_k, v)``, ``g (*batch, n_q, v)``:
    real float arrays, taken exactly. ``scale``: ``c`` as an exact int or float (``None``:
    ``1/sqrt(d)`` enclosed in arb). ``allowed``: booleans broadcastable to
    ``(*batch, n_q, n_k)`` (``None``: every pair). ``keep``, ``dropout_p``: the dropout
    factors ``ρ = keep/(1 − p)``, booleans broadcastable like ``allowed`` and a float ``p``
    (``1/(1 − p)`` is enclosed; a float ρ array would hold it rounded and so define a
    different dropout from the one under test). ``bias``: floats
    broadcastable to ``(*batch, n_q, n_k)``, ``−∞`` excludes a pair. ``softcap``: a
    positive cap. ``score_mod``: FlexAttention's ``score_mod(score, b, h, q_idx, kv_idx)``
    (see the module docstring; a mod that calls a torch function on the score raises a
    TypeError: it cannot be evaluated over balls). ``prec``: bits (``None``: the lowest rung
    of :data:`LADDER` that meets the 2^-70 target). ``row_block``: query rows per block
    (``None``: ~2^19/n_k).
    ``workers``: processes to split the blocks over. ``enable_gqa``: axis −3 holds heads,
    ``H`` for q and ``H_kv`` (dividing ``H``) for k and v; query head ``h`` reads key/value
    head ``h // (H/H_kv)`` (torch SDPA's convention), and dK, dV sum over each group.
    """
    problem = check_problem(
        q, k, v, g, scale, allowed, keep, dropout_p, bias, softcap, enable_gqa, score_mod
    )
    prec = check_int("prec", prec, 16)
    workers = check_int("workers", workers, 1)
    rows = check_int("row_block", row_block, 1) or _row_block(problem, workers)
    start = time.perf_counter()
    for bits in (prec,) if prec is not None else LADDER:
        balls, empty = _evaluate(problem, bits, rows, workers)
        met = all(meets_target(ball) for ball in balls.values())
        if met:
            break
    return Enclosure(balls, bits, time.perf_counter() - start, empty, met)


def _row_block(problem: Problem, workers: int) -> int:
    """~2^19 / n_k rows (GEMMs lose speed below ~128 rows), at least one block per worker."""
    n_q, batch = problem.q.shape[-2], math.prod(problem.batch)
    rows = max(1, ROW_BLOCK_BALLS // max(problem.k.shape[-2], 1))
    return max(1, min(rows, -(-n_q * batch // workers)))


def cpu_seconds() -> float:
    """CPU time of this process and of its finished worker processes."""
    try:
        import resource
    except ImportError:  # not on Windows: this process only
        return time.process_time()
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + child.ru_utime + child.ru_stime


# --- evaluation over blocks of rows -----------------------------------------------------
Item = tuple[tuple[int, ...], int, int]  # (batch index, first row, end row)
Part = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # hi, lo, rad, terms


def _evaluate(
    problem: Problem, prec: int, rows: int, workers: int
) -> tuple[dict[str, Ball], np.ndarray]:
    n_q = problem.q.shape[-2]
    items = [
        (index, r0, min(r0 + rows, n_q))
        for index in np.ndindex(*problem.batch)
        for r0 in range(0, n_q, rows)
    ]
    workers = min(workers, max(len(items), 1))
    shares = [
        items[i * len(items) // workers : (i + 1) * len(items) // workers] for i in range(workers)
    ]
    if workers == 1:
        parts = [_run_share(problem, prec, items)]
    else:
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        with ProcessPoolExecutor(workers - 1, mp_context=context) as pool:
            futures = [pool.submit(_run_share, problem, prec, share) for share in shares[1:]]
            parts = [_run_share(problem, prec, shares[0])]
            parts += [future.result() for future in futures]
    return _assemble(problem, parts)


@dataclass
class _Share:
    """What one process computed, as floats: row outputs per block of rows and its partial
    gradient sums per key, each a :data:`Part` ``(hi, lo, rad, terms)``."""

    rows: dict[str, dict[Item, Part]] = field(default_factory=lambda: {"y": {}, "lse": {}})
    empty: dict[Item, np.ndarray] = field(default_factory=dict)
    sums: dict[str, dict[tuple, Part]] = field(default_factory=dict)


class _Sums:
    """Ball matrices (and their summand magnitudes) summed per key, for one process."""

    def __init__(self) -> None:
        self.parts: dict[str, dict[tuple, tuple[arb_mat, np.ndarray]]] = {}

    def add(self, name: str, key: tuple, value: arb_mat, terms: np.ndarray) -> None:
        parts = self.parts.setdefault(name, {})
        if key in parts:
            old, old_terms = parts[key]
            parts[key] = (old + value, old_terms + terms)
        else:
            parts[key] = (value, terms)

    def split(self) -> dict[str, dict[tuple, Part]]:
        out: dict[str, dict[tuple, Part]] = {}
        for name, parts in self.parts.items():
            out[name] = {}
            for key, (value, terms) in parts.items():
                shape = (value.nrows(), value.ncols())
                hi, lo, rad = (x.reshape(shape) for x in _split(value.entries()))
                out[name][key] = (hi, lo, rad, terms)
        return out


def _run_share(problem: Problem, prec: int, items: list[Item]) -> _Share:
    share, sums = _Share(), _Sums()
    keys: dict[tuple, _Keys] = {}
    nb = len(problem.batch)
    with _precision(prec):
        consts = _Consts.of(problem)
        for item in items:
            src = tuple(
                batch_source(item[0], x.shape, nb, problem.group) for x in (problem.k, problem.v)
            )
            if src not in keys:
                keys[src] = _Keys.of(problem.k[src[0]], problem.v[src[1]], consts)
            block = _Block(problem, consts, keys[src], *item)
            share.empty[item] = block.empty
            share.rows["y"][item] = block.y()
            share.rows["lse"][item] = block.lse()
            if problem.g is not None:
                block.reverse(sums)
        share.sums = sums.split()
    return share


def _assemble(problem: Problem, shares: list[_Share]) -> tuple[dict[str, Ball], np.ndarray]:
    """The processes' shares as one :class:`Ball` per output, each shaped like its input."""
    p = problem
    n_q = p.q.shape[-2]
    empty = np.ones((*p.batch, n_q), dtype=bool)
    outs = {"y": _Out((*p.batch, n_q, p.v.shape[-1])), "lse": _Out((*p.batch, n_q))}
    for share in shares:
        for (index, r0, r1), flags in share.empty.items():
            empty[(*index, slice(r0, r1))] = flags
        for name, blocks in share.rows.items():
            for (index, r0, r1), part in blocks.items():
                outs[name].put((*index, slice(r0, r1)), part)
    balls = {name: out.ball() for name, out in outs.items()}
    if p.g is None:
        return balls, empty
    gradients = {"dq": p.q.shape, "dk": p.k.shape, "dv": p.v.shape}
    if p.bias is not None:
        gradients["dbias"] = p.bias.shape
    for name, shape in gradients.items():
        out = _Out(shape)
        keys = {key for share in shares for key in share.sums.get(name, {})}
        for key in keys:
            part = _merge([s.sums[name][key] for s in shares if key in s.sums.get(name, {})])
            src, r0 = key if len(key) == 2 else (key[0], 0)
            out.put((*src, slice(r0, r0 + part[0].shape[0])), part)
        balls[name] = out.ball()
    return balls, empty


def _merge(parts: list[Part]) -> Part:
    """The sum of enclosures ``[hi + lo ± rad]``, still an enclosure (vectorised float64).

    The 2W doubles are summed by TwoSum into ``s`` with exact error terms ``t_k``; their
    float sum ``e`` is off by at most ``γ_{2W}·Σ|t_k| ≤ 4W·u·Σ|t_k|``, which joins the
    radii; the factor ``1 + 4W·u`` and ``+2^-1074`` cover the rounding of this bound.
    """
    if len(parts) == 1:
        return parts[0]
    values = [x for hi, lo, _, _ in parts for x in (hi, lo)]
    s, e, spread = values[0], np.zeros_like(values[0]), np.zeros_like(values[0])
    for x in values[1:]:
        total = s + x
        back = total - s
        t = (s - (total - back)) + (x - back)  # total + t = s + x exactly
        s, e, spread = total, e + t, spread + np.abs(t)
    hi = s + e
    back = hi - s
    lo = (s - (hi - back)) + (e - back)  # TwoSum: hi + lo = s + e exactly
    w = 4 * len(parts) * 2.0**-53
    rad = sum(part[2] for part in parts) + w * spread
    terms = sum(part[3] for part in parts)
    return hi, lo, rad * (1 + w) + np.where((rad > 0) | (spread > 0), _TINY, 0.0), terms


class _Out:
    """Midpoints ``(hi, lo)``, radii and summand magnitudes of one output, filled by parts."""

    def __init__(self, shape: tuple[int, ...]):
        self.hi, self.lo, self.rad, self.terms = (np.zeros(shape) for _ in range(4))

    def put(self, where: tuple, part: Part) -> None:
        target = self.hi[where].shape
        for array, values in zip((self.hi, self.lo, self.rad, self.terms), part):
            array[where] = np.reshape(values, target)

    def ball(self) -> Ball:
        return Ball(self.hi, self.lo, self.rad, self.terms)


def _split(values: list[arb]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Balls → ``(hi, lo, rad)``: ``hi = fl(mid)``, ``lo = fl(mid − hi)``, and ``rad`` rounded
    up and widened by ``|mid − hi − lo| ≤ 2^-52·|lo| + 2^-1074`` (0 for an exact 0 or −∞)."""
    hi = np.array([float(e) for e in values], dtype=np.float64)
    lo = np.array(
        [float(e.mid() - h) if math.isfinite(h) else 0.0 for e, h in zip(values, hi.tolist())],
        dtype=np.float64,
    )
    rad = np.nextafter(np.array([float(e.rad()) for e in values], dtype=np.float64), np.inf)
    rad = (rad + np.abs(lo) * 2.0**-52) * (1 + 2.0**-50) + _TINY
    for i in np.flatnonzero((hi == 0) | np.isinf(hi)):  # exact zeros and −∞ stay exact
        e = values[i]
        if e.is_zero() or (not e.is_finite() and e.is_exact()):
            rad[i] = 0.0
    return hi, lo, rad


# --- one block of query rows ------------------------------------------------------------
@dataclass(frozen=True)
class _Consts:
    """The scalars as balls (and floats for the shift and the magnitudes)."""

    c: arb
    c_float: float
    cap: arb | None
    kappa: arb  # 1/(1 − p)
    ctx: Any  # the balls as a number system, for a score_mod's Dual

    @classmethod
    def of(cls, p: Problem) -> _Consts:
        from ..backends.flint_backend import FlintContext

        c = arb(p.q.shape[-1]).rsqrt() if p.scale is None else _exact_float(p.scale)
        cap = None if p.softcap is None else arb(p.softcap)
        ctx = FlintContext(flint.ctx.prec)
        return cls(c, float(c), cap, _ONE / (_ONE - arb(p.dropout_p)), ctx)


@dataclass(frozen=True)
class _Keys:
    """One batch element's keys and values as ball matrices: ``[c·Kᵀ; 1]`` (``c/cap·Kᵀ``
    with softcap), ``K``, ``V``, ``Vᵀ``, and the floats for the shift and magnitudes."""

    scores: arb_mat
    k: arb_mat
    v: arb_mat
    vt: arb_mat
    k_float: np.ndarray
    v_float: np.ndarray

    @classmethod
    def of(cls, k: np.ndarray, v: np.ndarray, consts: _Consts) -> _Keys:
        n_k, d = k.shape
        kt = arb_mat(d, n_k, _entries(k.T))
        if consts.cap is None:  # the row of ones carries the shift: [q_i, −m_i]·[c·k_j; 1]
            scores = arb_mat(d + 1, n_k, (kt * consts.c).entries() + [_ONE] * n_k)
        else:
            scores = kt * (consts.c / consts.cap)
        vm = arb_mat(n_k, v.shape[1], _entries(v))
        return cls(scores, kt.transpose(), vm, vm.transpose(), _f64(k), _f64(v))


def _f64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)


def _entries(x: np.ndarray) -> list[Any]:
    """Row-major entries of a float array as exact arb-convertible values."""
    if x.dtype == np.longdouble and np.finfo(np.longdouble).nmant > 52:
        return [_exact_float(e) for e in x.reshape(-1)]
    return x.astype(np.float64).reshape(-1).tolist()


class _Block:
    """Rows ``r0:r1`` of batch element ``index`` against every key: forward, then reverse."""

    def __init__(self, p: Problem, consts: _Consts, keys: _Keys, index, r0: int, r1: int):
        self.p, self.consts, self.keys, self.index = p, consts, keys, index
        self.item = (index, r0, r1)
        nb = len(p.batch)
        self.q = p.q[batch_source(index, p.q.shape, nb)][r0:r1]
        r, n_k = r1 - r0, keys.k_float.shape[0]
        self.r, self.n_k = r, n_k
        at = (*index, slice(r0, r1))
        self._shift_and_weights(at)
        # scores in arb, shifted: e^{s − m} once per allowed pair; the shift rides in the
        # score product unless a soft-cap or a score_mod must see the unshifted score
        shifted = consts.cap is None and p.score_mod is None
        if consts.cap is None:
            shift = self.m if shifted else np.zeros(r)
            lhs = np.concatenate([_f64(self.q), -shift[:, None]], axis=1)
            s = self._pick(
                (arb_mat(r, lhs.shape[1], lhs.reshape(-1).tolist()) * keys.scores).entries()
            )
            self.t = None
        else:
            x = self._pick((arb_mat(r, self.q.shape[1], _entries(self.q)) * keys.scores).entries())
            self.t = [e.tanh() for e in x]
            s = [t * consts.cap for t in self.t]
        if self.bias is not None:
            s = [e + b for e, b in zip(s, self._pick(self.bias.reshape(-1).tolist()))]
        self.sigma = None  # ∂mod/∂s per allowed pair
        if p.score_mod is not None:
            s, self.sigma = self._modified(s)
        if not shifted:
            s = [e + m for e, m in zip(s, self._per_pair((-self.m).tolist()))]
        self.e = list(map(arb.exp, s))
        self.e_mat = arb_mat(r, n_k, self._full(self.e))
        self.ones = arb_mat(n_k, 1, [_ONE] * n_k)
        self.l = (self.e_mat * self.ones).entries()
        if p.keep is not None:
            kept = np.broadcast_to(p.keep, p.grid)[at]
            tile = np.array(self._full(self.e), dtype=object).reshape(r, n_k)
            self.ek_mat = arb_mat(r, n_k, np.where(kept, tile, _ZERO).reshape(-1).tolist())
            self.kept = self._pick(kept.reshape(-1).tolist())
        else:
            self.ek_mat, self.kept = self.e_mat, None
        self.inv_l = [_ZERO if self.empty[i] else _ONE / self.l[i] for i in range(r)]

    def _shift_and_weights(self, at: tuple) -> None:
        """Float64 scores → the shift ``m`` (row max over ``A_i``), ``A_i`` and the float
        weights ``P∘ρ`` used only for the summand magnitudes."""
        p, keys = self.p, self.keys
        ok = None if p.allowed is None else np.broadcast_to(p.allowed, p.grid)[at]
        self.bias = None if p.bias is None else _f64(np.broadcast_to(p.bias, p.grid)[at])
        with np.errstate(over="ignore", invalid="ignore"):
            s = self.consts.c_float * (_f64(self.q) @ keys.k_float.T)
            self.slope = np.ones_like(s)  # |∂s/∂(c·q·k)|, 1 − tanh² with softcap
            if p.softcap is not None:
                t = np.tanh(s / p.softcap)
                s, self.slope = p.softcap * t, 1 - t * t
            if self.bias is not None:
                s = s + self.bias
                finite = self.bias != -np.inf
                ok = finite if ok is None else ok & finite
            self.sigma_float = None
            if p.score_mod is not None:
                s, sigma = _apply_mod(p.score_mod, self._mod_indices(), _numpy_f64(), s, 1.0)
                self.sigma_float = np.abs(sigma)
                self.slope = self.slope * self.sigma_float
                finite = s != -np.inf
                ok = finite if ok is None else ok & finite
        masked = s if ok is None else np.where(ok, s, -np.inf)
        m = masked.max(axis=1, initial=-np.inf)
        if np.isnan(masked).any() or (m == np.inf).any():
            raise ValueError("a score overflows float64 (|c·q·k| > 1.8e308); rescale the inputs")
        self.empty = m == -np.inf
        self.m = np.where(self.empty, 0.0, m)
        self.sel = None if ok is None else np.flatnonzero(ok)
        counts = np.full(self.r, self.n_k) if ok is None else ok.sum(axis=1)
        self.bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()  # row starts in sel
        with np.errstate(under="ignore"):
            w = np.exp(masked - self.m[:, None])
        self.l_float = w.sum(axis=1)
        p_float = w / np.where(self.empty, 1.0, self.l_float)[:, None]
        rho = (
            1.0
            if p.keep is None
            else np.broadcast_to(p.keep, p.grid)[at] * float(self.consts.kappa)
        )
        self.p_float, self.prho_float = p_float, p_float * rho

    def _mod_indices(self) -> tuple[Any, ...]:
        """FlexAttention's ``(b, h, q_idx, kv_idx)`` for this block (see the module
        docstring), broadcasting to ``(1, 1, r, n_k)``."""
        b, h = (*self.index, 0, 0)[:2]
        r0, r1 = self.item[1], self.item[2]
        arrays = (
            np.full((1, 1, 1, 1), b, dtype=np.int64),
            np.full((1, 1, 1, 1), h, dtype=np.int64),
            np.arange(r0, r1, dtype=np.int64).reshape(1, 1, -1, 1),
            np.arange(self.n_k, dtype=np.int64).reshape(1, 1, 1, -1),
        )
        try:
            import torch
        except ImportError:
            return arrays
        return tuple(torch.from_numpy(x) for x in arrays)

    def _modified(self, s: list[arb]) -> tuple[list[arb], list[arb]]:
        """The score_mod over the balls of the allowed pairs: ``(mod(s), ∂mod/∂s)``."""
        tile = np.array(self._full(s), dtype=object).reshape(self.r, self.n_k)
        value, sigma = _apply_mod(
            self.p.score_mod, self._mod_indices(), self.consts.ctx, tile, _ONE
        )
        value, sigma = (self._pick(x.reshape(-1).tolist()) for x in (value, sigma))
        if not all(e.is_finite() for e in value):
            raise ValueError(
                f"score_mod {_name(self.p.score_mod)} is not finite over the balls at a pair "
                "whose float64 value is finite: raise prec"
            )
        return value, sigma

    def _pick(self, values: list[Any]) -> list[Any]:
        """The entries at the allowed pairs (row-major)."""
        if self.sel is None:
            return values
        return np.array(values, dtype=object)[self.sel].tolist()

    def _full(self, values: list[arb]) -> list[arb]:
        """Values at the allowed pairs → all r·n_k pairs, 0 elsewhere (row-major)."""
        if self.sel is None:
            return values
        full = np.full(self.r * self.n_k, _ZERO, dtype=object)
        full[self.sel] = values
        return full.tolist()

    def _per_pair(self, rows: list[Any]) -> list[Any]:
        """A per-row value repeated for each allowed pair of its row."""
        values = np.empty(len(rows), dtype=object)
        values[:] = rows
        return np.repeat(values, np.diff(self.bounds)).tolist()

    def _row_sums(self, values: list[arb]) -> list[arb]:
        """Sums over each row's allowed pairs."""
        b = self.bounds
        return [sum(values[b[i] : b[i + 1]], _ZERO) for i in range(self.r)]

    def y(self) -> tuple[np.ndarray, ...]:
        dv = self.keys.v_float.shape[1]
        z = (self.ek_mat * self.keys.v).entries()
        factors = [self.consts.kappa * w for w in self.inv_l]
        y = [x * factors[i // dv] for i, x in enumerate(z)]
        return (*_split(y), self.prho_float @ np.abs(self.keys.v_float))

    def lse(self) -> tuple[np.ndarray, ...]:
        lse = [
            arb(-math.inf) if self.empty[i] else arb(float(self.m[i])) + self.l[i].log()
            for i in range(self.r)
        ]
        with np.errstate(divide="ignore"):
            terms = np.abs(self.m) + np.abs(np.log(self.l_float))
        return (*_split(lse), np.where(self.empty, 0.0, terms))

    def reverse(self, sums: _Sums) -> None:
        """``dS`` of these rows; their ``dQ`` rows and their parts of ``dK``, ``dV``, ``dB``."""
        p, keys, consts, r, n_k = self.p, self.keys, self.consts, self.r, self.n_k
        nb = len(p.batch)
        d, dv = self.q.shape[1], keys.v_float.shape[1]
        g = p.g[self.index][self.item[1] : self.item[2]]
        dp = self._pick((arb_mat(r, dv, _entries(g)) * keys.vt).entries())
        if self.kept is not None:  # ρ_ij·dP_ij
            kappa = consts.kappa
            dp = [x * kappa if kept else _ZERO for x, kept in zip(dp, self.kept)]
        f = [e * x for e, x in zip(self.e, dp)]  # ℓ_i·P_ij·ρ_ij·dP_ij
        delta = self._per_pair([x * w for x, w in zip(self._row_sums(f), self.inv_l)])
        ds = [x - e * dl for x, e, dl in zip(f, self.e, delta)]  # ℓ_i·dS_ij
        if self.sigma is not None:  # through the score_mod: ℓ_i·dS_ij·σ_ij, the bias's too
            ds = [x * sigma for x, sigma in zip(ds, self.sigma)]
        ds_tilde = ds if self.t is None else [x * (_ONE - t * t) for x, t in zip(ds, self.t)]
        dmat = arb_mat(r, n_k, self._full(ds_tilde))
        w = [consts.c * x for x in self.inv_l]  # c/ℓ_i
        dq = [x * w[i // d] for i, x in enumerate((dmat * keys.k).entries())]
        qw = arb_mat(r, d, [x * w[i // d] for i, x in enumerate(_entries(self.q))])
        gw = [x * consts.kappa * self.inv_l[i // dv] for i, x in enumerate(_entries(g))]
        # summand magnitudes in float64: |dS_ij| ≤ P_ij(ρ_ij|dP_ij| + |δ_i|)
        gf = _f64(g)
        dp_abs = np.abs(gf) @ np.abs(keys.v_float.T)
        prho_dp = self.prho_float * dp_abs
        ds_abs = prho_dp + self.p_float * prho_dp.sum(axis=1, keepdims=True)
        ds_tilde_abs = abs(consts.c_float) * ds_abs * self.slope
        src = (
            batch_source(self.index, p.q.shape, nb),
            batch_source(self.index, p.k.shape, nb, p.group),
            batch_source(self.index, p.v.shape, nb, p.group),
        )
        r0 = self.item[1]
        sums.add("dq", (src[0], r0), arb_mat(r, d, dq), ds_tilde_abs @ np.abs(keys.k_float))
        sums.add("dk", (src[1],), dmat.transpose() * qw, ds_tilde_abs.T @ np.abs(_f64(self.q)))
        sums.add(
            "dv",
            (src[2],),
            self.ek_mat.transpose() * arb_mat(r, dv, gw),
            self.prho_float.T @ np.abs(gf),
        )
        if p.bias is not None:
            sigma = 1.0 if self.sigma_float is None else self.sigma_float
            self._bias_gradient(sums, ds, ds_abs * sigma)

    def _bias_gradient(self, sums: _Sums, ds: list[arb], ds_abs: np.ndarray) -> None:
        """``dB = dS`` summed to the bias's shape (rows and/or columns of size 1 are sums)."""
        p, r, n_k = self.p, self.r, self.n_k
        shape = p.bias.shape
        src = batch_source(self.index, shape, len(p.batch))
        if shape[-2] != 1 and shape[-1] != 1:
            part = arb_mat(r, n_k, [x * self.inv_l[i // n_k] for i, x in enumerate(self._full(ds))])
        elif shape[-2] != 1:
            part = arb_mat(r, 1, [x * w for x, w in zip(self._row_sums(ds), self.inv_l)])
        else:  # Σ_i dS_ij/… as the product (1/ℓ)ᵀ·(ℓ∘dS)
            part = arb_mat(1, r, self.inv_l) * arb_mat(r, n_k, self._full(ds))
            part = part * self.ones if shape[-1] == 1 else part
        terms = ds_abs.sum(axis=0, keepdims=True) if shape[-2] == 1 else ds_abs
        terms = terms.sum(axis=1, keepdims=True) if shape[-1] == 1 else terms
        sums.add("dbias", (src, self.item[1]) if shape[-2] != 1 else (src,), part, terms)


# --- a score_mod ------------------------------------------------------------------------
def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


@functools.cache
def _numpy_f64() -> Any:
    """float64 NumPy as the number system of a score_mod's :class:`~exactattn.core.ops.Dual`."""
    from ..backends import NumpyContext

    return NumpyContext("float64")


def _apply_mod(fn: Any, indices: tuple[Any, ...], ctx: Any, s: Any, one: Any) -> tuple[Any, Any]:
    """``(mod(s), ∂mod/∂s)`` on the tile ``s`` (r, n_k) as arrays of ``ctx``'s numbers, from
    one evaluation on the :class:`exactattn.core.ops.Dual` ``s + ε·one``."""
    from ..core.ops import Dual, TorchFunctionOnScore, constant

    shape = np.shape(s)
    try:
        out = fn(Dual(ctx, np.reshape(s, (1, 1, *shape)), one), *indices)
    except TorchFunctionOnScore as error:
        raise TypeError(
            f"score_mod {_name(fn)} calls torch.{error.function} on the score: the certified "
            f"reference evaluates it over arb balls, where the score is no torch tensor; "
            f"write it with exactattn.ops.{error.function} (it dispatches on the score's type)"
        ) from None
    if not isinstance(out, Dual):
        out = Dual(ctx, constant(ctx, out))
    try:
        value = np.broadcast_to(out.value, (1, 1, *shape)).reshape(shape)
        zero = ctx.scalar(0)
        tangent = zero if out.tangent is None else out.tangent
        sigma = np.broadcast_to(tangent, (1, 1, *shape)).reshape(shape)
    except ValueError:
        raise ValueError(
            f"score_mod {_name(fn)} returned shape {out.shape} for a score tile of shape "
            f"{(1, 1, *shape)}; a score_mod maps each score to one score"
        ) from None
    return value, sigma
