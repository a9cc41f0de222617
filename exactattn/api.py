"""The public functions: tiled attention, its reverse, the naive reference, self-attention.

Each call picks the number system from its arguments (or ``backend=``), checks its inputs,
runs :mod:`exactattn.core.algorithm` (or :mod:`exactattn.core.naive`) inside the backend's
precision scope and returns arrays of the backend's storage type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .backends import resolve_backend
from .backends.protocol import Array, ArrayContext
from .core import algorithm, calls, naive, sinks, validation
from .core.calls import Call
from .core.dropout import make_dropout
from .core.masks import as_mask, key_range
from .core.scores import bias as as_bias
from .core.scores import chain, score_fn
from .core.scores import softcap as as_softcap

DEFAULT_BLOCK_SIZE = 256  # within ~10% of the fastest b on the NumPy benchmark, half the tile
# memory of b = 512; any b >= 1 gives the same exact result


@dataclass(frozen=True)
class Stats:
    """The forward's retained row statistics, shape (*batch, n_q), in the compute type.

    ``m`` is the final running max, ``l`` the final denominator ℓ, ``lse = m + log ℓ``
    (−∞ for a row with no allowed key).
    """

    m: Array
    l: Array
    lse: Array


def _prepare(
    ctx: ArrayContext,
    inputs: dict[str, Any],
    *,
    block_size: Any,
    scale: Any,
    mask: Any,
    dropout_p: Any,
    seed: Any,
    bias: Any,
    softcap: Any,
    score_mod: Any,
    enable_gqa: Any,
    empty_rows: str,
    check_finite: bool,
) -> Call:
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
        None if softcap is None else as_softcap(validation.check_softcap(ctx, softcap)),
        None if bias is None else as_bias(bias),
        None if score_mod is None else score_fn(score_mod),
    )
    return calls.prepare(
        ctx, arrays, scale=scale, block_size=block_size, mask=mask, score_mod=score_mod,
        dropout=make_dropout(dropout_p, seed), enable_gqa=enable_gqa, empty_rows=empty_rows,
        check_finite=check_finite, default_block_size=DEFAULT_BLOCK_SIZE,
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


_DEFAULTS = dict(
    block_size=None,
    scale=None,
    mask=None,
    dropout_p=0.0,
    seed=None,
    bias=None,
    softcap=None,
    score_mod=None,
    enable_gqa=False,
    backend=None,
    empty_rows="error",
    check_finite=True,
    sinks=None,
    key_range=None,
)


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    block_size: int | None = None,
    scale: Any = None,
    mask: Any = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
    bias: Any = None,
    softcap: Any = None,
    score_mod: Any = None,
    enable_gqa: bool = False,
    return_stats: bool = False,
    backend: Any = None,
    empty_rows: str = "error",
    check_finite: bool = True,
    sinks: Any = None,
    key_range: tuple[int, int] | None = None,
) -> Any:
    """Exact tiled softmax attention ``Y_i = Σ_{j∈A_i} softmax_j(s_ij) V_j``.

    Scores ``s_ij = c·q_i·k_j``, soft-capped to ``cap·tanh(s/cap)`` when ``softcap`` is
    given, plus ``bias_ij`` when ``bias`` is given (an array broadcastable to
    ``(*batch, n_q, n_k)``, ``−inf`` entries excluded, or ``fn(b, h, i, j)`` evaluated per
    tile), then ``score_mod(s, b, h, i, j)`` when given (FlexAttention's signature, any
    function of the score: see :class:`~exactattn.core.scores.ScoreFn`; on backends other than
    torch write it with operators and :mod:`exactattn.core.ops`). Shapes ``q (..., n_q, d)``,
    ``k (..., n_k, d)``, ``v (..., n_k, v)``; leading dims broadcast; with ``enable_gqa``
    axis −3 is the head axis and ``H_kv`` key/value heads serve ``H = g·H_kv`` query heads
    (head ``h`` reads ``h // g``). ``scale`` is ``c`` (default ``1/sqrt(d)``),
    ``block_size`` is ``b`` (any ``b >= 1`` gives the same exact result), ``mask`` a
    :class:`~exactattn.core.masks.Mask`, a boolean array, a predicate ``(i, j) -> bool``, a
    ``mask_mod(b, h, i, j)`` or a torch ``BlockMask``. ``dropout_p > 0`` needs ``seed``.
    Returns ``y`` or ``(y, stats)`` with ``stats.m``, ``stats.l``, ``stats.lse``.
    ``empty_rows='zero'`` gives ``y = 0`` and ``lse = −∞`` for rows with no allowed key
    (default: ``ValueError``). ``sinks``: one logit ``σ_h`` per query head, shape ``(H,)``,
    added to the softmax's denominator only (:mod:`exactattn.core.sinks`; a row with no allowed
    key then has ``y = 0``, ``lse = σ_h``). ``key_range=(start, stop)``: attend to keys
    ``start..stop−1`` only, at their positions in ``k`` (masks keep their alignment): the
    partial result of one part of a split, to merge with
    :func:`exactattn.merge_partials`; rows with no allowed key in the range are the empty
    partial ``y = 0, lse = −∞``.
    """
    keywords = dict(
        block_size=block_size,
        scale=scale,
        mask=mask,
        dropout_p=dropout_p,
        seed=seed,
        bias=bias,
        softcap=softcap,
        score_mod=score_mod,
        enable_gqa=enable_gqa,
        backend=backend,
        empty_rows=empty_rows,
        check_finite=check_finite,
        sinks=sinks,
        key_range=key_range,
    )
    y, stats = _call_forward({"q": q, "k": k, "v": v}, keywords, _tiled_forward)
    return (y, stats) if return_stats else y


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
    **keywords: Any,
) -> tuple[Array, ...]:
    """The block-recomputed VJP ``(dq, dk, dv)`` of :func:`attention` at ``grad_y``.

    Takes the forward's ``y`` and ``stats`` and the same keywords as :func:`attention`.
    ``bias_grad=True`` (with a bias array) also returns ``dbias = ∂L/∂bias``, shaped like
    the bias: ``(dq, dk, dv, dbias)``. With ``sinks`` (and the forward's stats, which
    include the sink) ``dsinks = ∂L/∂σ`` comes last: ``(dq, dk, dv[, dbias], dsinks)``.
    ``grad_lse`` (shaped like ``stats.lse``): an upstream gradient of the lse as well (the
    lse of a partial result feeds a merge).
    """
    inputs = {"q": q, "k": k, "v": v, "y": y, "grad_y": grad_y}
    return _call_backward(inputs, stats, keywords, _tiled_backward, bias_grad, grad_lse)


def naive_attention(q: Any, k: Any, v: Any, *, return_stats: bool = False, **keywords: Any):
    """The materialising reference: same arguments and result as :func:`attention`."""
    y, stats = _call_forward({"q": q, "k": k, "v": v}, keywords, _naive_forward)
    return (y, stats) if return_stats else y


def naive_attention_backward(
    q: Any,
    k: Any,
    v: Any,
    y: Any,
    stats: Stats,
    grad_y: Any,
    *,
    bias_grad: bool = False,
    **keywords: Any,
) -> tuple[Array, ...]:
    """The exact VJP of naive attention (softmax Jacobian on the whole ``P``)."""
    inputs = {"q": q, "k": k, "v": v, "y": y, "grad_y": grad_y}
    return _call_backward(inputs, stats, keywords, _naive_backward, bias_grad)


def self_attention(x: Any, **keywords: Any) -> Any:
    """Self-attention with ``Q = K = V = x`` (seed 000's setting)."""
    return attention(x, x, x, **keywords)


def self_attention_backward(x: Any, y: Any, stats: Stats, grad_y: Any, **keywords: Any) -> Array:
    """``dX = dQ + dK + dV``: the three uses of the shared input add (chain rule)."""
    dq, dk, dv = attention_backward(x, x, x, y, stats, grad_y, **keywords)
    return dq + dk + dv


def flash_attention(query: Any, key: Any, value: Any, block_size: int, mask: Any = None) -> Any:
    """Seed 002's signature: :func:`attention` with an explicit block size."""
    return attention(query, key, value, block_size=block_size, mask=mask)


def _call_forward(
    inputs: dict[str, Any], keywords: dict[str, Any], run: Any
) -> tuple[Array, Stats]:
    """Resolve the context, then check, convert and run inside its precision scope."""
    ctx, keywords = _context(inputs, keywords)
    sink, keywords = _interfaces(keywords)
    with ctx.scope():
        call = _prepare(ctx, inputs, **keywords)
        sink = (
            None if sink is None else sinks.check_sinks(ctx, sink, call.geometry, call.check_finite)
        )
        return _forward(call, lambda call: run(call, sink))


def _call_backward(
    inputs: dict[str, Any],
    stats: Stats,
    keywords: dict[str, Any],
    run: Any,
    bias_grad: bool,
    grad_lse: Any = None,
) -> tuple[Array, ...]:
    ctx, keywords = _context(inputs, keywords)
    sink, keywords = _interfaces(keywords)
    with ctx.scope():
        call = _prepare(ctx, inputs, **keywords)
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


def _interfaces(keywords: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Take ``sinks`` out of the keywords and turn ``key_range`` into the mask it is.

    A key range is one more mask, ANDed with the caller's; its rows with no key in the range
    are the empty partial (``empty_rows='zero'``), which is what a split needs.
    """
    keywords = dict(keywords)
    sink, part = keywords.pop("sinks"), keywords.pop("key_range")
    if part is not None:
        if not (isinstance(part, (tuple, list)) and len(part) == 2):
            raise TypeError(f"key_range must be a (start, stop) pair; got {part!r}")
        mask = as_mask(keywords["mask"])
        keywords["mask"] = key_range(*part) if mask is None else key_range(*part) & mask
        keywords["empty_rows"] = "zero"
    return sink, keywords


def _bias_gradient(call: Call) -> dict[str, Array]:
    """A zero ``dbias`` accumulator for ``bias_grad=True`` (which needs a bias array)."""
    shapes = {} if call.score_mod is None else call.score_mod.gradients()
    if "bias" not in shapes:
        raise ValueError("bias_grad=True needs bias=<array> (a bias function has no gradient)")
    return {"bias": call.ctx.zeros(shapes["bias"])}


def _context(
    inputs: dict[str, Any], keywords: dict[str, Any]
) -> tuple[ArrayContext, dict[str, Any]]:
    """The call's context and the remaining keywords with their defaults filled in."""
    unknown = set(keywords) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
    keywords = {**_DEFAULTS, **keywords}
    return resolve_backend(keywords.pop("backend"), *inputs.items()), keywords
