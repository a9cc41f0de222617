"""``exactattn.torch.attention``: the library's own strict API on torch tensors.

Inputs are checked first (shapes, dtypes, and by default finite values); the call then runs
through the operator ``exactattn::attention`` (:mod:`exactattn.torch.op`) when what it
asks for lowers to tensors and integers — no mask, a boolean mask array, ``is_causal``, a
:class:`~exactattn.core.masks.Mask` whose :meth:`~exactattn.core.masks.Mask.lower` gives a
:class:`~exactattn.core.masks.Band` (causal, sliding windows, per-batch key lengths and their
AND), a bias tensor, ``softcap`` — and through :class:`exactattn.torch.function.TiledAttention`
otherwise (predicates, ``mask_mod``, other masks, bias functions). After the call, the rows
left at ⊥ are checked (``empty_rows='error'`` raises; an overflowed row raises
``FloatingPointError`` while ``check_finite``), and ``Y`` is checked finite. Those checks
read values, so under ``torch.compile(fullgraph=True)`` pass ``check_finite=False,
empty_rows='zero'`` (or use :func:`exactattn.torch.scaled_dot_product_attention`, which has
SDPA's unchecked contract).
"""

from __future__ import annotations

from typing import Any

import torch

from ..core import calls, validation
from ..core.dropout import make_dropout
from ..core.masks import ALIGNMENTS, Band, Dense, Mask, as_mask, causal, dense
from ..core.scores import Bias, BiasFn, Softcap, chain
from ..core.scores import bias as as_bias
from . import dispatch, function, op, partials, passes

SEED_BITS = 64


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    block_size: int | None = None,
    scale: float | None = None,
    mask: Any = None,
    is_causal: bool = False,
    alignment: str = "top-left",
    dropout_p: float = 0.0,
    seed: int | None = None,
    bias: Any = None,
    softcap: float | None = None,
    enable_gqa: bool = False,
    empty_rows: str = "error",
    check_finite: bool = True,
    impl: str = "auto",
    sinks: Any = None,
) -> torch.Tensor:
    """Exact softmax attention ``Y_i = Σ_{j∈A_i} softmax_j(s_ij) V_j``, differentiable.

    Shapes as SDPA: ``q (..., H, n_q, d)``, ``k (..., H_kv, n_k, d)``,
    ``v (..., H_kv, n_k, v)``; without ``enable_gqa`` the leading dims broadcast. Scores
    ``s_ij = c·q_i·k_j``, soft-capped to ``cap·tanh(s/cap)`` by ``softcap``, plus ``B_ij``
    from ``bias`` (a tensor broadcastable to ``(..., H, n_q, n_k)`` — ``−inf`` excludes the
    pair, and it gets a gradient when it requires one — or ``fn(b, h, i, j)``). ``scale``
    is ``c`` (default ``1/sqrt(d)``); ``block_size`` is the key-block size ``b`` (default:
    512, more while one tile fits; any ``b >= 1`` gives the same exact result). ``mask``
    is a :class:`~exactattn.core.masks.Mask`, a boolean tensor or array broadcastable to
    ``(..., H, n_q, n_k)`` (True = attend, SDPA's boolean ``attn_mask``), or a predicate
    ``(i, j)`` / ``mask_mod(b, h, i, j)`` on index tensors; ``is_causal`` ANDs the causal
    mask aligned by ``alignment``: ``'top-left'`` (SDPA's ``is_causal``: ``j ≤ i``) or
    ``'bottom-right'`` (``j ≤ i + n_k − n_q``: the last query sees every key, as a decode
    step against a KV cache needs). ``dropout_p > 0`` needs ``seed``: the keep-bits are a
    pure function of (seed, batch·head, i, j), replayed in the backward. ``enable_gqa``:
    ``H`` is a multiple of ``H_kv`` and query head ``h`` reads key/value head
    ``h // (H / H_kv)``. ``empty_rows='zero'`` gives rows with no allowed key ``Y = 0`` and
    zero gradients (default: ValueError). ``impl``: ``'auto'`` runs the Triton kernels on
    CUDA when they express the call, ``'generic'`` always runs :mod:`exactattn.core.algorithm`,
    ``'triton'`` insists on the kernels (on the CPU only under ``TRITON_INTERPRET=1``).
    ``sinks``: one logit ``σ_h`` per query head, shape ``(H,)``, in the denominator only
    (:mod:`exactattn.core.sinks`; differentiable: ``sinks.grad`` is ``∂L/∂σ``); such a call runs
    the generic pass (:func:`exactattn.torch.partials.attention_with_lse`).
    """
    _check_tensors(q, k, v)
    if impl not in dispatch.IMPLS:
        raise ValueError(f"impl must be one of {dispatch.IMPLS}; got {impl!r}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool; got {is_causal!r}")
    if alignment not in ALIGNMENTS:
        raise ValueError(f"alignment must be one of {ALIGNMENTS}; got {alignment!r}")
    ctx = passes.context(q.dtype, q.device)
    allowed = _dense_tensor(mask, q.device)
    mask = Dense(allowed) if allowed is not None else as_mask(mask)
    if is_causal:
        mask = causal(alignment) if mask is None else mask & causal(alignment)
    bias = None if bias is None else as_bias(bias)
    bias_tensor = None
    if isinstance(bias, Bias):
        bias_tensor = torch.as_tensor(bias.values, device=q.device)
        bias = Bias(bias_tensor)
    cap = None if softcap is None else float(validation.check_softcap(ctx, softcap))
    call = calls.prepare(
        ctx, {"q": q, "k": k, "v": v}, scale=scale, block_size=block_size, mask=mask,
        score_mod=chain(None if cap is None else Softcap(cap), bias),
        dropout=make_dropout(dropout_p, seed), enable_gqa=enable_gqa,
        empty_rows=empty_rows, check_finite=check_finite,
    )  # fmt: skip
    if sinks is not None:  # the sink rides on the generic pass, whose reverse gives dsinks
        if bias_tensor is not None and bias_tensor.requires_grad:
            raise ValueError(
                "sinks with a bias tensor that requires grad: dbias is not computed on the "
                "sink path; detach the bias or fold it into a score_mod"
            )
        y, _ = partials.attention_with_lse(
            q, k, v, sinks=sinks, mask=mask, bias=bias, softcap=cap, scale=scale,
            block_size=block_size, dropout_p=dropout_p, seed=seed, enable_gqa=enable_gqa,
            empty_rows=empty_rows, check_finite=check_finite,
        )  # fmt: skip
        return y
    band = passes.lower(call.mask, call.geometry)  # the call's one lowering
    op_band = _op_band(band, allowed, is_causal, alignment)
    dropout = call.dropout
    if op_band is not None and not isinstance(bias, BiasFn):
        y, lse = op.attention(
            q, k, v,
            allowed=allowed, bias=bias_tensor, kv_lengths=_lengths(op_band, q.device),
            seed=None if dropout is None else _seed_tensor(dropout.seed),
            scale=None if scale is None else float(call.scale), band=op_band,
            dropout_p=0.0 if dropout is None else dropout.p, softcap=cap,
            enable_gqa=enable_gqa, block_size=call.block_size, impl=impl,
        )  # fmt: skip
    else:
        plan = passes.plan_for(call, band, impl=impl)
        if op.needs_grad(q, k, v, bias_tensor):
            y, lse = function.TiledAttention.apply(q, k, v, bias_tensor, plan)
        else:
            y, lse = passes.forward(plan, q, k, v)
    if check_finite or empty_rows == "error":
        validation.check_empty_rows(ctx, lse, empty_rows, call.mask, call.geometry, call.score_mod)
    if check_finite:  # finite inputs, so a non-finite y overflowed
        validation.check_output(ctx, "y", y)
    return y


# --- lowering for the operator --------------------------------------------------------------
def _dense_tensor(mask: Any, device: torch.device) -> torch.Tensor | None:
    """A boolean array or tensor ``mask`` as a tensor on ``device``; None for other masks."""
    if isinstance(mask, Mask) or callable(mask) or not hasattr(mask, "dtype"):
        return None
    return torch.as_tensor(dense(mask).mask, device=device)


def _op_band(band: Band | None, allowed, is_causal: bool, alignment: str) -> Band | None:
    """The operator's window and key lengths: the mask's ``band``, or with a dense
    ``allowed`` (which no band says, so ``band`` is None) the rest of the mask, which is at
    most ``is_causal``; None when the operator cannot take the mask."""
    if allowed is not None:
        return Band(alignment, None, 0) if is_causal else Band()
    return band


def _lengths(band: Band, device: torch.device) -> torch.Tensor | None:
    if band.kv_lengths is None:
        return None
    return torch.as_tensor(band.kv_lengths, device=device)


def _seed_tensor(seed: int) -> torch.Tensor:
    """The seed in [0, 2^64) as an int64 tensor (two's complement; the op takes it mod 2^64)."""
    return torch.tensor(seed - (1 << SEED_BITS) if seed >= 1 << (SEED_BITS - 1) else seed)


# --- input checks ---------------------------------------------------------------------------
def _check_tensors(q: Any, k: Any, v: Any) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
