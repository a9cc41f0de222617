"""Real runs measured against a certified reference and divided by
:func:`exactattn.error.bounds.bounds`.

A :class:`Case` is sizes, an input distribution, the allowed set, dropout, bias, soft-cap,
GQA and a block size; a :class:`Target` is one implementation with the arithmetic it
claims. :func:`measure` rounds the float64 inputs to the target's storage format, runs the
target forward and backward, computes the exact answer on the *same held inputs* as arb
balls (:func:`exactattn.oracle.certified.certified_attention`), and returns, per output,
``max |computed − exact| / bound`` (≤ 1 wherever the bound holds).

The specification side is written from the definitions, not through the code under test:
masks are inequalities on (i, j), the bias is an array with −∞ entries, the input
distributions are formulas. The dropout keep-bits are the library's counter hash (they are
part of the input: the reference replays the very bits the target used).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

import exactattn
from exactattn.backends import MpmathContext, NumpyContext
from exactattn.core import masks
from exactattn.core.dropout import Dropout
from exactattn.error.bounds import Arith, bounds, ratio
from tests.optional import requires

if TYPE_CHECKING:
    from exactattn.oracle.certified import Ball

GRADS = ("dq", "dk", "dv")


# --- cases -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One problem: (*batch, n_q, d) queries against (*batch_kv, n_k, d) keys."""

    n_q: int = 16
    n_k: int = 16
    d: int = 8
    dv: int = 8
    heads: int = 1  # query heads; with kv_heads < heads, grouped-query attention
    kv_heads: int = 1
    dist: str = "normal"  # normal | outliers | large
    mask: str = "none"  # none | causal | window | padding | random
    dropout: float = 0.0
    bias: bool = False
    softcap: float | None = None
    offset: float = 0.0  # added to every score through the bias: |s| large, s − m not
    bias_rows: bool = True  # False: one bias row (1, n_k) shared by every head and query
    block: int = 4
    seed: int = 0

    @property
    def gqa(self) -> bool:
        return self.kv_heads != self.heads

    def label(self) -> str:
        parts = [f"n{self.n_q}x{self.n_k}", f"d{self.d}", self.dist, self.mask, f"b{self.block}"]
        if self.heads > 1:
            parts.append(f"h{self.heads}/{self.kv_heads}")
        if self.dropout:
            parts.append(f"drop{self.dropout}")
        if self.bias:
            parts.append("bias")
        if self.softcap:
            parts.append(f"cap{self.softcap}")
        if self.offset:
            parts.append(f"offset{self.offset}")
        return ",".join(parts)


def _draw(rng: np.random.Generator, dist: str, shape: tuple[int, ...]) -> np.ndarray:
    x = rng.standard_normal(shape)
    if dist == "outliers":  # FlashAttention-3 §4.3: N(0,1) + N(0,100)·Bernoulli(0.001)
        x = x + (rng.random(shape) < 0.001) * rng.normal(0.0, 10.0, shape)
    elif dist == "large":  # scores with standard deviation 16 at c = 1/sqrt(d)
        x = 4.0 * x
    elif dist != "normal":
        raise ValueError(f"unknown distribution {dist!r}")
    return x


def inputs(case: Case) -> dict[str, Any]:
    """Float64 q, k, v, g, the allowed set, ρ and the bias, from the definitions."""
    rng = np.random.default_rng(case.seed)
    lead = (case.heads,) if case.heads > 1 else ()
    lead_kv = (case.kv_heads,) if case.heads > 1 else ()
    q = _draw(rng, case.dist, (*lead, case.n_q, case.d))
    k = _draw(rng, case.dist, (*lead_kv, case.n_k, case.d))
    v = _draw(rng, case.dist, (*lead_kv, case.n_k, case.dv))
    g = rng.standard_normal((*lead, case.n_q, case.dv))
    i, j = np.arange(case.n_q)[:, None], np.arange(case.n_k)[None, :]
    if case.mask == "none":
        allowed = np.ones((case.n_q, case.n_k), dtype=bool)
    elif case.mask == "causal":  # top-left: j ≤ i
        allowed = j <= i
    elif case.mask == "window":  # i − 3 ≤ j ≤ i + 1
        allowed = (j >= i - 3) & (j <= i + 1)
    elif case.mask == "padding":  # per head, the first L_h keys
        lengths = rng.integers(1, case.n_k + 1, size=lead or (1,))
        allowed = j[None] < lengths[:, None, None]
        allowed = allowed if lead else allowed[0]
    elif case.mask == "random":
        allowed = rng.random((*lead, case.n_q, case.n_k)) < 0.6
        allowed[..., 0] = True  # no empty rows
    else:
        raise ValueError(f"unknown mask {case.mask!r}")
    rho = None
    if case.dropout:
        keep = Dropout(case.dropout, case.seed).keep(
            np.arange(max(case.heads, 1)).reshape((*lead, 1, 1)), i, j
        )
        rho = np.where(keep, 1 / (1 - case.dropout), 0.0)
    bias = None
    if case.bias or case.offset:
        shape = (*lead, case.n_q, case.n_k) if case.bias_rows else (1, case.n_k)
        bias = np.full(shape, case.offset)
    if case.bias:
        bias += rng.normal(0.0, 2.0, bias.shape)
        bias[rng.random(bias.shape) < 0.05] = -np.inf
    return dict(q=q, k=k, v=v, g=g, allowed=allowed, rho=rho, bias=bias)


# --- formats: the inputs as a target holds them ------------------------------------------------
def round_to_bits(x: np.ndarray, bits: int) -> np.ndarray:
    """``x`` rounded to ``bits`` significand bits, to nearest, ties to even (mpmath's rule)."""
    mant, exp = np.frexp(x)
    return np.ldexp(np.rint(np.ldexp(mant, bits)), exp - bits)


def hold(x: np.ndarray | None, storage: str) -> np.ndarray | None:
    """``x`` rounded to a storage format, back in float64."""
    if x is None:
        return None
    if storage.startswith("p"):
        return round_to_bits(x, int(storage[1:]))
    if storage == "bfloat16":
        import torch

        return torch.from_numpy(x).to(torch.bfloat16).double().numpy()
    return x.astype(storage).astype(np.float64)


# --- targets -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """An implementation, the arithmetic it claims and how its reverse is organised."""

    name: str
    storage: str
    make_arith: Callable[[Case], Arith]
    run: Callable[[Case, dict[str, Any]], dict[str, np.ndarray]]
    stats: str = "ml"
    delta: str = "gy"
    row_block: Callable[[Case], int | None] = lambda case: case.n_q
    supports: Callable[[Case], bool] = lambda case: True
    slow: bool = False


def _mask_object(case: Case, allowed: np.ndarray) -> Any:
    if case.mask == "causal":
        return masks.causal()
    if case.mask == "window":
        return masks.sliding_window(3, 1)
    return None if case.mask == "none" else masks.dense(allowed)


def _keywords(case: Case, data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = dict(
        block_size=case.block,
        mask=_mask_object(case, data["allowed"]),
        empty_rows="zero",
        enable_gqa=case.gqa,
    )
    if case.dropout:
        out.update(dropout_p=case.dropout, seed=case.seed)
    if data["bias"] is not None:
        out["bias"] = data["bias"]
    if case.softcap:
        out["softcap"] = case.softcap
    return out


def _as_float(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().double().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype == object:
        return np.frompyfunc(float, 1, 1)(arr).astype(np.float64)
    return arr.astype(np.float64)


def _api_runner(make_ctx: Callable[[], Any], naive: bool = False):
    """Run :func:`exactattn.attention` (or the naive pair) over a context."""

    def run(case: Case, data: dict[str, Any]) -> dict[str, np.ndarray]:
        ctx = make_ctx()
        kw = _keywords(case, data)
        if naive:
            kw.pop("block_size")
        forward = exactattn.naive_attention if naive else exactattn.attention
        backward = exactattn.naive_attention_backward if naive else exactattn.attention_backward
        q, k, v, g = (data[x] for x in "qkvg")
        y, stats = forward(q, k, v, backend=ctx, return_stats=True, **kw)
        with_bias = data["bias"] is not None
        grads = backward(q, k, v, y, stats, g, backend=ctx, bias_grad=with_bias, **kw)
        out = dict(y=y, lse=stats.lse, **dict(zip((*GRADS, "dbias"), grads)))
        return {name: _as_float(x) for name, x in out.items()}

    return run


def _torch_path(dtype: str):
    """:func:`exactattn.torch.attention` (m = lse, ℓ = 1) with autograd gradients."""

    def run(case: Case, data: dict[str, Any]) -> dict[str, np.ndarray]:
        import torch

        import exactattn.torch as ea_torch

        tdtype = getattr(torch, dtype)
        leaves = [torch.from_numpy(data[x]).to(tdtype).requires_grad_(True) for x in "qkv"]
        kw = _keywords(case, data)
        y = ea_torch.attention(*leaves, impl="generic", **kw)
        grads = torch.autograd.grad(y, leaves, torch.from_numpy(data["g"]).to(tdtype))
        return {name: _as_float(x) for name, x in zip(("y", *GRADS), (y, *grads))}

    return run


def _torch_row_block(dtype: str):
    def rows(case: Case) -> int:
        import torch

        from exactattn.backends.torch_backend import TorchContext
        from exactattn.core.masks import Geometry
        from exactattn.torch.passes import row_block_size

        batch = (case.heads,) if case.heads > 1 else ()
        geometry = Geometry(case.n_q, case.n_k, batch)
        return row_block_size(TorchContext(getattr(torch, dtype)), geometry, case.block)

    return rows


def _torch_ctx(dtype: str, compute: str | None = None):
    def make() -> Any:
        import torch

        from exactattn.backends.torch_backend import TorchContext

        return TorchContext(getattr(torch, dtype), compute=compute and getattr(torch, compute))

    return make


def _of_context(make_ctx: Callable[[], Any], naive: bool = False):
    def make(case: Case) -> Arith:
        return Arith.of_context(make_ctx(), block=case.n_k if naive else case.block)

    return make


def _numpy(storage: str, compute: str | None = None, p_cast: str | None = None):
    return lambda: NumpyContext(storage, compute=compute, p_cast=p_cast)


def _mp(bits: int):
    return lambda: MpmathContext(prec=bits)


def _no_score_mods(case: Case) -> bool:
    return not case.bias and not case.softcap and not case.offset


def _targets() -> dict[str, Target]:
    out: list[Target] = []
    for name, ctx, storage in (
        ("np-fp16", _numpy("float16"), "float16"),
        ("np-fp32", _numpy("float32"), "float32"),
        ("np-fp64", _numpy("float64"), "float64"),
        ("np-fa2-fp16", _numpy("float16", "float32", "float16"), "float16"),
    ):
        out.append(Target(name, storage, _of_context(ctx), _api_runner(ctx)))
        out.append(
            Target(
                "naive-" + name,
                storage,
                _of_context(ctx, naive=True),
                _api_runner(ctx, naive=True),
                delta="rowsum",
            )
        )
    for bits in (8, 11, 16, 24):
        ctx = _mp(bits)
        out.append(Target(f"mp{bits}", f"p{bits}", _of_context(ctx), _api_runner(ctx), slow=True))
    if importlib.util.find_spec("torch") is None:
        return {t.name: t for t in out}
    for name, dtype, compute in (
        ("torch-fp16", "float16", "float16"),
        ("torch-bf16", "bfloat16", "bfloat16"),
        ("torch-fp32", "float32", None),
    ):
        ctx = _torch_ctx(dtype, compute)
        out.append(Target(name, dtype, _of_context(ctx), _api_runner(ctx)))
    for dtype in ("float16", "bfloat16", "float32"):
        short = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[dtype]
        out.append(
            Target(
                f"torch-path-{short}",  # the FA-2 policy for half inputs, lse statistics
                dtype,
                _of_context(_torch_ctx(dtype)),
                _torch_path(dtype),
                stats="lse",
                row_block=_torch_row_block(dtype),
                supports=_no_score_mods,
            )
        )
    if importlib.util.find_spec("exactattn.backends.fp8_backend") is None:
        return {t.name: t for t in out}
    out.append(
        Target(  # FlashAttention-3's FP8 p: fp32 everywhere, p cast to e4m3 before p·V
            "torch-p-e4m3",
            "float32",
            lambda case: Arith.ieee("float32", p="e4m3", block=case.block),
            _api_runner(_fp8_p_ctx),
        )
    )
    return {t.name: t for t in out}


def _fp8_p_ctx() -> Any:
    from exactattn.backends.fp8_backend import Fp8Context

    return Fp8Context("e4m3")


TARGETS = _targets()


# --- the certified reference and the measurement ------------------------------------------------
@dataclass
class Measurement:
    """Per output: the worst ``|error| / bound`` and the largest error; reference radius."""

    target: str
    case: Case
    ratios: dict[str, float] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    radius: float = 0.0
    vacuous: float = 0.0  # share of entries whose bound is infinite (only finiteness checked)

    @property
    def forward(self) -> float:
        return self.ratios["y"]

    @property
    def grads(self) -> float:
        return max(self.ratios[x] for x in GRADS)


def reference(case: Case, held: dict[str, Any]) -> dict[str, Ball]:
    """Enclosures of the exact outputs on the held inputs: y, lse, dq, dk, dv (and dbias),
    with the dropout factors ρ = r/(1 − p) from the same keep-bits."""
    requires("flint")
    from exactattn.oracle.certified import certified_attention

    enc = certified_attention(
        *(held[x] for x in "qkvg"),
        allowed=held["allowed"],
        keep=None if held["rho"] is None else held["rho"] > 0,
        dropout_p=case.dropout,
        bias=held["bias"],
        softcap=case.softcap,
        enable_gqa=case.gqa,
    )
    return enc.balls


def distance(x: np.ndarray, ball: Ball) -> tuple[np.ndarray, float]:
    """Upper bounds on ``|x − exact|`` entrywise, and the largest radius."""
    return ball.distance(np.asarray(x, dtype=np.float64)), ball.max_radius


def held_inputs(case: Case, target: Target) -> dict[str, Any]:
    data = inputs(case)
    return {
        **data,
        **{x: hold(data[x], target.storage) for x in "qkvg"},
        "bias": data["bias"],  # the bias stays float64 (it is converted to compute in the run)
    }


def measure(
    target: Target, case: Case, *, bound_fn: Callable = bounds, cache: dict | None = None
) -> Measurement:
    """Run ``target`` on ``case``; its error over the bound, per output.

    ``cache`` keeps references per (case, storage format): targets holding the inputs in
    the same format share one.
    """
    held = held_inputs(case, target)
    got = target.run(case, held)
    key = (case, target.storage)
    ref = None if cache is None else cache.get(key)
    if ref is None:
        ref = reference(case, held)
        if cache is not None:
            cache[key] = ref
    b = bound_fn(
        target.make_arith(case),
        held["q"],
        held["k"],
        held["v"],
        held["g"],
        allowed=held["allowed"],
        rho=held["rho"],
        bias=held["bias"],
        softcap=case.softcap,
        enable_gqa=case.gqa,
        stats=target.stats,
        delta=target.delta,
        row_block=target.row_block(case),
    )
    out = Measurement(target.name, case)
    compared = [name for name in got if name in ref and name in b]
    sizes = sum(b[name].size for name in compared)
    out.vacuous = sum(int(np.isinf(b[name]).sum()) for name in compared) / max(sizes, 1)
    for name in compared:
        value = got[name]
        dist, radius = distance(value, ref[name])
        out.ratios[name] = ratio(dist, b[name])
        out.errors[name] = float(dist.max(initial=0.0))
        out.radius = max(out.radius, radius)
    return out


def with_block(case: Case, block: int) -> Case:
    return replace(case, block=block)
