"""The public functions: tiled attention, its reverse, the naive reference, self-attention.

Each call picks the number system from its arguments (or ``backend=``), checks its inputs,
runs :mod:`exactattn.core.algorithm` (or :mod:`exactattn.core.naive`) inside the backend's
precision scope and returns arrays of the backend's storage type. The keywords they share
are declared once, in :class:`Keywords`: every function's signature and ``help()`` list
them from there (:func:`_shares_keywords`).
"""

from __future__ import annotations

import functools
import inspect
import textwrap
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Annotated, Any

from .backends import resolve_backend
from .backends.protocol import Array, ArrayContext
from .core import algorithm, calls, hvp, naive, sinks, validation
from .core.calls import Call
from .core.dropout import make_dropout
from .core.hvp import Tangents
from .core.masks import as_mask, key_range
from .core.scores import bias as as_bias
from .core.scores import chain, score_fn
from .core.scores import softcap as as_softcap

DEFAULT_BLOCK_SIZE = 256  # within ~10% of the fastest b on the NumPy benchmark, half the tile
# memory of b = 512 (the policy: Keywords.block_size)


@dataclass(frozen=True)
class Stats:
    """The forward's retained row statistics, shape (*batch, n_q), in the compute type.

    ``m`` is the final running max, ``l`` the final denominator ℓ, ``lse = m + log ℓ``
    (−∞ for a row with no allowed key).
    """

    m: Array
    l: Array
    lse: Array


@dataclass(frozen=True, kw_only=True)
class Keywords:
    """The keywords every function of :mod:`exactattn.api` takes (but
    :func:`flash_attention`, seed 002's fixed signature): each one's type and documentation
    (``Annotated``) and its default."""

    block_size: Annotated[
        int | None,
        "``b``, the keys per block of the tiled pass: an integer >= 1; any ``b`` gives "
        "the same exact result, only the rounding differs. None: ``DEFAULT_BLOCK_SIZE`` "
        "(256). The naive functions check it and use one block of all keys.",
    ] = None
    scale: Annotated[
        Any,
        "``c`` in ``s_ij = c·q_i·k_j``: a finite real number (on sympy any real "
        "expression, a symbol too). None: ``1/sqrt(d)``.",
    ] = None
    mask: Annotated[
        Any,
        "the allowed keys ``A_i``: a :class:`~exactattn.core.masks.Mask`, a boolean array "
        "(True = attend) broadcastable to ``(*batch, n_q, n_k)``, a predicate ``(i, j) -> "
        "bool``, a ``mask_mod(b, h, i, j)`` or a torch ``BlockMask``. None: every key.",
    ] = None
    dropout_p: Annotated[
        float,
        "the probability of dropping each weight ``p_ij`` (the kept ones scaled by ``1/(1 "
        "− dropout_p)``), by the counter-based bits of :mod:`exactattn.core.dropout`; > 0 "
        "needs ``seed``.",
    ] = 0.0
    seed: Annotated[
        int | None,
        "the dropout bits' seed: the same bits on every backend and in the backward.",
    ] = None
    bias: Annotated[
        Any,
        "``bias_ij`` added to the (soft-capped) score: an array broadcastable to "
        "``(*batch, n_q, n_k)`` (``−inf`` entries exclude the pair) or ``fn(b, h, i, j)`` "
        "evaluated per tile. A backward with ``bias_grad=True`` also returns ``dbias``.",
    ] = None
    softcap: Annotated[
        Any,
        "``cap > 0``: the score ``s`` becomes ``cap·tanh(s/cap)`` before the bias.",
    ] = None
    score_mod: Annotated[
        Any,
        "``score_mod(s, b, h, i, j)``, applied to the score last (FlexAttention's "
        "signature, any function of the score: :class:`~exactattn.core.scores.ScoreFn`; "
        "on backends other than torch write it with operators and "
        ":mod:`exactattn.core.ops`).",
    ] = None
    enable_gqa: Annotated[
        bool,
        "grouped heads: axis −3 is the head axis and ``H_kv`` key/value heads serve ``H = "
        "g·H_kv`` query heads (head ``h`` reads ``h // g``).",
    ] = False
    backend: Annotated[
        Any,
        "the number system: a context (:mod:`exactattn.backends`) or its name "
        "(``float32``, ``mpmath``, ``sympy``, ``flint``, ...). None: the arrays' own "
        "(:func:`~exactattn.backends.backend_of`).",
    ] = None
    empty_rows: Annotated[
        str,
        "a row with no allowed key: ``error`` raises a ValueError naming the rows; "
        "``zero`` gives ``y = 0``, ``lse = −∞`` and zero gradients.",
    ] = "error"
    check_finite: Annotated[
        bool,
        "an input holding NaN or ±inf raises a ValueError naming it, an output that "
        "overflowed the working precision a FloatingPointError. False: compute anyway.",
    ] = True
    sinks: Annotated[
        Any,
        "one logit ``σ_h`` per query head, shape ``(H,)``, added to the softmax's "
        "denominator only (:mod:`exactattn.core.sinks`): a row with no allowed key then "
        "has ``y = 0``, ``lse = σ_h``; a backward returns ``dsinks`` last.",
    ] = None
    key_range: Annotated[
        tuple[int, int] | None,
        "``(start, stop)``: attend to keys ``start..stop−1`` only, at their positions in "
        "``k`` (masks keep their alignment): the partial result of one part of a split, "
        "to merge with :func:`exactattn.merge_partials`; rows with no allowed key in the "
        "range are the empty partial ``y = 0, lse = −∞``.",
    ] = None


_HINTS = typing.get_type_hints(Keywords, include_extras=True)  # Annotated[type, doc]


_KEYWORDS_DOC = "Keywords shared by the functions of exactattn.api:\n\n" + "\n".join(
    f"{f.name}={f.default!r}\n"
    + textwrap.indent(textwrap.fill(_HINTS[f.name].__metadata__[0], 84), "    ")
    for f in fields(Keywords)
)  # one entry per field: the name, the default, the documentation
_SHARED = tuple(
    inspect.Parameter(
        f.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=f.default,
        annotation=inspect.formatannotation(_HINTS[f.name].__origin__),
    )
    for f in fields(Keywords)
)
Keywords.__signature__ = inspect.Signature(_SHARED)  # type: ignore[attr-defined]
Keywords.__doc__ = f"{inspect.cleandoc(Keywords.__doc__ or '')}\n\n{_KEYWORDS_DOC}"


def _shares_keywords(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn(..., keywords: Keywords)`` as a public function taking every :class:`Keywords`
    field as a keyword: its signature is ``fn``'s own parameters and then the fields (with
    their defaults), its docstring ends with their documentation. A call binds to that
    signature (a misspelt keyword or a wrong count is a TypeError naming the function and
    the argument) and hands ``fn`` its own arguments and the fields given as one
    ``Keywords``."""
    names = {p.name for p in _SHARED}
    own = [p for p in inspect.signature(fn).parameters.values() if p.name != "keywords"]
    signature = inspect.signature(fn).replace(parameters=[*own, *_SHARED])

    @functools.wraps(fn)
    def public(*args: Any, **given: Any) -> Any:
        try:
            bound = signature.bind(*args, **given).arguments
        except TypeError as error:
            raise TypeError(f"{fn.__name__}() {error}") from None
        shared = {name: bound.pop(name) for name in names & bound.keys()}
        return fn(**bound, keywords=Keywords(**shared))

    public.__signature__ = signature  # type: ignore[attr-defined]
    public.__doc__ = f"{inspect.cleandoc(fn.__doc__ or '')}\n\n{_KEYWORDS_DOC}"
    return public


def _prepare(ctx: ArrayContext, inputs: dict[str, Any], kw: Keywords) -> Call:
    """Convert the inputs and prepare the call; inside ``ctx.scope()`` (conversion rounds)."""
    for name, x in inputs.items():
        if x is None:
            raise TypeError(f"{name} must be an array; got None")
    arrays = {}
    for name, x in inputs.items():
        try:
            arrays[name] = ctx.asarray(x)
        except TypeError as error:
            raise TypeError(f"{name}: {error}") from None
    score_mod = chain(
        None if kw.softcap is None else as_softcap(validation.check_softcap(ctx, kw.softcap)),
        None if kw.bias is None else as_bias(kw.bias),
        None if kw.score_mod is None else score_fn(kw.score_mod),
    )
    return calls.prepare(
        ctx, arrays, scale=kw.scale, block_size=kw.block_size, mask=kw.mask,
        score_mod=score_mod, dropout=make_dropout(kw.dropout_p, kw.seed),
        enable_gqa=kw.enable_gqa, empty_rows=kw.empty_rows, check_finite=kw.check_finite,
        default_block_size=DEFAULT_BLOCK_SIZE,
    )  # fmt: skip


def _forward(call: Call, run: Any) -> tuple[Array, Stats]:
    ctx = call.ctx
    y, m, l = run(call)
    validation.check_empty_rows(ctx, m, call.empty_rows, call.mask, call.geometry, call.score_mod)
    if call.check_finite:
        validation.check_output(ctx, "y", y)
    return ctx.output(y), Stats(m, l, algorithm.log_sum_exp(ctx, m, l))


def _tiled_forward(call: Call, sink: Array | None = None) -> tuple[Array, Array, Array]:
    a = call.arrays
    initial = None
    if sink is not None:  # each row starts at the sink's summary (σ_h, 1, 0) instead of ⊥
        initial = sinks.initial_summary(call.ctx, sink, call.geometry, a["v"].shape[-1])
    y, state = algorithm.forward(
        call.ctx, a["q"], a["k"], a["v"], block_size=call.block_size, initial=initial,
        **call.keywords(),
    )  # fmt: skip
    return y, state.m, state.l


def _naive_forward(call: Call, sink: Array | None = None) -> tuple[Array, Array, Array]:
    a = call.arrays
    y, m, l = naive.naive_forward(call.ctx, a["q"], a["k"], a["v"], **call.keywords())
    return (y, m, l) if sink is None else sinks.add_sinks(call.ctx, y, m, l, sink)


def _tiled_backward(
    call: Call, m: Array, l: Array, grads: dict, grad_lse: Array | None = None
) -> tuple[Array, Array, Array]:
    a = call.arrays
    return algorithm.backward(
        call.ctx, a["q"], a["k"], a["v"], a["y"], m, l, a["grad_y"],
        block_size=call.block_size, mod_grads=grads, grad_lse=grad_lse, **call.keywords(),
    )  # fmt: skip


def _naive_backward(call: Call, m: Array, l: Array, grads: dict) -> tuple[Array, Array, Array]:
    a = call.arrays
    return naive.naive_backward(
        call.ctx, a["q"], a["k"], a["v"], a["grad_y"], mod_grads=grads, **call.keywords()
    )


def _check_backward_inputs(call: Call, stats: Stats) -> tuple[Array, Array]:
    ctx, a, geo = call.ctx, call.arrays, call.geometry
    y_shape = (*geo.batch, geo.n_q, a["v"].shape[-1])  # the logical batch (heads unsplit)
    validation.check_same_shape("y", a["y"], y_shape)
    validation.check_same_shape("grad_y", a["grad_y"], y_shape)
    if not isinstance(stats, Stats):
        raise TypeError(f"stats must be the Stats returned by the forward; got {type(stats)}")
    m, l = ctx.as_compute(stats.m), ctx.as_compute(stats.l)
    validation.check_same_shape("stats.m", m, y_shape[:-1])
    validation.check_same_shape("stats.l", l, y_shape[:-1])
    if call.check_finite:
        validation.check_stats(ctx, m, l)
    validation.check_empty_rows(ctx, m, call.empty_rows, call.mask, call.geometry, call.score_mod)
    return m, l


def _finish_backward(call: Call, grads: dict[str, Array]) -> tuple[Array, ...]:
    if call.check_finite:
        for name, grad in grads.items():
            validation.check_output(call.ctx, name, grad)
    return tuple(call.ctx.output(grad) for grad in grads.values())


@_shares_keywords
def attention(q: Any, k: Any, v: Any, *, return_stats: bool = False, keywords: Keywords) -> Any:
    """Exact tiled softmax attention ``Y_i = Σ_{j∈A_i} softmax_j(s_ij) V_j``.

    Scores ``s_ij = mod(c·q_i·k_j)``: ``cap·tanh(s/cap)`` with ``softcap``, then ``+ bias_ij``
    with ``bias``, then ``score_mod(s, b, h, i, j)`` with ``score_mod``; ``A_i`` the keys
    ``mask`` allows. Shapes ``q (..., n_q, d)``, ``k (..., n_k, d)``, ``v (..., n_k, v)``;
    leading dims broadcast. Returns ``y (..., n_q, v)``, or ``(y, stats)`` with
    ``return_stats`` (:class:`Stats`: ``m``, ``l``, ``lse``).
    """
    y, stats = _call_forward({"q": q, "k": k, "v": v}, keywords, _tiled_forward)
    return (y, stats) if return_stats else y


@_shares_keywords
def prepare_call(q: Any, k: Any, v: Any, *, keywords: Keywords) -> Call:
    """:func:`attention`'s arguments checked and resolved but not run: the
    :class:`~exactattn.core.calls.Call` (context, sizes, ``c``, the mask ``A_i``, the score
    modifications ``mod``, dropout ``r_ij``), for a caller that reads the scores
    ``s_ij = mod(c·q_i·k_j)`` of a few tiles itself (the flash-attn drop-in's ``S_dmask``).
    For contexts without a precision scope (IEEE floats): the call is used after it closes.
    """
    ctx = resolve_backend(keywords.backend, ("q", q), ("k", k), ("v", v))
    sink, keywords = _interfaces(keywords)
    if sink is not None:
        raise TypeError("prepare_call takes no sinks: they enter no score s_ij")
    with ctx.scope():
        return _prepare(ctx, {"q": q, "k": k, "v": v}, keywords)


@_shares_keywords
def attention_backward(
    q: Any,
    k: Any,
    v: Any,
    y: Any,
    stats: Stats,
    grad_y: Any,
    *,
    bias_grad: bool = False,
    grad_lse: Any = None,
    keywords: Keywords,
) -> tuple[Array, ...]:
    """The block-recomputed VJP ``(dq, dk, dv)`` of :func:`attention` at ``grad_y``.

    Takes the forward's ``y`` and ``stats`` and the keywords the forward was given.
    ``bias_grad=True`` (with a bias array) also returns ``dbias = ∂L/∂bias``, shaped like
    the bias: ``(dq, dk, dv, dbias)``. With ``sinks`` (and the forward's stats, which
    include the sink) ``dsinks = ∂L/∂σ`` comes last: ``(dq, dk, dv[, dbias], dsinks)``.
    ``grad_lse`` (shaped like ``stats.lse``): an upstream gradient of the lse as well (the
    lse of a partial result feeds a merge).
    """
    inputs = {"q": q, "k": k, "v": v, "y": y, "grad_y": grad_y}
    return _call_backward(inputs, stats, keywords, _tiled_backward, bias_grad, grad_lse)


@_shares_keywords
def attention_hvp(
    q: Any,
    k: Any,
    v: Any,
    y: Any,
    stats: Stats,
    grad_y: Any,
    tangents: Any,
    *,
    bias_grad: bool = False,
    grad_lse: Any = None,
    keywords: Keywords,
) -> tuple[Array, ...]:
    """The directional derivative of :func:`attention_backward`: a Hessian-vector product.

    ``tangents`` is a :class:`~exactattn.core.hvp.Tangents` ``(q, k, v, grad_y[, bias])``
    (a plain tuple of 4 or 5 works too) of arrays shaped like ``q, k, v, grad_y`` (and the
    bias array), None for a zero tangent. Returns

        (dq̇, dk̇, dv̇) = d/dε attention_backward(q + εq̇, k + εk̇, v + εv̇, …, grad_y + εġ)|ε=0

    — ``H·(q̇, k̇, v̇) + Jᵀ ġ`` with ``H`` the Hessian of ``L = Σ grad_y∘y`` in ``(q, k, v)``
    and ``Jᵀ ġ`` the first reverse at ``ġ`` — tiled (two passes over the blocks, per-row
    ``σ_i = Σ_j p_ij ṡ_ij`` and ``δ̇_i = ġ_i·y_i + g_i·ẏ_i`` from the first; the maths in
    :mod:`exactattn.core.hvp`). ``y`` and ``stats`` are the forward's, the keywords the
    forward's (masks, ``bias``, ``softcap``, ``score_mod``, dropout replay, GQA).
    ``bias_grad=True`` (with a bias array) also returns ``dḃias``, the derivative of
    ``dbias``: ``(dq̇, dk̇, dv̇, dḃias)``. ``grad_lse``: as :func:`attention_backward`'s,
    held fixed (its tangent is 0). ``sinks`` are not taken.
    """
    inputs = {"q": q, "k": k, "v": v, "y": y, "grad_y": grad_y}
    ctx = resolve_backend(keywords.backend, *inputs.items())
    sink, keywords = _interfaces(keywords)
    if sink is not None:
        raise ValueError(
            "attention_hvp takes no sinks (the sink's second derivative is not computed); "
            "drop sinks=, or differentiate attention_backward's dsinks yourself"
        )
    with ctx.scope():
        call = _prepare(ctx, inputs, keywords)
        m, l = _check_backward_inputs(call, stats)
        tangents = _check_tangents(call, tangents)
        mod_tangents = {} if tangents.bias is None else {"bias": tangents.bias}
        grad_tangents = _bias_gradient(call) if bias_grad else {}
        if grad_lse is not None:
            grad_lse = ctx.as_compute(grad_lse)
            validation.check_same_shape("grad_lse", grad_lse, tuple(m.shape))
        a = call.arrays
        out = hvp.hvp(
            ctx, a["q"], a["k"], a["v"], a["y"], m, l, a["grad_y"], tangents,
            block_size=call.block_size, grad_lse=grad_lse, mod_tangents=mod_tangents,
            mod_grad_tangents=grad_tangents, output_tangent=False, **call.keywords(),
        )  # fmt: skip
        return _finish_backward(call, {"dq": out.q, "dk": out.k, "dv": out.v, **grad_tangents})


def _check_tangents(call: Call, tangents: Any) -> Tangents:
    """``tangents`` as a :class:`Tangents` of the context's arrays, each shaped like its primal."""
    if not isinstance(tangents, (tuple, list)) or len(tangents) not in (4, 5):
        raise TypeError(
            "tangents must be a Tangents(q, k, v, grad_y[, bias]) or a tuple of 4 or 5 arrays "
            f"(None for a zero tangent); got {type(tangents).__name__}"
            + (f" of length {len(tangents)}" if isinstance(tangents, (tuple, list)) else "")
        )
    tangents = Tangents(*tangents)
    ctx, a = call.ctx, call.arrays
    shapes = {name: tuple(a[name].shape) for name in ("q", "k", "v", "grad_y")}
    if tangents.bias is not None:
        found = {} if call.score_mod is None else call.score_mod.gradients()
        if "bias" not in found:
            raise ValueError("tangents.bias needs bias=<array> (the tangent of that array)")
        shapes["bias"] = found["bias"]
    out = {}
    for name, x in tangents._asdict().items():
        if x is None:
            out[name] = None
            continue
        try:
            x = ctx.asarray(x) if name != "bias" else ctx.as_compute(x)
        except TypeError as error:
            raise TypeError(f"tangents.{name}: {error}") from None
        validation.check_same_shape(f"tangents.{name}", x, shapes[name])
        if call.check_finite:
            validation.check_finite(ctx, f"tangents.{name}", x)
        out[name] = x
    return Tangents(**out)


@_shares_keywords
def naive_attention(
    q: Any, k: Any, v: Any, *, return_stats: bool = False, keywords: Keywords
) -> Any:
    """The materialising reference: same arguments and result as :func:`attention`."""
    y, stats = _call_forward({"q": q, "k": k, "v": v}, keywords, _naive_forward)
    return (y, stats) if return_stats else y


@_shares_keywords
def naive_attention_backward(
    q: Any,
    k: Any,
    v: Any,
    y: Any,
    stats: Stats,
    grad_y: Any,
    *,
    bias_grad: bool = False,
    keywords: Keywords,
) -> tuple[Array, ...]:
    """The exact VJP of naive attention (softmax Jacobian on the whole ``P``);
    ``bias_grad`` as :func:`attention_backward`'s."""
    inputs = {"q": q, "k": k, "v": v, "y": y, "grad_y": grad_y}
    return _call_backward(inputs, stats, keywords, _naive_backward, bias_grad)


@_shares_keywords
def self_attention(x: Any, *, return_stats: bool = False, keywords: Keywords) -> Any:
    """Self-attention with ``Q = K = V = x`` (seed 000's setting): :func:`attention`."""
    y, stats = _call_forward({"q": x, "k": x, "v": x}, keywords, _tiled_forward)
    return (y, stats) if return_stats else y


@_shares_keywords
def self_attention_backward(
    x: Any,
    y: Any,
    stats: Stats,
    grad_y: Any,
    *,
    bias_grad: bool = False,
    grad_lse: Any = None,
    keywords: Keywords,
) -> Array:
    """``dX = dQ + dK + dV``: the three uses of the shared input add (chain rule);
    ``bias_grad`` and ``grad_lse`` as :func:`attention_backward`'s."""
    inputs = {"q": x, "k": x, "v": x, "y": y, "grad_y": grad_y}
    dq, dk, dv = _call_backward(inputs, stats, keywords, _tiled_backward, bias_grad, grad_lse)
    return dq + dk + dv


def flash_attention(query: Any, key: Any, value: Any, block_size: int, mask: Any = None) -> Any:
    """Seed 002's signature: :func:`attention` with an explicit block size."""
    return attention(query, key, value, block_size=block_size, mask=mask)


def _call_forward(inputs: dict[str, Any], keywords: Keywords, run: Any) -> tuple[Array, Stats]:
    """Resolve the context, then check, convert and run inside its precision scope."""
    ctx = resolve_backend(keywords.backend, *inputs.items())
    sink, keywords = _interfaces(keywords)
    with ctx.scope():
        call = _prepare(ctx, inputs, keywords)
        sink = (
            None if sink is None else sinks.check_sinks(ctx, sink, call.geometry, call.check_finite)
        )
        return _forward(call, lambda call: run(call, sink))


def _call_backward(
    inputs: dict[str, Any],
    stats: Stats,
    keywords: Keywords,
    run: Any,
    bias_grad: bool,
    grad_lse: Any = None,
) -> tuple[Array, ...]:
    ctx = resolve_backend(keywords.backend, *inputs.items())
    sink, keywords = _interfaces(keywords)
    with ctx.scope():
        call = _prepare(ctx, inputs, keywords)
        m, l = _check_backward_inputs(call, stats)
        mod_grads = _bias_gradient(call) if bias_grad else {}
        if grad_lse is not None:  # a statistic's gradient: the compute type, like stats.m
            grad_lse = ctx.as_compute(grad_lse)
            validation.check_same_shape("grad_lse", grad_lse, tuple(m.shape))
            dq, dk, dv = run(call, m, l, mod_grads, grad_lse)
        else:
            dq, dk, dv = run(call, m, l, mod_grads)
        grads = {"dq": dq, "dk": dk, "dv": dv, **mod_grads}
        if sink is not None:
            sink = sinks.check_sinks(ctx, sink, call.geometry, call.check_finite)
            a = call.arrays
            grads["dsinks"] = sinks.sink_gradient(ctx, sink, a["y"], a["grad_y"], m, l, grad_lse)
        return _finish_backward(call, grads)


def _interfaces(keywords: Keywords) -> tuple[Any, Keywords]:
    """The ``sinks``, and the keywords with ``key_range`` turned into the mask it is.

    A key range is one more mask, ANDed with the caller's; its rows with no key in the range
    are the empty partial (``empty_rows='zero'``), which is what a split needs.
    """
    part = keywords.key_range
    if part is not None:
        if not (isinstance(part, (tuple, list)) and len(part) == 2):
            raise TypeError(f"key_range must be a (start, stop) pair; got {part!r}")
        mask = as_mask(keywords.mask)
        mask = key_range(*part) if mask is None else key_range(*part) & mask
        keywords = replace(keywords, mask=mask, empty_rows="zero")
    return keywords.sinks, keywords


def _bias_gradient(call: Call) -> dict[str, Array]:
    """A zero ``dbias`` accumulator for ``bias_grad=True`` (which needs a bias array)."""
    shapes = {} if call.score_mod is None else call.score_mod.gradients()
    if "bias" not in shapes:
        raise ValueError("bias_grad=True needs bias=<array> (a bias function has no gradient)")
    return {"bias": call.ctx.zeros(shapes["bias"])}
