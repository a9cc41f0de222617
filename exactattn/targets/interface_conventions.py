"""Calling conventions of today's kernel interfaces: varlen, KV caches, split-KV merges.

Each takes an ordinary case (dense ``q, k, v`` over ``(B, H)``) and calls the target through
the interface, so the case's certified reference judges the result unchanged:

* ``flash-varlen``: ``flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k,
  max_seqlen_q, max_seqlen_k, ...)``: the ``B`` batch elements packed as sequences; a
  key-padding mask becomes unequal key lengths (only the real keys are packed: their
  ``dK``, ``dV`` come back in place, the padded keys' are 0); causal and windows aligned
  bottom-right as ``flash``.
* ``flash-kvcache``: ``flash_attn_with_kvcache`` with appends, paged and contiguous
  caches, ``cache_batch_idx``, ``cache_leftpad``, rotary and ``num_splits``
  (:mod:`.flash_kvcache`); forward only (flash-attn's function has no backward).
* ``fa4-combine``, ``xformers-merge``, ``flashinfer-merge``: the target is a *merge*: the
  keys are split into the case's number of parts, each part's partial ``(y_t, lse_t)`` is
  computed in float64 by :func:`exactattn.attention` (``key_range``) and rounded to the case
  dtype, and the target merges them: FA4's ``flash_attn_combine(out_partial (S, B, n, H,
  v), lse_partial (S, B, n, H))``, xformers' ``merge_attentions(attn_split (S, B, n, H, v),
  lse_split (S, B, H, n))``, FlashInfer's ``merge_state(v_a, s_a, v_b, s_b)`` (``(n, H, v)``,
  ``(n, H)``, lse in base 2, folded over the parts in the case's dtype:
  :mod:`.flashinfer_conventions`, with FlashInfer's prefill, decode and paged conventions).
  Forward only.
* ``exactattn-sinks``: a sink-capable attention returning ``(y, lse)``
  (:class:`Sinks`: the sink given and taken out again). Forward only.

ONNX Runtime's KV-cache conventions (``onnx-kvcache``, ``ort-gqa``) are
:mod:`.onnx_conventions`'s; :mod:`.interface_table` gathers every interface convention.
Each reads the case's interface fields (:mod:`exactattn.cases.interface_fields`: ``seqlens``,
``splits``, ``pages``, ``sinks``), which ``exactattn check`` draws whenever a target runs
through one of these conventions. A case without them (drawn for another convention, or
replayed from an older file) gets a layout derived from its contents,
:meth:`InterfaceDraw.of`, so a replay gets the same one.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cases import Case, interface_fields, mask_kinds
from .conventions import (
    Convention,
    autograd,
    dtype_name,
    flash_alibi,
    flash_window,
    four_g,
    lift,
    tensor,
    to_numpy,
)


@dataclass(frozen=True)
class InterfaceDraw:
    """The layout of a case without interface fields: ``splits`` equal parts of the keys,
    pages of ``page_size`` (of the drawn distribution,
    :data:`~exactattn.cases.interface_fields.PAGE_SIZES`) in the order ``seed`` draws; all
    read from a hash of the keys."""

    splits: int
    page_size: int
    seed: int

    @classmethod
    def of(cls, case: Case) -> InterfaceDraw:
        digest = hashlib.sha256(np.ascontiguousarray(case.k).tobytes()).digest()
        seed = int.from_bytes(digest[:4], "little")
        u = int.from_bytes(digest[4:8], "little") / 2**32
        n_k = case.sizes["n_k"]
        return cls(
            splits=max(1, min(n_k, 2 + seed % 3)),
            page_size=interface_fields.page_size(u, case.block_size, n_k),
            seed=seed,
        )

    @staticmethod
    def edges(case: Case) -> list[int]:
        """The split-KV key boundaries: the case's ``splits``, else equal parts."""
        if case.splits is not None:
            return list(case.splits)
        splits = InterfaceDraw.of(case).splits
        return np.linspace(0, case.sizes["n_k"], splits + 1).round().astype(int).tolist()

    @staticmethod
    def pages(case: Case, B: int) -> dict[str, Any]:
        """The paged cache's block table: the case's ``pages``, else unshared pages."""
        if case.pages is not None:
            return case.pages
        derived = InterfaceDraw.of(case)
        return interface_fields.fill_pages(derived.page_size, 0, derived.seed, B, case.sizes["n_k"])


def key_lengths(case: Case, B: int) -> tuple[np.ndarray, str | None]:
    """Per-sequence key lengths: the case's ``seqlens`` (its mask is their key padding), the
    mask's for a mask of key lengths (:func:`exactattn.cases.mask_kinds.key_lengths`), else
    n_k."""
    n_k = case.sizes["n_k"]
    if case.seqlens is not None:
        lengths = np.asarray(case.seqlens, dtype=np.int64)
        if mask_kinds.key_lengths(case.mask) is None:
            return lengths, (
                "the varlen batch has its own query lengths or a causal / window mask per "
                "sequence: only a varlen call (cu_seqlens_q, cu_seqlens_k) expresses it"
            )
        return lengths, None
    lengths = mask_kinds.key_lengths(case.mask)
    if lengths is None:
        return np.full(B, n_k), None
    lengths = np.asarray(lengths).reshape(-1)
    if lengths.shape[0] != B:
        return lengths, "padding lengths per head are not sequence lengths"
    return lengths.astype(np.int64), None


@dataclass(frozen=True)
class Sequences:
    """A varlen call's layout of a case: sequence ``b`` has ``q[b]`` queries (the first of
    its ``n_q`` rows) and ``k[b]`` keys, and ``window`` is flash-attn's ``window_size``
    aligned bottom-right within each sequence."""

    q: np.ndarray
    k: np.ndarray
    window: tuple[int, int]

    @staticmethod
    def offsets(lengths: np.ndarray) -> np.ndarray:
        """``cu_seqlens``: ``0, ℓ_0, ℓ_0 + ℓ_1, …``."""
        return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def sequences(case: Case, B: int) -> Sequences | str:
    """The case as a varlen call: its varlen batch (``seqlens``; the query lengths of its
    mask's ``query_padding``, :attr:`~exactattn.cases.Case.q_seqlens`; its causal / window
    leaf aligned bottom-right within each sequence, :func:`~exactattn.cases.mask_kinds.
    per_sequence`), or every sequence ``n_q`` queries, the key lengths and window of
    :func:`key_lengths` and :func:`window_of`; or the reason it is none."""
    n_q = case.sizes["n_q"]
    if case.seqlens is None and case.q_seqlens is not None:
        return _ragged(case, B)
    if case.seqlens is None:
        lengths, reason = key_lengths(case, B)
        window = window_of(case)
        if reason is not None or isinstance(window, str):
            return reason or window  # type: ignore[return-value]
        return Sequences(np.full(B, n_q), lengths, window)
    q = np.asarray(case.q_seqlens or [n_q] * B, dtype=np.int64)
    k = np.asarray(case.seqlens, dtype=np.int64)
    left, right = math.inf, math.inf
    for part in mask_kinds.conjuncts(case.mask):
        if part["kind"] in ("padding", "query_padding"):  # the lengths themselves
            continue
        if "offsets" in part and not np.array_equal(part["offsets"], k - q):
            return "the mask's per-sequence offsets are not bottom-right, as a varlen call aligns"
        whole = {key: value for key, value in part.items() if key != "offsets"}
        window = mask_kinds.window(whole)
        if window is None:
            return "the flash convention expresses causal / sliding-window masks only"
        left = min(left, math.inf if window[0] is None else window[0])
        right = min(right, math.inf if window[1] is None else window[1])
    as_int = lambda x: -1 if x == math.inf else int(x)  # noqa: E731
    return Sequences(q, k, (as_int(left), as_int(right)))


def _ragged(case: Case, B: int) -> Sequences | str:
    """A ragged batch of queries (the mask's ``query_padding``, no ``seqlens``) as a varlen
    call: each sequence's query length, its key padding's length (or ``n_k``), no window."""
    k = np.full(B, case.sizes["n_k"], dtype=np.int64)
    for part in mask_kinds.conjuncts(case.mask):
        lengths = mask_kinds.key_lengths(part)
        if part["kind"] == "query_padding" or mask_kinds.of(part).every_pair:
            continue
        if lengths is None:
            return (
                "a varlen call aligns causal / window masks within each sequence; the ragged "
                "batch's mask aligns them to n_q, n_k"
            )
        lengths = np.asarray(lengths).reshape(-1)
        if lengths.shape[0] != B:
            return "padding lengths per head are not sequence lengths"
        k = np.minimum(k, lengths.astype(np.int64))
    return Sequences(np.asarray(case.q_seqlens, dtype=np.int64), k, (-1, -1))


def window_of(case: Case) -> tuple[int, int] | str:
    """A mask of key lengths is the lengths (no window); else the flash convention's."""
    if mask_kinds.key_lengths(case.mask) is not None:
        return (-1, -1)
    return flash_window(case)


def flash_kwargs(case: Case, device: str, window: tuple[int, int] | None = None):
    left, right = window or window_of(case)  # type: ignore[misc]
    kwargs: dict[str, Any] = {
        "softmax_scale": case.c(),
        "causal": right == 0 and left == -1,
        "window_size": (left, right),
    }
    if case.softcap is not None:
        kwargs["softcap"] = case.softcap
    if case.bias is not None:
        import torch

        slopes = np.asarray(case.score["slopes"], dtype=np.float32)
        kwargs["alibi_slopes"] = torch.from_numpy(slopes).to(device)
    return kwargs


def to_bnhd(held: dict[str, np.ndarray], B: int) -> dict[str, np.ndarray]:
    return {x: held[x].reshape((B, -1, *held[x].shape[-2:])).transpose(0, 2, 1, 3) for x in "qkv"}


class FlashBase(Convention):
    """What flash-attn's packed conventions share: the masks they express."""

    def unsupported(self, target, case, device, grads):
        window = window_of(case)
        if isinstance(window, str):
            return window
        B, _ = lift(case.batch)
        reason = key_lengths(case, B)[1]
        if reason is None and case.bias is not None:
            if mask_kinds.key_lengths(case.mask) is not None:
                return (
                    "flash-attn aligns ALiBi to each sequence's own key length; the padded "
                    "case aligns it to n_k"
                )
            return flash_alibi(case)
        return reason


class FlashVarlen(FlashBase):
    """flash-attn's varlen call: only each sequence's real queries and keys are packed
    (``cu_seqlens_q``, ``cu_seqlens_k`` from the lengths of :func:`sequences`); the outputs
    come back in place and the padded rows get what the case defines for them, rows with no
    allowed key: ``Y = 0``, ``lse = −∞``, ``dQ = 0`` (the padded keys' ``dK = dV = 0``)."""

    name = "flash-varlen"
    reads = ("seqlens",)
    ragged = True  # cu_seqlens_q: each sequence's real query rows ...
    expresses = ("query_padding",)  # ... are its query padding

    def unsupported(self, target, case, device, grads):
        if case.seqlens is None and case.q_seqlens is None:
            return super().unsupported(target, case, device, grads)
        layout = sequences(case, lift(case.batch)[0])
        if isinstance(layout, str):
            return layout
        if case.bias is not None:
            return (
                "flash-attn aligns ALiBi to each sequence's own lengths; the varlen case "
                "aligns it to n_q, n_k"
            )
        return None

    def run(self, target, case, held, device, grads):
        import torch

        fn = target.load()
        B, H = lift(case.batch)
        n = case.sizes
        bnhd = to_bnhd(held, B)
        bnhd["g"] = four_g(held, B).transpose(0, 2, 1, 3)
        layout = sequences(case, B)
        assert not isinstance(layout, str)  # unsupported() said so
        lengths = {"q": layout.q, "k": layout.k, "v": layout.k, "g": layout.q}
        packed = {x: np.concatenate([bnhd[x][b, : lengths[x][b]] for b in range(B)]) for x in bnhd}
        views = [tensor(packed[x], case.dtype, device, case.layout, grads) for x in "qkv"]
        cu = {x: torch.tensor(Sequences.offsets(lengths[x]), dtype=torch.int32) for x in "qk"}
        want_lse = target.caps.lse is True
        result = fn(
            *views,
            cu["q"].to(device),
            cu["k"].to(device),
            int(layout.q.max(initial=0)),
            int(layout.k.max(initial=0)),
            return_attn_probs=want_lse,
            **flash_kwargs(case, device, layout.window),
        )
        y = result[0] if isinstance(result, (tuple, list)) else result

        def unpacked(flat: np.ndarray, x: str, fill: float) -> np.ndarray:
            """``(total, H, ·)`` back to ``(B, n, H, ·)``, ``fill`` past each length."""
            back = np.full(bnhd[x].shape[:2] + flat.shape[1:], fill)
            starts = Sequences.offsets(lengths[x])
            for b in range(B):
                back[b, : lengths[x][b]] = flat[starts[b] : starts[b + 1]]
            return back

        total_q = packed["q"].shape[0]
        dense_y = unpacked(to_numpy("y", y, (total_q, H, n["v"])), "q", 0.0)
        out = {"y": dense_y.transpose(0, 2, 1, 3).reshape(held["g"].shape), "_dtype": dtype_name(y)}
        if want_lse:
            lse = to_numpy("lse", result[1], (H, total_q)).T[..., None]
            lse = unpacked(lse, "q", -np.inf)[..., 0]  # (B, n_q, H)
            out["lse"] = lse.transpose(0, 2, 1).reshape(held["g"].shape[:-1])
        if grads:
            dq, dk, dv = autograd(y, views, packed["g"].copy(), case.dtype, device)
            for name, grad, x in (("dq", dq, "q"), ("dk", dk, "k"), ("dv", dv, "v")):
                back = unpacked(to_numpy(name, grad, packed[x].shape), x, 0.0)
                out[name] = back.transpose(0, 2, 1, 3).reshape(held[x].shape)
        return out


def paged(x: np.ndarray, pages: dict[str, Any]) -> np.ndarray:
    """The keys (or values) ``x`` ``(B, n_k, ·)`` in the paged cache ``pages``
    (:mod:`exactattn.cases.interface_fields`): ``(pool, size, ·)``, key ``t`` of sequence
    ``b`` at row ``t mod P`` of page ``table[b][t // P]``; pages no sequence reads are 0."""
    size, table = pages["size"], np.asarray(pages["table"])
    cache = np.zeros((pages["pool"], size, *x.shape[2:]))
    for b in range(x.shape[0]):  # a shared page is written by each sequence with the same keys
        for t in range(x.shape[1]):
            cache[table[b, t // size], t % size] = x[b, t]
    return cache


def paged_caches(case: Case, bnhd: dict[str, np.ndarray], pages: dict[str, Any], device: str):
    """The keys and values in the case's paged cache ``(pool, P, H_kv, ·)`` (NHD, :func:`paged`)
    as tensors of the case's dtype on ``device``."""
    return {x: tensor(paged(bnhd[x], pages), case.dtype, device, "contiguous", False) for x in "kv"}


def partials(case: Case, held: dict[str, np.ndarray], edges: list[int]) -> list[tuple[Any, Any]]:
    """The case's keys in the contiguous parts between ``edges``, each part's ``(y_t,
    lse_t)`` in float64 (``(*batch, n_q, v)``, ``(*batch, n_q)``): rows with no key in a part
    (an empty part included) are ``(0, −∞)``."""
    from .. import api

    out = []
    for start, stop in itertools.pairwise(edges):
        y, stats = api.attention(
            held["q"],
            held["k"],
            held["v"],
            scale=case.c(),
            mask=case.allowed(),
            bias=held.get("bias"),
            softcap=case.softcap,
            enable_gqa=case.group > 1,
            key_range=(int(start), int(stop)),
            check_finite=False,
            return_stats=True,
        )
        out.append((y, stats.lse))
    return out


class MergeBase(Convention):
    """A merge of split-KV partials; subclasses lay them out and call the target."""

    reads = ("seqlens", "splits")

    def unsupported(self, target, case, device, grads):
        if case.dropout_p:
            return "a merge of partials has no dropout of its own"
        if case.score_mod is not None:
            return "the partials are computed with the library's masks and bias only"
        return None

    def run(self, target, case, held, device, grads):
        import torch

        B, H = lift(case.batch)
        n = case.sizes
        parts = partials(case, held, InterfaceDraw.edges(case))
        ys = np.stack([y.reshape(B, H, n["n_q"], n["v"]) for y, _ in parts])
        lses = np.stack([lse.reshape(B, H, n["n_q"]) for _, lse in parts])
        dtype = getattr(torch, case.dtype)
        y, lse = self.merge(
            target.load(),
            torch.from_numpy(ys).to(dtype).to(device),
            torch.from_numpy(lses).float().to(device),
        )
        out = {"y": to_numpy("y", y, (B, H, n["n_q"], n["v"])), "_dtype": dtype_name(y)}
        out["y"] = out["y"].reshape(held["g"].shape)
        if target.caps.lse is True:
            out["lse"] = to_numpy("lse", lse, (B, H, n["n_q"])).reshape(held["g"].shape[:-1])
        return out

    def merge(self, fn, ys, lses):
        """``(y (B, H, n, v), lse (B, H, n))`` of ``ys (S, B, H, n, v)``, ``lses (S, B, H, n)``."""
        raise NotImplementedError


class Fa4Combine(MergeBase):
    name = "fa4-combine"

    def merge(self, fn, ys, lses):
        y, lse = fn(ys.permute(0, 1, 3, 2, 4), lses.permute(0, 1, 3, 2))
        return y.permute(0, 2, 1, 3), lse.permute(0, 2, 1)


class XformersMerge(MergeBase):
    name = "xformers-merge"

    def merge(self, fn, ys, lses):
        y, lse = fn(ys.permute(0, 1, 3, 2, 4), lses)
        return y.permute(0, 2, 1, 3), lse


class Sinks(Convention):
    """A sink-capable attention ``fn(q, k, v, *, sinks, scale, mask, bias, softcap,
    enable_gqa, empty_rows) -> (y, lse)`` on ``(B, H, n, ·)`` tensors, as
    :func:`exactattn.torch.attention_with_lse` (FA4's ``learnable_sink``, gpt-oss).

    The case's maths has no sink, so the convention gives the target one and takes it out
    again: ``σ_h = δ_h + min_{b,i} lse_{b,h,i}`` with the case's sink offset ``δ_h``
    (:mod:`exactattn.cases.interface_fields`; −2 for a case without the field) and the lse of a
    float64 run; the target's ``(y, lse)`` give the case's as
    ``y·(1 + e^{σ−lse₆₄})`` (``lse₆₄`` from that float64 run: the target's rounded lse would
    move the factor by ``u·|lse|``) and ``lse + log(1 − e^{σ−lse})`` with the target's lse.
    A sink in the numerator, a sink missing from the lse or the wrong head's sink leave an
    error of order ``p_σ``.

    The case's bound has no sink term, so the sink's own rounding is charged as a radius on
    each output (the judge adds it to the bound): :func:`exactattn.error.bounds.sink_bounds` in the
    claim's statistics format, with the float64 run's ``(y, lse)`` and row maxima ``m``, and
    the sink carried through the claimed number of key blocks (one key per block when the
    claim states none), carried to the case's scale: both outputs' errors are multiplied by
    ``1 + e^{σ−lse}`` (``y`` by the rescale; ``lse`` by ``1/(1 − p_σ)``, ``p_σ = e^{σ−lse_σ}``
    the sink's weight in the target's row, which is that factor). To first order the
    target's own sink-free error comes back unchanged (the rescale undoes the sink's
    damping).
    """

    name = "exactattn-sinks"
    reads = ("sinks",)

    def unsupported(self, target, case, device, grads):
        if case.dropout_p or case.score_mod is not None:
            return "the sink convention runs without dropout and user score_mods"
        return None

    def run(self, target, case, held, device, grads):
        import torch

        from .. import api

        fn = target.load()
        B, H = lift(case.batch)
        n = case.sizes
        four = {x: held[x].reshape((B, -1, *held[x].shape[-2:])) for x in "qkv"}
        allowed = case.allowed().reshape((*lift(case.batch), n["n_q"], n["n_k"]))
        bias4 = case.lifted_bias(held["bias"]) if "bias" in held else None
        keywords = dict(
            scale=case.c(),
            mask=allowed,
            bias=bias4,
            softcap=case.softcap,
            enable_gqa=case.group > 1,
            empty_rows="zero",
        )
        y64, stats = api.attention(
            *four.values(), return_stats=True, check_finite=False, **keywords
        )
        finite = np.where(np.isneginf(stats.lse), np.inf, stats.lse)
        offsets = np.full(H, -2.0) if case.sinks is None else np.asarray(case.sinks, np.float64)
        sigma = np.nan_to_num(finite.min(axis=(0, 2)), posinf=0.0) + offsets  # (H,)
        sinks = torch.from_numpy(sigma).to(getattr(torch, case.dtype))
        sigma = sinks.double().numpy()  # the sink as the target holds it
        views = [tensor(four[x], case.dtype, device, case.layout, False) for x in "qkv"]
        as_tensor = {"mask": torch.from_numpy(allowed.copy()).to(device)}
        if bias4 is not None:
            as_tensor["bias"] = torch.from_numpy(bias4.copy()).to(getattr(torch, case.dtype))
        sinks = sinks.to(device).requires_grad_(grads)
        y, lse = fn(*views, sinks=sinks, **{**keywords, **as_tensor})
        y_np = to_numpy("y", y, (B, H, n["n_q"], n["v"]))
        lse_np = to_numpy("lse", lse, (B, H, n["n_q"]))
        lse64 = stats.lse.reshape(lse_np.shape)
        empty = np.isneginf(lse64)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # y: through the float64 lse (the target's, rounded, would move p_σ by u·|lse|);
            # a row with no key is all sink: Y_σ = 0 is the case's Y = 0 itself
            rescale = np.where(empty, 1.0, 1 + np.exp(sigma[None, :, None] - lse64))
            y_case = y_np * rescale[..., None]
            p_sink = np.exp(sigma[None, :, None] - lse_np)  # the target's own lse, judged
            # ... and its lse_σ = σ is the case's −∞ (anything else, NaN included: +∞, a fail)
            lse_case = np.where(
                empty,
                np.where(lse_np == sigma[None, :, None], -np.inf, np.inf),
                lse_np + np.log1p(-p_sink),
            )
        radius = _sink_radius(target, case, held, y64, stats, sigma)
        out = {"y": (y_case.reshape(held["g"].shape), radius["y"].reshape(held["g"].shape))}
        out["_dtype"] = dtype_name(y)
        if target.caps.lse is True:
            lse_radius = radius["lse"].reshape(held["g"].shape[:-1])
            out["lse"] = (lse_case.reshape(held["g"].shape[:-1]), lse_radius)
        if grads:
            out["_derived"] = {"dsinks": _dsinks(y, sinks, case, held, sigma, radius)}
        return out


def _dsinks(y, sinks, case: Case, held, sigma, radius) -> tuple[np.ndarray, Any]:
    """The target's ``dσ`` of ``L = Σ G∘Y_σ`` (``sinks`` passed with ``requires_grad``;
    none: a constant sink, 0) and the function of the certified reference that gives its
    exact value and allowed error (:func:`dsinks_reference`; the judge calls it with the
    case's :class:`~exactattn.cases.exact.Reference`)."""
    import torch

    from ..backends.formats import number_format

    grad = None
    B = lift(case.batch)[0]
    upstream = torch.from_numpy(four_g(held, B).copy()).to(y.dtype)
    if sinks.requires_grad and y.requires_grad:
        (grad,) = torch.autograd.grad(y, [sinks], upstream.to(y.device), allow_unused=True)
    got = np.zeros(sigma.shape) if grad is None else to_numpy("dsinks", grad, sigma.shape)
    g = upstream.double().numpy()  # G as the target received it, (B, H, n_q, v)
    shape = g.shape
    kernel = {  # the sink run's claimed bounds, on the case's scale (:func:`_sink_radius`)
        "y": radius["free_y"].reshape(shape) + radius["y"].reshape(shape),
        "lse": radius["free_lse"].reshape(shape[:-1]) + radius["lse"].reshape(shape[:-1]),
    }
    out_format = number_format(case.dtype)

    def derive(ref: Any) -> tuple[np.ndarray, np.ndarray] | str:
        return dsinks_reference(ref, g, sigma, kernel, radius["u"], out_format)

    return got, derive


def dsinks_reference(
    ref: Any, g: np.ndarray, sigma: np.ndarray, kernel: dict[str, np.ndarray], u: float, out
) -> tuple[np.ndarray, np.ndarray] | str:
    """The exact ``dσ_h`` of a sink run from the case's certified (sink-free) reference, and
    the error a kernel of the claimed arithmetic is allowed (or why none can be derived).

    With the sink ``σ_h`` (as the target holds it) row ``i`` gives the sink the weight
    ``p_i = 1/(1 + e^{lse_i − σ_h})`` and the keys ``q_i = 1 − p_i = 1/(1 + e^{σ_h − lse_i})``
    (``lse`` the sink-free one), so ``Y_σ = q·Y``, ``∂q/∂σ = −p·q`` and
    ``dσ_h = −Σ_{b,i} w_i·t_i`` with ``w = p·q`` and ``t_i = G_i·Y_i``; a row with no key
    (``lse = −∞``: ``w = 0``) adds 0. ``Y``, ``lse`` are the reference's ``near`` values,
    within its radii ``r_y``, ``r_l``; ``σ`` and ``G`` are exact (float64 copies of what the
    target held). Nothing here calls exactattn's attention.

    **Reference part (rigorous).** ``d ln w / d lse = p − q ∈ [−1, 1]``, so ``w`` at the
    exact ``lse`` is within a factor ``e^{±r_l}`` of ``w`` at the midpoint, and ``t`` within
    ``T_r = Σ_c |G_c|·r_y,c``: ``|w*t* − w·t| ≤ w·((e^{r_l} − 1)·|t| + e^{r_l}·T_r)``, summed
    over the rows. The float64 evaluation of ``w`` and ``t`` and the sum is charged
    ``(v + N + 16 + 2|σ − lse|)·2^-53·Σ w·Σ_c|G_c·Y_c|`` (``N = B·n_q`` terms; the argument
    of each exp rounded, numpy's exp taken to be within 2 ulps: that is assumed, not
    proved), and the bound's own float64 rounding by a factor ``1 + 2^-40``.

    **Kernel part (first order, not rigorous).** A kernel holding ``Y_σ`` within
    ``E^y_σ = q·E^y`` and ``lse_σ`` within ``E^l_σ = q·E^l`` (``E^y``, ``E^l``: the claimed
    arithmetic's sink-free bounds plus the sink's own, on the case's scale; ``∂lse_σ/∂lse =
    q``), forming ``p_σ = e^{σ − lse_σ} = p`` and ``δ_i = G_i·Y_σ,i`` in unit roundoff ``u``
    and summing ``N`` terms, its result rounded to the sink's format (``u_o``, ``μ_o`` half
    its subnormal spacing), is allowed ``Σ_i w_i·(Σ_c |G_ic|·E^y_ic + (e^{q_i·E^l_i} − 1 +
    (v + N + 3)·u)·Σ_c |G_ic|·(|Y_ic| + r_y,ic)) + u_o·|dσ_h| + μ_o``, charged twice for the
    second-order terms it leaves out."""
    if "lse" not in ref.names or "y" not in ref.names:
        return "dsinks: the certified reference holds no y and lse for this case"
    shape = g.shape
    y, r_y = ref.near["y"].reshape(shape), ref.rad["y"].reshape(shape)
    lse, r_l = ref.near["lse"].reshape(shape[:-1]), ref.rad["lse"].reshape(shape[:-1])
    s = sigma[None, :, None]
    empty = np.isneginf(lse)  # exactly the rows with no allowed key (the reference says so)
    with np.errstate(over="ignore", invalid="ignore"):
        p = 1 / (1 + np.exp(np.where(empty, -np.inf, lse - s)))
        q = 1 / (1 + np.exp(np.where(empty, np.inf, s - lse)))
        w = np.where(empty, 0.0, p * q)
        x = np.where(empty, 0.0, np.abs(s - lse))
    r_l = np.where(empty, 0.0, r_l)
    t = np.sum(g * y, axis=-1)
    exact = -(w * t).sum(axis=(0, 2))
    n_terms = shape[0] * shape[2]
    gy = np.sum(np.abs(g) * (np.abs(y) + r_y), axis=-1)
    reference = w * (np.expm1(r_l) * np.abs(t) + np.exp(r_l) * np.sum(np.abs(g) * r_y, axis=-1))
    reference = reference + (shape[-1] + n_terms + 16 + 2 * x) * 2.0**-53 * w * gy
    e_y, e_l = kernel["y"], np.where(empty, 0.0, kernel["lse"])
    per_row = (
        np.sum(np.abs(g) * e_y, axis=-1) + (np.expm1(q * e_l) + (shape[-1] + n_terms + 3) * u) * gy
    )
    claimed = (w * per_row).sum(axis=(0, 2)) + out.u * np.abs(exact) + out.mu
    limit = (reference.sum(axis=(0, 2)) + 2 * claimed) * (1 + 2.0**-40)
    return exact, limit


def _sink_radius(target: Any, case: Case, held, y64, stats, sigma) -> dict[str, np.ndarray]:
    """:func:`exactattn.error.bounds.sink_bounds` of the target's stated claim on the case (its
    compute format; ``steps``: the claimed key blocks + 1; the sink-free pass's lse bound,
    :func:`exactattn.error.bounds.bounds` in the claimed arithmetic), on the case's scale;
    and for :func:`dsinks_reference` the claim's sink-free bounds ``free_y``, ``free_lse``
    and its compute unit roundoff ``u``."""
    from ..error.bounds import bounds, sink_bounds

    claim, n_k = target.claim.resolve(case.dtype), case.sizes["n_k"]
    block = claim.bound_block(n_k)
    arith = claim.arith(block)
    u = arith.compute.u
    blocks = n_k if block is None else -(-n_k // max(block, 1))
    free = bounds(
        arith, held["q"], held["k"], held["v"], None,
        scale=case.scale, allowed=case.allowed(), bias=held.get("bias"), softcap=case.softcap,
        enable_gqa=case.group > 1,
    )  # fmt: skip
    lse = np.asarray(stats.lse, dtype=np.float64)
    bound = sink_bounds(
        y64, lse, sigma, u, steps=max(1, blocks) + 1, m=stats.m,
        lse_error=free["lse"].reshape(lse.shape),
    )  # fmt: skip
    empty = np.isneginf(lse)
    with np.errstate(over="ignore", invalid="ignore"):
        grow = 1 + np.where(empty, 0.0, np.exp(sigma[None, :, None] - np.where(empty, 0.0, lse)))
    return {
        "y": np.where(empty[..., None], 0.0, bound["y"] * grow[..., None]),
        "lse": np.where(empty, 0.0, bound["lse"] * grow),
        # for dsinks (dsinks_reference): the claimed sink-free bounds, the compute unit roundoff
        "free_y": free["y"],
        "free_lse": free["lse"],
        "u": u,
    }
