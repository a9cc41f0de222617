"""Elementwise error bounds for attention: Y, lse and the reverse's dQ, dK, dV (and dbias).

Derivation and assumptions: ``docs/error_bound.md``; notation of ``docs/algorithm.md``.
Given the arithmetic an implementation claims (:class:`Arith`) and its inputs exactly as it
holds them, :func:`bounds` returns arrays ``B`` with ``|computed − exact| ≤ B`` entrywise,
for the tiled forward (a fold of ``⋆`` over key blocks of ``b``) and the block-recomputed
reverse with frozen statistics (``δ_i = G_i·Y_i``; ``p_ij = e^{s_ij − m_i}/ℓ_i`` from the
forward's ``m, ℓ``, or ``e^{s_ij − lse_i}`` as the torch path keeps them).

The shape of the result. A weight ``e_ij = e^{s_ij − m}`` is computed with a relative
perturbation common to ``z`` and ``ℓ`` (the score's error ``E_ij``, the exponentials, the
rounding of ``s − m``: the budget ``η_ij``), and the output moves by
``Σ_j w_ij η_ij |ρ_ij v_ja − Y_ia|``: weighted by the *spread* of the values around the
output, never by their size; the shift ``m`` cancels exactly. Roundings that touch only the
numerator (``θ``: the ``p·V`` product, the cast of ``p``, the rescales of ``z``) or only the
denominator (``λ``) add ``θ Σ_j w_ij ρ_ij |v_ja|`` and ``λ |Y_ia|``. The reverse carries the
relative error ``π_ij`` of the recomputed ``p`` (score error, and the frozen ``ℓ``'s or
``lse``'s own error) and the forward's error of ``Y`` through ``δ`` into
``γ_ij = p_ij (ρ_ij G_i·V_j − δ_i)``, then into the three products.

Rigour. Every relative error is carried as a budget ``β`` on ``|log(1 + ε)|``
(``ū = u/(1 − u)`` per rounding, budgets add along a chain) and turned into a bound with
``e^β − 1``, and quotients by their exact lower bound, so the bound is not a first-order
approximation: no acceptance factor is needed. It holds under the standard model with
gradual underflow, elementary functions within :attr:`Arith.funcs` units ``u`` (relative),
any summation order inside each accumulation, no overflow, and scores evaluated before the
mask (bias, then soft-cap, as :mod:`exactattn.core.scores`). It is evaluated in float64 from the
exact formulas, so it is meaningful for formats of at most 53 bits.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..backends.formats import Format, get_format, number_format

CHUNK = 1 << 19  # float64 elements of one (*batch, rows, n_k) temporary
SPREAD = 1 << 17  # ... of one (*batch, rows, n_k, dv) temporary of the spread term
STATS = ("ml", "lse")  # the reverse's frozen statistics: (m, ℓ), or lse with ℓ = 1
DELTAS = ("gy", "rowsum")  # δ_i = G_i·Y_i (tiled), or Σ_j p_ij dP_ij (naive attention)
ROUNDINGS = ("nearest", "toward_zero")
HALF_FUNCS = 1.001  # NumPy/torch half exp, log, tanh: float32 (≤ 4·2^-24) rounded once
FLOAT64 = get_format("float64")
# An exponential's argument s − m costs three roundings: the subtraction, and where exp is
# taken as 2^{(s − m)·log₂e} (exactattn's torch path, as SLEEF's exp2 is faster) log₂e's
# rounding and the product; the telescoped arguments are charged for all three.
EXP_ARG_ROUNDINGS = 3
MU_FLOOR = 2.0**-1068  # 64 times the smallest positive float64 (see _mu)


@dataclass(frozen=True, eq=False)
class Entrywise:
    """A quantisation's error model per operand and per entry: ``|x̂ − x| ≤ rel[x]·|x| +
    abs[x]`` for ``x`` in ``q, k, v``, ``abs[x]`` broadcastable to ``x`` as given to
    :func:`bounds` (each entry its own group's ``s·μ`` or ``s/2``,
    :attr:`exactattn.backends.quantize.Quantized.abs_each`). With it the forward charges
    each entry of each operand its own error (the score's ``Σ_r Δq_ir|k_jr| + |q_ir|Δk_jr +
    Δq_ir Δk_jr``, the output's ``Σ_j ŵ_ij Δv_ja``) instead of the largest group's of all
    three (:attr:`Arith.quant_rel`, :attr:`Arith.quant_abs`, which the reverse still
    charges, and which must bound these)."""

    rel: dict[str, float]
    abs: dict[str, np.ndarray]


@dataclass(frozen=True)
class Arith:
    """The arithmetic an implementation claims.

    * ``input`` — the storage format of q, k, v, G (and of Y passed to the reverse);
    * ``compute`` — scores, ``m``, ``ℓ``, ``z``, ``lse``, δ, γ and the gradient
      accumulators, and every elementwise operation;
    * ``acc`` — the inner accumulation of each product and row sum (``QKᵀ``, ``ℓ``'s block
      sum, ``p·V``, ``G·V``, ``G·Y``, the gradient products), whose result is then rounded
      to ``compute``;
    * ``output`` — what Y and the gradients are returned in (lse stays in ``compute``);
    * ``p`` — the format p (times ρ) is cast to before the ``p·V`` product (None: no cast);
    * ``grad_cast`` — the format p and γ are cast to before the reverse's products
      (FlashAttention-2's kernels; None: no cast);
    * ``block`` — the key-block size ``b``; None is the worst case, one key per block
      (it bounds every ``b``); naive attention is any ``b ≥ n_k``;
    * ``funcs`` — exp, log and tanh err by at most ``funcs·u`` relative (4: NumPy's float32
      SIMD exp and log reach 3.6u and 4.0u; torch's 1.6u; correctly rounded is 1);
    * ``quant_rel``, ``quant_abs`` — a quantisation of the inputs, before they are held in
      ``input`` (with ``input_rounding``) or by the implementation itself (a kernel that
      quantises what it is given: :attr:`exactattn.targets.Options.quantisation`):
      ``|x̂ − x| ≤ quant_rel·|x| + quant_abs`` per entry (a block-scaled minifloat: its ``u``
      and the largest block's ``s·μ``; an integer format: ``s/2``;
      :mod:`exactattn.backends.quantize`), charged whenever stated; ``quant_each`` the same
      quantisation per operand and per entry (:class:`Entrywise`; the forward's charge);
    * ``pv_acc``, ``pv_chunk`` — the accumulator of the ``p·V`` product when it is not
      ``acc`` (an FP8 MMA's FP22), and the terms it sums before each addition into an
      ``acc`` buffer (two-level accumulation; None: the whole block in ``pv_acc``);
    * ``dp`` — the format ``dP = G·Vᵀ`` is rounded to before γ is formed (None: compute):
      autodiff through a ``P·V`` product held in the input format returns its ``dP`` in it
      (JAX's ``dot_product_attention``, :mod:`exactattn.targets.jax_attention`);
    * ``p_normalized`` — ``p`` is formed after the division by ``ℓ`` (naive attention's
      ``P = softmax(S)``, then ``P·V``): an underflow of its cast, of a product ``p_j v_j``
      or of their sum is an absolute ``μ`` in the output's units, ``ℓ·μ`` in units of
      ``e^{s − m}`` (the tiled algorithm forms ``e^{s − m_t} ≤ 1`` and needs no factor).
    """

    input: Format
    compute: Format
    acc: Format
    output: Format
    p: Format | None = None
    grad_cast: Format | None = None
    block: int | None = None
    funcs: float = 4.0
    quant_rel: float = 0.0
    quant_abs: float = 0.0
    pv_acc: Format | None = None
    pv_chunk: int | None = None
    p_normalized: bool = False
    dp: Format | None = None
    quant_each: Entrywise | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("input", "compute", "acc", "output"):
            if not isinstance(getattr(self, name), Format):
                raise TypeError(f"{name} must be a Format; got {getattr(self, name)!r}")
        block = self.block
        if block is not None and (isinstance(block, bool) or not isinstance(block, int)):
            raise TypeError(f"block must be an int >= 1 or None; got {block!r}")
        if block is not None and block < 1:
            raise ValueError(f"block must be >= 1 or None; got {block}")
        if not (isinstance(self.funcs, (int, float)) and self.funcs >= 0):
            raise ValueError(f"funcs must be a number >= 0; got {self.funcs!r}")
        for name in ("quant_rel", "quant_abs"):
            x = getattr(self, name)
            if not (
                isinstance(x, (int, float)) and 0 <= x < (1 if name == "quant_rel" else math.inf)
            ):
                raise ValueError(f"{name} must be a finite number >= 0 (quant_rel < 1); got {x!r}")
        for name in ("pv_acc", "dp"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), Format):
                raise TypeError(f"{name} must be a Format or None; got {getattr(self, name)!r}")
        chunk = self.pv_chunk
        if chunk is not None and (
            isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1
        ):
            raise ValueError(f"pv_chunk must be an int >= 1 or None; got {chunk!r}")

    @classmethod
    def ieee(
        cls,
        input: Any = "float32",
        compute: Any = None,
        *,
        p: Any = None,
        acc: Any = None,
        output: Any = None,
        grad_cast: Any = None,
        block: int | None = None,
    ) -> Arith:
        """Named formats; ``compute``, ``output`` default to ``input``, ``acc`` to ``compute``."""
        fin = number_format(input)
        fc = number_format(compute) if compute is not None else fin
        return cls(
            input=fin,
            compute=fc,
            acc=number_format(acc) if acc is not None else fc,
            output=number_format(output) if output is not None else fin,
            p=None if p is None else number_format(p),
            grad_cast=None if grad_cast is None else number_format(grad_cast),
            block=block,
        )

    @classmethod
    def bits(cls, prec: int, *, rounding: str = "nearest", block: int | None = None) -> Arith:
        """``prec`` significand bits everywhere, unbounded exponent (mpmath, emulations).

        ``rounding="toward_zero"`` (truncation) errs by up to one ulp, ``2^{1−prec}``
        relative: the bound is that of ``prec − 1`` bits rounded to nearest. Elementary
        functions are taken as faithful (``funcs = 2``).
        """
        if isinstance(prec, bool) or not isinstance(prec, int) or prec < 2:
            raise ValueError(f"prec must be an integer >= 2 bits; got {prec!r}")
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}; got {rounding!r}")
        fmt = get_format(f"p{prec if rounding == 'nearest' else prec - 1}")
        if rounding != "nearest":
            fmt = Format(f"p{prec}-{rounding}", fmt.p, None)
        return cls(input=fmt, compute=fmt, acc=fmt, output=fmt, block=block, funcs=2.0)

    @classmethod
    def emulated(cls, ctx: Any, *, block: int | None = None) -> Arith:
        """The arithmetic of an :class:`~exactattn.backends.emulated_backend.EmulatedContext`.

        Each result is the float64 result rounded to the format: within ``ū`` of the
        format for ``+ − × ÷`` up to 26 bits (twice rounded: ``u + 2^-53 ≤ u + u²``; truncation
        errs by less than ``2^{1−p}``, so it is bounded as ``p − 1`` bits to nearest, and its
        subnormals by a whole spacing). In ``"op"`` granularity a matmul or row sum is
        accumulated in float64 (``acc``) and rounded once, in ``"scalar"`` every product and
        addition is (``acc`` = compute). libm's ``exp``/``log`` (about one float64 ulp) then
        rounded: ``funcs = 2``.
        """
        if ctx.format.mantissa_bits > 26:
            raise ValueError(
                f"the bound covers emulated formats of at most 26 bits; got {ctx.format}"
            )

        def fmt(ef: Any) -> Format:
            nearest = ef.rounding == "nearest"
            p = ef.mantissa_bits if nearest else ef.mantissa_bits - 1
            return Format(f"p{ef.mantissa_bits}-{ef.rounding}", p, ef.emin)

        compute = fmt(ctx.format)
        storage = fmt(ctx.storage)
        return cls(
            input=storage,
            compute=compute,
            acc=FLOAT64 if ctx.granularity == "op" else compute,
            output=storage,
            p=None if ctx.p_cast is None else fmt(ctx.p_cast),
            block=block,
            funcs=2.0,
        )

    @classmethod
    def of_context(cls, ctx: Any, *, block: int | None = None) -> Arith:
        """The arithmetic of an exactattn context (NumPy, torch or mpmath).

        NumPy and torch on the CPU accumulate half-precision products and row sums in
        float32 and evaluate half exp, log, tanh in float32, rounded once
        (``tests/bounds/test_arith.py`` checks both, the functions on every input); on
        CUDA the accumulator is taken to be the compute type (cuBLAS may reduce in half
        precision) and the functions as ``funcs``.
        """
        from ..backends.mpmath_backend import MpmathContext

        if isinstance(ctx, MpmathContext):
            return cls.bits(ctx.prec, block=block)
        if type(ctx).__name__ == "EmulatedContext":
            return cls.emulated(ctx, block=block)
        storage = getattr(ctx, "storage_dtype", None)
        compute = getattr(ctx, "compute_dtype", None)
        if storage is None or compute is None:
            raise TypeError(f"no arithmetic known for {ctx!r}: pass an Arith built by hand")
        fc = number_format(compute)
        device = getattr(getattr(ctx, "device", None), "type", "cpu")
        half = fc.p < 24 and device == "cpu"
        acc = number_format("float32") if half else fc
        p_cast = getattr(ctx, "p_cast_dtype", None)
        arith = cls.ieee(storage, fc, p=p_cast, acc=acc, block=block)
        return replace(arith, funcs=HALF_FUNCS) if half else arith

    @classmethod
    def claim(cls, text: str) -> Arith:
        """From a claim like ``input=fp16,scores=fp32,stats=fp32,p=fp16,acc=fp32,block=128``.

        Keys: ``input``, ``scores``, ``stats`` (the coarser of the two is the compute
        format), ``p``, ``acc``, ``output``, ``grad_cast``, ``block``. Unstated formats are
        the input's (``acc``: the compute format); an unstated block is the worst case.
        """
        if not isinstance(text, str):
            raise TypeError(f"claim must be a string; got {type(text).__name__}")
        known = ("input", "scores", "stats", "p", "acc", "output", "grad_cast", "block")
        fields: dict[str, str] = {}
        for part in filter(None, (x.strip() for x in text.split(","))):
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or key not in known or not value:
                raise ValueError(
                    f"claim entry {part!r} in {text!r} is not key=value with a key of {known}"
                )
            fields[key] = value
        block = fields.pop("block", None)
        if block is not None and not re.fullmatch(r"[1-9]\d*", block):
            raise ValueError(f"claim block must be a positive integer; got {block!r}")
        fin = number_format(fields.get("input", "float32"))
        parts = [number_format(fields[x]) for x in ("scores", "stats") if x in fields]
        fc = max(parts, key=lambda f: f.u) if parts else fin
        return cls.ieee(
            fin,
            fc,
            p=fields.get("p"),
            acc=fields.get("acc"),
            output=fields.get("output"),
            grad_cast=fields.get("grad_cast"),
            block=None if block is None else int(block),
        )

    def with_block(self, block: int | None) -> Arith:
        """The same arithmetic at another key-block size."""
        return replace(self, block=block)


# --- unit roundoffs as log budgets ---------------------------------------------------------
def _lg(u: float) -> float:
    """The budget ``ū = u/(1 − u) ≥ |log(1 + ε)|`` of one rounding with ``|ε| ≤ u``."""
    return u / (1 - u) if u < 1 else math.inf


def _mu(fmt: Format) -> float:
    """``μ`` as the evaluation charges it: at least :data:`MU_FLOOR` (docs/error_bound.md §1).

    float64's own ``μ = 2^-1075`` (and longdouble's) is below float64's range and would
    evaluate to 0, so the subnormal error of float64 weights would vanish from the bound
    (tests/regressions/difftest_subnormal_weights_amplified.json). Raised to ``2^-1068``,
    each underflow event also pays for the float64 evaluation's own roundings below
    ``2^-1022`` (at most ``2^-1075`` each, fewer than 64 per event on any chain here).
    """
    return 0.0 if fmt.e_min is None else max(fmt.mu, MU_FLOOR)


def _cast(src: Format, dst: Format | None) -> tuple[float, float]:
    """``(ū, μ)`` of converting a ``src`` number to ``dst`` ((0, 0) when exact)."""
    if dst is None:
        return 0.0, 0.0
    fewer_bits = dst.p < src.p
    narrower = dst.e_min is not None and (src.e_min is None or dst.e_min > src.e_min)
    if not (fewer_bits or narrower):
        return 0.0, 0.0
    return (_lg(dst.u) if fewer_bits else 0.0), _mu(dst)


@dataclass(frozen=True)
class Units:
    """The rounding budgets one evaluation needs (see :class:`Arith` for the formats)."""

    uc: float  # ū of compute
    u_c: float  # u of compute (for |fl(x) − x| ≤ u|x|)
    mc: float  # μ of compute
    ua: float  # ū of the accumulator
    ma: float  # μ of the accumulator
    res: float  # rounding an accumulated result into compute
    uf: float  # one elementary function
    up: float  # forward cast of p
    mp: float
    ug: float  # reverse cast of p and γ
    mg: float
    uo: float  # u of the output cast
    mo: float
    ux: float  # inputs: rounding to storage (input_rounding) and to compute
    mx: float
    ub: float  # the bias converted to compute
    mb: float
    upv: float = 0.0  # ū of the p·V accumulator (Arith.pv_acc; 0: acc's, ua)
    mpv: float = 0.0
    pv_chunk: int | None = None
    ud: float = 0.0  # dP rounded to Arith.dp
    md: float = 0.0
    ux_in: float = 0.0  # ux, mx without the quantisation (Arith.quant_each charges it)
    mx_in: float = 0.0

    @classmethod
    def of(cls, arith: Arith, input_rounding: bool) -> Units:
        c = arith.compute
        ux, mx = _cast(arith.input, c)
        if input_rounding:
            ux, mx = ux + _lg(arith.input.u), mx + _mu(arith.input)
        up, mp = _cast(c, arith.p)
        ug, mg = _cast(c, arith.grad_cast)
        uo_bar, mo = _cast(c, arith.output)
        ub, mb = _cast(FLOAT64, c)
        if input_rounding:  # the bias too is held in the input format first
            ub, mb = ub + _lg(arith.input.u), mb + _mu(arith.input)
        ua = _lg(arith.acc.u)
        if arith.block is None:  # one key per block bounds every b only if ū_a ≤ ū_c
            ua = max(ua, _lg(c.u))
        ux_in, mx_in = ux, mx
        if arith.quant_rel or arith.quant_abs:  # quantised (then held, or by the kernel)
            mx += arith.quant_abs * math.exp(ux + _lg(arith.quant_rel))
            ux += _lg(arith.quant_rel)
        pv = arith.pv_acc
        ud, md = _cast(c, arith.dp)
        return cls(
            uc=_lg(c.u),
            u_c=c.u,
            mc=_mu(c),
            ua=ua,
            ma=_mu(arith.acc),
            res=_cast(arith.acc, c)[0],
            uf=_lg(arith.funcs * c.u),
            up=up,
            mp=mp,
            ug=ug,
            mg=mg,
            uo=arith.output.u if uo_bar else 0.0,
            mo=mo,
            ux=ux,
            mx=mx,
            ub=ub,
            mb=mb,
            upv=0.0 if pv is None else max(_lg(pv.u), ua),
            mpv=0.0 if pv is None else _mu(pv),
            pv_chunk=arith.pv_chunk,
            ud=ud,
            md=md,
            ux_in=ux_in,
            mx_in=mx_in,
        )

    def pv_terms(self, b: np.ndarray) -> np.ndarray:
        """The budget of one term of a block's ``p·V`` sum of ``b`` terms: ``b·ū_a``, or in a
        ``pv_acc`` of its own ``min(b, chunk)·ū_pv`` plus ``⌈b/chunk⌉`` additions into the
        ``acc`` buffer (two-level; without a chunk, ``b·ū_pv``)."""
        if not self.upv:
            return b * self.ua
        if self.pv_chunk is None:
            return b * self.upv
        c = self.pv_chunk
        return np.minimum(b, c) * self.upv + -(-b // c) * self.ua


# --- the problem, checked and laid out -----------------------------------------------------
@dataclass(frozen=True)
class Problem:
    """Inputs as float64 views over the logical batch ``(*B, …)`` and what the bound needs."""

    q: np.ndarray  # (*B, n_q, d)
    k: np.ndarray  # (*B, n_k, d) (GQA: key/value heads repeated over their group)
    v: np.ndarray  # (*B, n_k, dv)
    g: np.ndarray | None  # (*B, n_q, dv)
    c: float
    allowed: np.ndarray | None  # broadcast views (*B, n_q, n_k)
    rho: np.ndarray | None
    bias: np.ndarray | None
    softcap: float | None
    drho: float  # budget of the computed ρ = 1/(1 − p) against the exact one
    rho_max: float
    shapes: dict[str, tuple[int, ...]]  # q, k, v, bias as given (k, v before repeating)
    group: int
    entry: dict[str, Any] | None = None  # Δq, Δk (like q, k), V's abs and rel: entry_errors

    @property
    def batch(self) -> tuple[int, ...]:
        return tuple(self.q.shape[:-2])

    @property
    def dropout(self) -> bool:
        return self.rho is not None

    def copies(self, name: str) -> int:
        """How many logical entries add into one entry of the input ``name``."""
        size = math.prod(self.shapes[name])
        if name == "bias":
            return math.prod((*self.batch, self.q.shape[-2], self.k.shape[-2])) // max(size, 1)
        return math.prod(self.batch) // max(math.prod(self.shapes[name][:-2]), 1)


def _float_array(name: str, x: Any, min_ndim: int = 2) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    arr = np.asarray(x)
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.number) or arr.dtype == bool:
        raise TypeError(f"{name} must be a real array; got dtype {arr.dtype}")
    if np.iscomplexobj(arr):
        raise TypeError(f"{name} must be real; got dtype {arr.dtype}")
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} needs at least {min_ndim} dims; got shape {arr.shape}")
    return arr.astype(np.float64, copy=False)


def _broadcast(name: str, x: Any, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    arr = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
    if dtype is bool and arr.dtype != bool:
        raise TypeError(f"{name} must be a boolean array (True = allowed); got dtype {arr.dtype}")
    if dtype is not bool:
        arr = _float_array(name, arr, min_ndim=0)
    try:
        return np.broadcast_to(arr, shape)
    except ValueError:
        raise ValueError(f"{name} of shape {arr.shape} does not broadcast to {shape}") from None


def problem_of(q, k, v, g, scale, allowed, rho, bias, softcap, enable_gqa, units) -> Problem:
    q, k, v = (_float_array(n, x) for n, x in (("q", q), ("k", k), ("v", v)))
    shapes = {"q": q.shape, "k": k.shape, "v": v.shape}
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k need the same last dim d; got {q.shape} and {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v need the same number of keys; got {k.shape} and {v.shape}")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool; got {enable_gqa!r}")
    group = 1
    if enable_gqa:
        if min(q.ndim, k.ndim, v.ndim) < 3 or k.shape[-3] != v.shape[-3]:
            raise ValueError(
                f"enable_gqa needs a head axis (-3) shared by k and v; got {k.shape}, {v.shape}"
            )
        if k.shape[-3] == 0 or q.shape[-3] % k.shape[-3]:
            raise ValueError(
                f"enable_gqa: q's {q.shape[-3]} heads are not a multiple of k's {k.shape[-3]}"
            )
        group = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    try:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(
            f"the batch dims of q {q.shape}, k {k.shape}, v {v.shape} do not broadcast"
        ) from None
    n_q, d = q.shape[-2:]
    n_k, dv = v.shape[-2:]
    q = np.broadcast_to(q, (*batch, n_q, d))
    k = np.broadcast_to(k, (*batch, n_k, d))
    v = np.broadcast_to(v, (*batch, n_k, dv))
    if g is not None:
        g = _broadcast("g", g, (*batch, n_q, dv), float)
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g)):
        if x is not None and not np.all(np.isfinite(x)):
            raise ValueError(f"{name} contains NaN or inf; the bound needs finite inputs")
    if scale is None:
        scale = 1 / math.sqrt(d) if d else 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"scale must be a real number; got {type(scale).__name__} {scale!r}")
    if not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite; got {scale}")
    grid = (*batch, n_q, n_k)
    if allowed is not None:
        allowed = _broadcast("allowed", allowed, grid, bool)
    drho, rho_max = 0.0, 1.0
    if rho is not None:
        rho = _broadcast("rho", rho, grid, float)
        if not np.all(np.isfinite(rho)) or np.any(rho < 0):
            raise ValueError("rho must hold finite factors >= 0 (r_ij / (1 - p))")
        kept = rho[rho != 0]
        rho_max = float(kept.max()) if kept.size else 1.0
        if kept.size and (kept.min() != rho_max or rho_max < 1):
            raise ValueError(
                f"rho must be 0 or one factor 1/(1-p) >= 1; got values in [{kept.min()}, {rho_max}]"
            )
        p = 1 - 1 / rho_max  # the dropout rate; ρ̂ = fl(1/fl(1 − fl(p)))
        drho = 2 * units.uc + _lg(units.u_c * p / (1 - p))
    if bias is not None:
        bias_arr = _float_array("bias", bias, min_ndim=2)
        if np.any(np.isnan(bias_arr)) or np.any(bias_arr == np.inf):
            raise ValueError("bias contains NaN or +inf (-inf is allowed: it excludes the pair)")
        shapes["bias"] = bias_arr.shape
        bias = _broadcast("bias", bias_arr, grid, float)
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float, np.floating)):
            raise TypeError(f"softcap must be a real number; got {softcap!r}")
        if not (math.isfinite(softcap) and softcap > 0):
            raise ValueError(f"softcap must be finite and > 0; got {softcap}")
        softcap = float(softcap)
    return Problem(
        q, k, v, g, float(scale), allowed, rho, bias, softcap, drho, rho_max, shapes, group
    )


def entry_errors(prob: Problem, arith: Arith, un: Units) -> Problem:
    """``prob`` with :attr:`Arith.quant_each` laid out as its inputs (broadcast, K and V
    repeated over a GQA group) and composed with the rounding to storage and compute
    (``ux_in, mx_in``): ``Δx = |x|·(e^{ux_in + ρ̄} − 1) + α·e^{ux_in + ρ̄} + mx_in`` (ρ̄
    the budget of ``rel[x]``) for q and k, and V's ``(α·e^{…} + mx_in, ux_in + ρ̄)``."""
    each = arith.quant_each
    if each is None:
        return prob
    laid, rels = {}, {}
    for name, x in (("q", prob.q), ("k", prob.k), ("v", prob.v)):
        a = np.broadcast_to(np.asarray(each.abs[name], dtype=np.float64), prob.shapes[name])
        if prob.group != 1 and name in ("k", "v"):
            a = np.repeat(a, prob.group, axis=-3)
        r = un.ux_in + _lg(each.rel[name])
        laid[name] = np.broadcast_to(a, x.shape) * math.exp(r) + un.mx_in
        rels[name] = r
    entry = {
        "q": np.abs(prob.q) * math.expm1(rels["q"]) + laid["q"],
        "k": np.abs(prob.k) * math.expm1(rels["k"]) + laid["k"],
        "v_abs": laid["v"],
        "v_rel": rels["v"],
    }
    return replace(prob, entry=entry)


def _swap(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


def _sum_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``x`` over the axes broadcasting added to reach it from ``shape``."""
    if x.ndim > len(shape):
        x = x.sum(axis=tuple(range(x.ndim - len(shape))))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def to_input(prob: Problem, name: str, x: np.ndarray) -> np.ndarray:
    """A logical-batch array (*B, n, ·) summed into the shape of input ``name`` (GQA too)."""
    if prob.group != 1 and name in ("k", "v"):
        x = x.reshape((*x.shape[:-3], x.shape[-3] // prob.group, prob.group, *x.shape[-2:]))
        x = x.sum(axis=-3)
    return _sum_to(x, prob.shapes[name])


# --- scores ------------------------------------------------------------------------------------
@dataclass
class _Scores:
    """``s_ij`` on a chunk of rows, its error bound ``E_ij``, and the soft-cap's slope."""

    s: np.ndarray
    E: np.ndarray
    ok: np.ndarray  # j ∈ A_i (mask and bias −∞ applied)
    slope: np.ndarray | None  # 1 − tanh²(raw/cap) and the bound on its computed value
    dslope: np.ndarray | None


def _scores(prob: Problem, un: Units, rows: slice) -> _Scores:
    """``s = bias + cap·tanh(c·q·k/cap)`` and ``|ŝ − s| ≤ E`` (docs/error_bound.md, step 1)."""
    qc, k = prob.q[..., rows, :], prob.k
    d, ac = qc.shape[-1], abs(prob.c)
    raw = prob.c * (qc @ _swap(k))
    sig = np.abs(qc) @ _swap(np.abs(k))  # Σ_r |q_ir||k_jr|
    sig_in = sig
    if prob.entry is not None:  # each entry its own group's error (Entrywise)
        dq, dk = prob.entry["q"][..., rows, :], prob.entry["k"]
        sig_in = sig + dq @ _swap(np.abs(k)) + np.abs(qc) @ _swap(dk) + dq @ _swap(dk)
    elif un.ux or un.mx:  # the inputs are rounded to storage and/or to compute
        norms = np.abs(qc).sum(-1)[..., None] + np.abs(k).sum(-1)[..., None, :]
        sig_in = sig * math.exp(2 * un.ux) + un.mx * math.exp(un.ux) * norms + d * un.mx**2
    dot = (sig_in - sig) + math.expm1(d * un.ua) * sig_in + d * un.ma
    # into compute; the product by ĉ; ĉ's own rounding (1/sqrt(d) computed: two), and two
    # more where a kernel folds log₂e into ĉ for exp2 (FlashAttention-2, Triton)
    r0 = un.res + 5 * un.uc
    E = (ac * dot + un.mc * (ac * (un.res > 0) + 1)) * math.exp(r0) + np.abs(raw) * math.expm1(r0)
    s, slope, dslope = raw, None, None
    if prob.softcap is not None:
        cap = prob.softcap
        t = raw / cap
        h = np.tanh(t)
        dt = E / cap * math.exp(2 * un.uc) + np.abs(t) * math.expm1(2 * un.uc) + un.mc
        steepest = 1 / np.cosh(np.maximum(np.abs(t) - dt, 0)) ** 2  # max tanh' nearby
        dh = dt * steepest + (np.abs(h) + dt * steepest) * math.expm1(un.uf) + un.mc
        s = cap * h
        E = cap * dh * math.exp(2 * un.uc) + np.abs(s) * math.expm1(2 * un.uc) + un.mc
        slope = 1 - h * h
        square = dh * (2 * np.abs(h) + dh) + (np.abs(h) + dh) ** 2 * un.uc + un.mc
        dslope = square * math.exp(un.uc) + slope * math.expm1(un.uc)
    ok = np.ones(s.shape, dtype=bool) if prob.allowed is None else prob.allowed[..., rows, :]
    if prob.bias is not None:
        b = prob.bias[..., rows, :]
        ok = ok & (b > -np.inf)
        b = np.where(ok, b, 0.0)
        s = s + b
        E = (E + np.abs(b) * math.expm1(un.ub) + un.mb) * math.exp(un.uc)
        E = E + np.abs(s) * math.expm1(un.uc)
    return _Scores(np.where(ok, s, -np.inf), np.where(ok, E, 0.0), ok, slope, dslope)


# --- forward ---------------------------------------------------------------------------------
def _block_counts(ok: np.ndarray, block: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Per row: ``T_i`` key blocks holding an allowed key, and ``b_i`` the most in one."""
    n_k = ok.shape[-1]
    count = ok.sum(axis=-1)
    if block is None:  # the worst case, one key per block
        return count, np.minimum(count, 1)
    if block >= n_k:
        return np.minimum(count, 1), count
    blocks = -(-n_k // block)
    padded = np.zeros((*ok.shape[:-1], blocks * block), dtype=bool)
    padded[..., :n_k] = ok
    per_block = padded.reshape((*ok.shape[:-1], blocks, block)).sum(axis=-1)
    return (per_block > 0).sum(axis=-1), per_block.max(axis=-1)


def _spread(w_err: np.ndarray, rho: Any, v: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``Σ_j w_err_ij |ρ_ij v_ja − Y_ia|``, a few rows at a time (cache-sized temporaries)."""
    out = np.empty_like(y)
    n_q, (n_k, dv) = y.shape[-2], v.shape[-2:]
    step = max(1, SPREAD // max(1, math.prod(y.shape[:-2]) * n_k * dv))
    for start in range(0, n_q, step):
        rows = slice(start, start + step)
        values = v[..., None, :, :]  # (*B, 1, n_k, dv)
        if not np.isscalar(rho):
            values = rho[..., rows, :, None] * values
        gap = np.abs(values - y[..., rows, None, :])  # (*B, s, n_k, dv)
        out[..., rows, :] = np.einsum("...sj,...sja->...sa", w_err[..., rows, :], gap)
    return out


@dataclass
class _Forward:
    """One chunk of rows: exact values, budgets and the forward's bounds."""

    sc: _Scores
    w: np.ndarray  # p_ij = e^{s_ij − m_i} / ℓ_i
    shift: np.ndarray  # m_i (0 for rows with no allowed key)
    y: np.ndarray
    lse: np.ndarray
    log_l: np.ndarray
    T: np.ndarray
    b: np.ndarray
    count: np.ndarray
    E_max: np.ndarray
    gap: np.ndarray  # m_i − s_ij ≥ 0 on A_i
    L: np.ndarray  # |log(ℓ̂ / ℓ)| ≤ L (ℓ at the computed shift)
    dy: np.ndarray  # bound on the stored Ŷ
    dlse: np.ndarray


def _forward(prob: Problem, un: Units, arith: Arith, rows: slice) -> _Forward:
    """Steps 1–7 of docs/error_bound.md for the rows ``rows``."""
    sc = _scores(prob, un, rows)
    ok, s, E = sc.ok, sc.s, sc.E
    count = ok.sum(axis=-1)
    empty = count == 0
    shift = np.where(empty, 0.0, np.max(s, axis=-1, initial=-np.inf))
    e = np.where(ok, np.exp(s - shift[..., None]), 0.0)
    l = np.where(empty, 1.0, e.sum(axis=-1))
    w = e / l[..., None]
    rho = 1.0 if prob.rho is None else prob.rho[..., rows, :]
    wr = w * rho
    v = prob.v
    y = wr @ v
    log_l = np.log(l)
    lse = np.where(empty, -np.inf, shift + log_l)
    T, b = _block_counts(ok, arith.block)
    E_max = E.max(axis=-1, initial=0.0)
    gap = np.where(ok, shift[..., None] - np.where(ok, s, 0.0), 0.0)
    # η: the common relative error of e_ij (score, rounded s − m telescoped, T_i exps)
    arg = EXP_ARG_ROUNDINGS * un.uc * (gap + E + E_max[..., None])
    eta = np.where(ok, E + arg + T[..., None] * un.uf, 0.0)
    chain = 2 * np.maximum(T - 1, 0) * un.uc  # a rescale product and an addition per merge
    lam = np.maximum(b - 1, 0) * un.ua + un.res + chain  # ℓ only
    ux_v = un.ux if prob.entry is None else prob.entry["v_rel"]  # V's relative error
    theta = un.pv_terms(b) + un.res + chain + un.uc + un.up + ux_v  # z only (+ the division)
    if prob.dropout:
        theta = theta + un.uc + prob.drho
    w_up, w_err = w * np.exp(eta), w * np.expm1(eta)
    av = np.abs(v)
    num = _spread(w_err, rho, v, y) + np.expm1(theta)[..., None] * ((w_up * rho) @ av)
    if prob.entry is not None:  # V's absolute errors, each entry its group's
        num += np.exp(theta)[..., None] * ((w_up * rho) @ prob.entry["v_abs"])
    num += np.expm1(lam)[..., None] * np.abs(y) * (1 + w_err.sum(axis=-1))[..., None]
    # gradual underflow, in units of the final e^{s − m}: exps, merges, casts, products
    a_l = un.mc * (count + 2 * T) / l
    grow = l if arith.p_normalized else np.ones_like(l)  # see Arith.p_normalized
    a_z = (un.mc * (1 + prob.rho_max) + un.mp) * (ok.astype(np.float64) @ av)
    a_z = (a_z + (max(un.ma, un.mpv) * count)[..., None]) * grow[..., None]
    a_z = (a_z + (2 * un.mc * T)[..., None]) / l[..., None]
    # ℓ̂/ℓ ∈ [1 − fall, 1 + rise], summed as expm1 terms (Σ_j w_ij = 1 exactly)
    rise = (w * np.expm1(eta + lam[..., None])).sum(axis=-1) + a_l
    fall = -(w * np.expm1(-eta - lam[..., None])).sum(axis=-1) + a_l
    low = 1 - fall
    before = np.where(low > 0, 1 / low, np.inf)[..., None]
    pre = (num + a_z + (np.abs(y) + num * before) * a_l[..., None]) * before
    pre = pre + un.mc + (un.mx * prob.rho_max if prob.entry is None else 0.0)
    dy = np.where(empty[..., None], 0.0, pre * (1 + un.uo) + un.uo * np.abs(y) + un.mo)
    fallen = -np.log1p(-np.where(low > 0, fall, 0.0))
    L = np.where(low > 0, np.maximum(np.log1p(rise), fallen), np.inf)
    dlog = L + un.uf * (np.abs(log_l) + L) + un.mc
    dlse = np.where(empty, 0.0, dlog + un.uc * (np.abs(np.where(empty, 0, lse)) + dlog))
    return _Forward(sc, w, shift, y, lse, log_l, T, b, count, E_max, gap, L, dy, dlse)


# --- reverse ---------------------------------------------------------------------------------
@dataclass
class _Sums:
    """Sums over query rows for dK and dV (logical batch), and the bias gradient's."""

    dk_err: np.ndarray  # Σ_i Δγ_ij |q_i|
    dk_abs: np.ndarray  # Σ_i |γ_ij| |q_i|
    dk: np.ndarray  # Σ_i γ_ij q_i (exact, without c)
    dv_err: np.ndarray  # Σ_i p_ij ρ_ij (e^{π_ij} − 1) |G_i|
    dv_up: np.ndarray  # Σ_i p_ij ρ_ij e^{π_ij} |G_i|
    dv: np.ndarray
    count: np.ndarray  # (*B, n_k): |{i : j ∈ A_i}|
    dq: np.ndarray  # (*B, n_q, d): the bound before the output cast, and the exact dQ
    dq_exact: np.ndarray
    db_err: np.ndarray | None  # shaped like the bias
    db_abs: np.ndarray | None
    db: np.ndarray | None


def _sums(prob: Problem) -> _Sums:
    k, v = prob.k, prob.v
    db = None if prob.bias is None else np.zeros(prob.shapes["bias"])
    return _Sums(
        *(np.zeros(k.shape) for _ in range(3)),
        *(np.zeros(v.shape) for _ in range(3)),
        np.zeros(k.shape[:-1]),
        np.zeros(prob.q.shape),
        np.zeros(prob.q.shape),
        db,
        None if db is None else db.copy(),
        None if db is None else db.copy(),
    )


def _into_bias(target: np.ndarray, chunk: np.ndarray, rows: slice) -> None:
    """Add a (*B, r, n_k) chunk into a bias-shaped array (summing its broadcast axes)."""
    all_rows = target.shape[-2] == 1
    shape = (*target.shape[:-2], 1 if all_rows else chunk.shape[-2], target.shape[-1])
    part = _sum_to(chunk, shape)
    if all_rows:
        target += part
    else:
        target[..., rows, :] += part


def _reverse(
    prob: Problem, un: Units, fw: _Forward, rows: slice, stats: str, delta: str, out: _Sums
) -> None:
    """Steps 8–12 of docs/error_bound.md: γ and its error on the rows, into the sums."""
    sc, w, ok = fw.sc, fw.w, fw.sc.ok
    q, k, v = prob.q[..., rows, :], prob.k, prob.v
    g = prob.g[..., rows, :]
    ag, av, dv_ = np.abs(g), np.abs(v), v.shape[-1]
    rho = 1.0 if prob.rho is None else prob.rho[..., rows, :]
    # dP_ij = ρ_ij G_i·V_j
    gv = g @ _swap(v)
    gv_abs = ag @ _swap(av)
    gv_in = gv_abs
    if un.ux or un.mx:
        norms = ag.sum(-1)[..., None] + av.sum(-1)[..., None, :]
        gv_in = gv_abs * math.exp(2 * un.ux) + un.mx * math.exp(un.ux) * norms + dv_ * un.mx**2
    r_d = un.res + un.ud + ((un.uc + prob.drho) if prob.dropout else 0.0)
    dot = (gv_in - gv_abs) + math.expm1(dv_ * un.ua) * gv_in + dv_ * un.ma + un.md
    D = rho * gv
    dD = rho * (dot * math.exp(r_d) + np.abs(gv) * math.expm1(r_d)) + 2 * un.mc
    # π_ij: the recomputed p against the exact one, through the frozen statistics
    E = sc.E
    if stats == "ml":
        arg = EXP_ARG_ROUNDINGS * un.uc * (fw.gap + E + fw.E_max[..., None])
        pi = E + arg + un.uf + un.uc + fw.L[..., None]
    else:
        dl = fw.dlse[..., None]
        arg = EXP_ARG_ROUNDINGS * un.uc * (fw.gap + fw.log_l[..., None] + E + dl)
        pi = E + dl + arg + un.uf
    pi = np.where(ok, pi, 0.0)
    a_p = 2 * un.mc  # p̂ underflows: exp, division
    if delta == "gy":  # δ_i = G_i·Ŷ_i from the stored output
        r_del = un.uc + max(dv_ - 1, 0) * un.ua + un.res + un.ux
        err = (ag * fw.dy).sum(-1) * math.exp(r_del) + (ag * np.abs(fw.y)).sum(-1) * math.expm1(
            r_del
        )
        d_delta = err + dv_ * (un.mc + un.ma) + un.mx * (np.abs(fw.y) + fw.dy).sum(-1)
        dlt = (g * fw.y).sum(-1)
    else:  # δ_i = Σ_j p̂_ij dP̂_ij, naive attention's
        r_row = un.uc + np.maximum(fw.count - 1, 0)[..., None] * un.ua + un.res
        terms = np.expm1(pi + r_row) * np.abs(D) + np.exp(pi + r_row) * dD
        d_delta = (w * terms).sum(-1) + fw.count * (un.mc + un.ma)
        d_delta += a_p * np.where(ok, np.abs(D) + dD, 0.0).sum(-1)
        dlt = (w * D).sum(-1)
    X = D - dlt[..., None]
    dX = (dD + d_delta[..., None]) * math.exp(un.uc) + np.abs(X) * math.expm1(un.uc)
    gam = w * X  # γ_ij, the gradient of the final score (and of the bias)
    d_gam = w * (np.abs(X) * np.expm1(pi + un.uc) + np.exp(pi + un.uc) * dX)
    d_gam = np.where(ok, d_gam + a_p * (np.abs(X) + dX) * (1 + un.u_c) + un.mc, 0.0)
    if out.db is not None:
        _into_bias(out.db_err, d_gam, rows)
        _into_bias(out.db_abs, np.abs(gam), rows)
        _into_bias(out.db, gam, rows)
    if sc.slope is not None:  # through the soft-cap: γ·(1 − t̂²)
        slope, dslope = sc.slope, sc.dslope
        d_gam = (d_gam * (slope + dslope) + np.abs(gam) * dslope) * (1 + un.u_c)
        d_gam = np.where(ok, d_gam + un.uc * np.abs(gam) * slope + un.mc, 0.0)
        gam = gam * slope
    if un.ug or un.mg:  # γ cast before the reverse's products
        d_gam = np.where(ok, d_gam * math.exp(un.ug) + np.abs(gam) * math.expm1(un.ug) + un.mg, 0)
    agam, ac = np.abs(gam), abs(prob.c)
    # dQ_i = c Σ_j γ_ij k_j: a block product of b_i terms, T_i blocks, broadcast copies
    r_q = fw.b * un.ua + un.res + 3 * un.uc + np.maximum(fw.T - 1, 0) * un.uc + un.ux
    r_q = (r_q + (prob.copies("q") - 1) * un.uc)[..., None]
    ak = np.abs(k)
    dq = ac * ((d_gam @ ak) * np.exp(r_q) + (agam @ ak) * np.expm1(r_q))
    # underflows, μ absolute each: in the scaled sum when c is applied first (autograd
    # through s = c·(q·k) rounds c·γ_ij, then sums): not shrunk by a |c| < 1; and c·γ_ij's
    # own underflow times |k_j|
    floor_q = max(ac, 1.0) * (fw.count * un.ma + (fw.T + 3) * un.mc)
    out.dq[..., rows, :] = dq + floor_q[..., None] + un.mc * ak.sum(axis=-2)[..., None, :]
    out.dq_exact[..., rows, :] = prob.c * (gam @ k)
    aq = np.abs(q)
    out.dk_err += _swap(d_gam) @ aq
    out.dk_abs += _swap(agam) @ aq
    out.dk += _swap(gam) @ q
    wr = w * rho
    out.dv_err += _swap(wr * np.expm1(pi)) @ ag
    out.dv_up += _swap(wr * np.exp(pi)) @ ag
    out.dv += _swap(wr) @ g
    out.count += ok.sum(axis=-2)


def _cast_out(un: Units, bound: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """The bound after rounding to the output format: ``|x̂(1+ε) − x| ≤ (1+u)Δ + u|x|``."""
    return bound * (1 + un.uo) + un.uo * np.abs(exact) + un.mo


def _key_side(prob: Problem, un: Units, s: _Sums, row_block: int | None) -> dict[str, Any]:
    """dK, dV from the row sums: products of ``rows_j`` terms, ``R_j`` row tiles, copies."""
    n_q = prob.q.shape[-2]
    per_tile = 1 if row_block is None else row_block  # None: one row per tile (worst case)
    rows_j = np.minimum(s.count, per_tile)
    tiles_j = np.minimum(s.count, -(-n_q // per_tile))
    chain = un.res + np.maximum(tiles_j - 1, 0) * un.uc + rows_j * un.ua
    r_k = (chain + 3 * un.uc + un.ux + (prob.copies("k") - 1) * un.uc)[..., None]
    r_v = chain + un.ug + un.ux + (prob.copies("v") - 1) * un.uc
    if prob.dropout:
        r_v = r_v + un.uc + prob.drho
    ac = abs(prob.c)
    col_q = np.abs(prob.q).sum(axis=-2, keepdims=True)
    col_g = np.abs(prob.g).sum(axis=-2, keepdims=True)
    floor = (s.count * un.ma + (tiles_j + prob.copies("k") + 3) * un.mc)[..., None]
    # the underflows (floor; c·γ_ij's own times |q_i|) are μ absolute where c is applied
    # before the sum (autograd through s = c·(q·k)): never shrunk by a |c| < 1
    dk = ac * (s.dk_err * np.exp(r_k) + s.dk_abs * np.expm1(r_k)) + max(ac, 1.0) * floor
    dk = dk + ac * un.mx * col_q + un.mc * col_q
    dv = s.dv_err + s.dv_up * np.expm1(r_v)[..., None] + floor
    dv = dv + (2 * un.mc + un.mg + un.mx) * prob.rho_max * col_g
    return {
        "dk": _cast_out(un, to_input(prob, "k", dk), prob.c * to_input(prob, "k", s.dk)),
        "dv": _cast_out(un, to_input(prob, "v", dv), to_input(prob, "v", s.dv)),
    }


# --- the public functions -------------------------------------------------------------------
def bounds(
    arith: Arith,
    q: Any,
    k: Any,
    v: Any,
    g: Any = None,
    *,
    scale: float | None = None,
    allowed: Any = None,
    rho: Any = None,
    bias: Any = None,
    softcap: float | None = None,
    enable_gqa: bool = False,
    stats: str = "ml",
    delta: str = "gy",
    row_block: int | None = None,
    input_rounding: bool = False,
) -> dict[str, np.ndarray]:
    """Bounds on ``|computed − exact|`` for ``y``, ``lse`` and, with ``g``, ``dq, dk, dv``
    (and ``dbias`` with a bias): arrays shaped like Y ``(*B, n_q, dv)``, lse ``(*B, n_q)``,
    and q, k, v, bias as given.

    ``q, k, v, g`` are the inputs as the implementation holds them (already rounded to
    ``arith.input``), any float dtype, leading dims broadcast; ``enable_gqa`` shares each
    key/value head (axis −3) with a group of query heads. ``scale`` is ``c`` (default
    ``1/sqrt(d)``), ``allowed`` the allowed set (boolean, broadcast to ``(*B, n_q, n_k)``),
    ``rho`` the dropout factors ``r_ij/(1 − p)``, ``bias`` an additive bias (``−inf``
    excludes a pair), ``softcap`` the cap of ``cap·tanh(s/cap)`` (applied before the bias).

    ``stats``: the reverse recomputes ``p`` from the forward's ``m, ℓ`` (``"ml"``) or from
    ``lse`` with ``ℓ = 1`` (``"lse"``, :mod:`exactattn.torch`). ``delta``: ``"gy"`` forms
    ``δ_i = G_i·Y_i`` from the stored Y; ``"rowsum"`` is naive attention's
    ``Σ_j p_ij dP_ij`` (with ``arith.block ≥ n_k``). ``row_block``: query rows per tile in
    the reverse, whose dK, dV products accumulate in ``arith.acc`` and across tiles in the
    compute format (None: the worst case, one row per tile; exactattn's NumPy path: ``n_q``).
    ``input_rounding``: ``q, k, v, g`` are exact values the implementation rounds to
    ``arith.input`` first (the sweep's setting); the bound then covers that rounding too.

    The bound is evaluated in float64, ``CHUNK`` score entries at a time (no (n_q, n_k)
    array beyond a chunk of rows).
    """
    return bounds_max(
        arith, q, k, v, g, reverses=((stats, delta),), scale=scale, allowed=allowed, rho=rho,
        bias=bias, softcap=softcap, enable_gqa=enable_gqa, row_block=row_block,
        input_rounding=input_rounding,
    )  # fmt: skip


def check_structure(stats: str, delta: str, row_block: int | None) -> None:
    """A reverse's structure as :func:`bounds` takes it, or a ValueError naming the argument."""
    if stats not in STATS:
        raise ValueError(f"stats must be one of {STATS}; got {stats!r}")
    if delta not in DELTAS:
        raise ValueError(f"delta must be one of {DELTAS}; got {delta!r}")
    if row_block is not None and (
        isinstance(row_block, bool) or not isinstance(row_block, int) or row_block < 1
    ):
        raise ValueError(f"row_block must be an int >= 1 or None; got {row_block!r}")


def bounds_max(
    arith: Arith,
    q: Any,
    k: Any,
    v: Any,
    g: Any = None,
    *,
    reverses: tuple[tuple[str, str], ...],
    scale: float | None = None,
    allowed: Any = None,
    rho: Any = None,
    bias: Any = None,
    softcap: float | None = None,
    enable_gqa: bool = False,
    row_block: int | None = None,
    input_rounding: bool = False,
) -> dict[str, np.ndarray]:
    """The entrywise largest of :func:`bounds` over the reverse structures ``reverses``
    (``(stats, delta)`` pairs: a reverse that may use any of them), the forward evaluated
    once for all (it does not depend on the structure)."""
    if not isinstance(arith, Arith):
        raise TypeError(f"arith must be an Arith; got {type(arith).__name__}")
    if not reverses:
        raise ValueError("reverses must name at least one (stats, delta) structure")
    for stats, delta in reverses:
        check_structure(stats, delta, row_block)
    if not isinstance(input_rounding, bool):
        raise TypeError(f"input_rounding must be a bool; got {input_rounding!r}")
    un = Units.of(arith, input_rounding)
    prob = problem_of(q, k, v, g, scale, allowed, rho, bias, softcap, enable_gqa, un)
    prob = entry_errors(prob, arith, un)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # inf: vacuous
        return _evaluate(prob, un, arith, tuple(reverses), row_block)


def _evaluate(
    prob: Problem,
    un: Units,
    arith: Arith,
    reverses: tuple[tuple[str, str], ...],
    row_block: int | None,
) -> dict[str, np.ndarray]:
    """The chunked evaluation behind :func:`bounds_max` (inputs already checked): each
    chunk's forward once, its reverse once per structure, the largest of them kept."""
    batch, n_q, n_k = prob.batch, prob.q.shape[-2], prob.k.shape[-2]
    y = np.zeros((*batch, n_q, prob.v.shape[-1]))
    lse = np.zeros((*batch, n_q))
    sums = {} if prob.g is None else {r: _sums(prob) for r in dict.fromkeys(reverses)}
    step = max(1, CHUNK // max(1, math.prod(batch) * n_k))
    for start in range(0, n_q, step):
        rows = slice(start, min(start + step, n_q))
        fw = _forward(prob, un, arith, rows)
        y[..., rows, :], lse[..., rows] = fw.dy, fw.dlse
        for (stats, delta), into in sums.items():
            _reverse(prob, un, fw, rows, stats, delta, into)
    out = {"y": y, "lse": lse}
    for into in sums.values():
        grads = _gradients(prob, un, into, row_block)
        for name, x in grads.items():
            out[name] = np.maximum(out[name], x) if name in out else x
    # a budget beyond float64's range gives inf (then 0·inf = NaN): the bound is vacuous
    return {name: np.where(np.isnan(x), np.inf, x) for name, x in out.items()}


def _gradients(prob: Problem, un: Units, sums: _Sums, row_block: int | None) -> dict:
    """dQ, dK, dV (and dbias) bounds from one reverse structure's sums."""
    dq = _sum_to(sums.dq, prob.shapes["q"])
    out = {"dq": _cast_out(un, dq, _sum_to(sums.dq_exact, prob.shapes["q"]))}
    out.update(_key_side(prob, un, sums, row_block))
    if sums.db is not None:
        r_b = (prob.copies("bias") - 1) * un.uc
        db = sums.db_err * math.exp(r_b) + sums.db_abs * math.expm1(r_b)
        out["dbias"] = _cast_out(un, db, sums.db)
    return out


def ratio(error: Any, bound: Any) -> float:
    """``max |error| / bound`` entrywise: at most 1 when the bound holds.

    ``0/0`` counts as 0, a nonzero or non-finite error over a zero bound as ``inf``; an
    infinite bound (the arithmetic cannot resolve the case) accepts any finite error.
    """
    e = np.abs(np.asarray(error, dtype=np.float64))
    b = np.broadcast_to(np.asarray(bound, dtype=np.float64), e.shape)
    if not e.size:
        return float("nan")
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(e == 0, 0.0, e / b)
    r = np.where(np.isfinite(e), r, np.inf)
    return float(np.max(np.where(np.isnan(r), np.inf, r)))


# --- merging partial results, and the sink term -------------------------------------------
def merge_bounds(
    partials: list[tuple[Any, Any]],
    u: float,
    funcs: float = 1.0,
    *,
    steps: int | None = None,
    extra: list[Any] | None = None,
) -> dict[str, np.ndarray]:
    """Bounds on ``|computed − exact|`` of :func:`exactattn.merge_partials` run in an
    arithmetic of unit roundoff ``u`` (elementary functions within ``funcs`` units), from the
    partials ``(y_t, lse_t)`` exactly as held (natural lse; ``y_t (..., v)``, ``lse_t (...)``).

    The fold of ``⋆`` multiplies term ``t``'s weight ``w_t = e^{lse_t − M}`` (``M = max_t
    lse_t``) by the rescales on its way; their arguments telescope to ``lse_t − M``, each
    argument rounded ``EXP_ARG_ROUNDINGS`` times, and each of the ``≤ S`` steps adds an
    exponential, a product and a sum, so both ``z`` and ``ℓ`` carry term ``t`` with a
    relative perturbation within the budget ``β_t = 3ū(M − lse_t) + S(funcs + 2)ū``. Then
    ``|Δy| ≤ Σ_t ŵ_t (e^{β_t} − 1)(|y_t| + |y|) / (1 − (e^{β̂} − 1)) + ū|y|`` (``ŵ_t`` the
    exact normalised weights, ``β̂ = max_t β_t``; the division's rounding last) and
    ``|Δlse| ≤ β̂ + funcs·ū·|log ℓ| + ū|lse|`` (``ℓ`` perturbed by at most ``e^{±β̂}``, the
    log and the sum ``M + log ℓ`` rounded once each). Parts at ``lse = −∞`` contribute
    nothing; a row with every part empty has bound 0 (the merge returns exactly ``(0, −∞)``);
    a row whose budget ``β̂`` reaches ``ln 2`` has no bound on ``y`` (``∞``: vacuous).
    ``steps`` (default: the number of parts) is ``S``, the ⋆ steps a term is carried
    through; ``extra`` adds a further budget per part (arrays broadcastable to ``lse_t``) to
    its ``β_t`` (:func:`sink_bounds`).
    """
    ub = u / (1 - u)
    ys = np.stack([np.asarray(y, dtype=np.float64) for y, _ in partials])
    lses = np.stack([np.asarray(lse, dtype=np.float64) for _, lse in partials])
    steps = len(partials) if steps is None else steps
    top = lses.max(axis=0)
    empty = np.isneginf(top)
    shift = np.where(empty, 0.0, top)
    with np.errstate(invalid="ignore"):
        weights = np.exp(lses - shift)  # e^{lse_t − M} ≤ 1
        total = weights.sum(axis=0)
        norm = np.where(empty, 0.0, weights / np.where(empty, 1.0, total))
        y = np.where(empty[..., None], 0.0, (norm[..., None] * ys).sum(axis=0))
        gap = np.where(np.isneginf(lses), 0.0, shift - lses)
    beta = EXP_ARG_ROUNDINGS * ub * gap + steps * (funcs + 2) * ub
    if extra is not None:
        beta = beta + np.stack(
            [np.broadcast_to(np.asarray(e, np.float64), top.shape) for e in extra]
        )
    worst = np.where(norm > 0, beta, 0.0).max(axis=0)
    grow = np.expm1(beta)[..., None] * (np.abs(ys) + np.abs(y))
    denominator = 1 - np.expm1(worst)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):  # a budget of ln 2 or more: vacuous
        dy = np.where(
            denominator > 0, (norm[..., None] * grow).sum(axis=0) / denominator, np.inf
        ) + ub * np.abs(y)
    log_l = np.log(np.where(empty, 1.0, total))
    lse = shift + log_l
    dlse = worst + funcs * ub * np.abs(log_l) + ub * np.abs(lse)
    return {"y": np.where(empty[..., None], 0.0, dy), "lse": np.where(empty, 0.0, dlse)}


def sink_bounds(
    y: Any,
    lse: Any,
    sinks: Any,
    u: float,
    funcs: float = 1.0,
    *,
    steps: int = 2,
    m: Any = None,
    lse_error: Any = None,
) -> dict[str, Any]:
    """The sink term's share: the bounds of merging a result ``(y, lse)`` (``(*batch, H, n,
    v)``, ``(*batch, H, n)``) held exactly with each head's sink ``(0, σ_h)``, the partial the
    sink is (:mod:`exactattn.core.sinks`), in unit roundoff ``u``.

    For the tiled pass that starts each row at ``(σ_h, 1, 0)`` (:func:`exactattn.core.algorithm.
    forward`'s ``initial``) give ``steps`` = its key blocks + 1 (the sink is rescaled at every
    block) and ``m``, the row maxima of the scores (``(*batch, H, n)``): the running maximum
    is then ``max(m_i, σ_h)``, so each score's exponent argument grows by ``(σ_h − m_i)₊``,
    charged ``EXP_ARG_ROUNDINGS·ū·(σ_h − m_i)₊`` on the result's term. The sink's own
    argument ``σ_h − max(m_i, σ_h)`` is within ``lse_i − σ_h``, the gap charged here.
    ``lse_error`` (``(*batch, H, n)``): the bound on the sink-free pass's ``lse``
    (:func:`bounds`), by which the keys' weight ``e^{lse}`` moves against the sink's (the
    sink-free ``Y`` normalises it away; with the sink the share ``p_σ`` moves with it),
    added to the result's budget. To first order in ``u`` this bound adds to the sink-free
    pass's.
    """
    lse = np.asarray(lse, dtype=np.float64)
    sink = np.broadcast_to(np.asarray(sinks, dtype=np.float64)[:, None], lse.shape)
    ub = u / (1 - u)
    budget = np.zeros(lse.shape)
    if m is not None:
        m = np.asarray(m, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            budget = budget + np.where(np.isneginf(m), 0.0, np.maximum(sink - m, 0.0))
    budget = EXP_ARG_ROUNDINGS * ub * budget
    if lse_error is not None:
        budget = budget + np.asarray(lse_error, dtype=np.float64)
    extra = [budget, np.zeros(lse.shape)]
    return merge_bounds(
        [(y, lse), (np.zeros_like(np.asarray(y, dtype=np.float64)), sink)],
        u,
        funcs,
        steps=steps,
        extra=extra,
    )
