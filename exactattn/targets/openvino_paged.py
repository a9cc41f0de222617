"""OpenVINO's ``PagedAttentionExtension`` on its CPU plugin as the target ``openvino-paged``.

The op (``openvino.op._PagedAttentionExtension``, the one optimum-intel / openvino.genai
models hold after the SDPA-to-PagedAttention transformation) takes 28 inputs in 2026.4
(``src/core/src/op/paged_attention.cpp``, ``validate_and_infer_types``): ``query, key,
value`` ``(tokens, heads·d)`` of the new tokens, ``key_cache, value_cache``, ``past_lens``
(tokens already cached per sequence), ``subsequence_begins`` (the new tokens' offsets),
``block_indices`` / ``block_indices_begins`` (the block table, flattened), ``scale``,
``sliding_window``, ``alibi_slopes``, ``max_context_len``, then the optional features
(score aggregation, cache rotation, XAttention, sinks, adaptive R-KV, token types, a
query-query bias) given empty here, as the plugin's own functional test
(``paged_attn_token_type.cpp``, ``PrepareModel``) gives them — except
``score_aggregation_window``, which that test gives as a scalar 0: the CPU plugin reads a
scalar as one value where it expects one per sequence (``plain_tensor.hpp:523:
m_dims=[1,] expect_dims=[2,]`` for two sequences), and takes an empty one. The model is
that op alone, compiled on ``"CPU"`` with f32 inference and KV-cache precision.

What the plugin does with it (measured, OpenVINO 2026.4): the caches become ``(blocks,
kv_heads, 32, d)``, token-major for keys and values, whatever the parameters' shapes say
(the compiled model's ``key_cache`` input is ``[?, kv_heads, 32, d]``); each sequence's new
tokens are written into its blocks after its ``past_lens[b]`` cached ones, and query ``t``
of sequence ``b`` (position ``past_lens[b] + t``) attends the keys ``j ≤ past_lens[b] + t``:
causal, aligned to the sequence's end (bottom-right).

The ``openvino-paged`` convention (:class:`OpenvinoPaged`) places a case in it: sequence
``b``'s length ``ℓ_b`` is ``n_k`` or its key length (:func:`.interface_conventions.key_lengths`),
its last ``n_q`` keys are the new tokens and the ``ℓ_b − n_q`` before them the cache, laid
out by :func:`.interface_conventions.paged` in the case's page order
(:meth:`.interface_conventions.InterfaceDraw.pages`) with the plugin's page size: the
table of :func:`~exactattn.cases.interface_fields.fill_pages` for 32-key pages, seeded by the
case's table (the case's own page size cannot be honoured). The case's mask must be that
attention (its allowed set equal to ``j ≤ i + ℓ_b − n_q``, ``j < ℓ_b``: a bottom-right
causal mask, or any padding with one query); other cases are skipped. Forward only (an
inference graph).

The claim: float32 throughout with the key-block size unstated (the kernel's blocking over
the 32-key pages is not read here: the bound assumes the worst case).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..cases import interface_fields
from ..infra.optional import needs
from .conventions import Convention, TargetError, lift
from .interface_conventions import InterfaceDraw, key_lengths, paged
from .target import Capabilities, Claim, Options, Target

NOT_PAGED = (
    "PagedAttention attends causally from each sequence's end (j <= i + len - n_q, j < len, "
    "len >= n_q): the case's mask is not that"
)
OPTIONAL = (  # inputs 13..27 as empty or zero constants: (dtype, shape, value)
    ("int32", (0,), None), ("int32", (0,), None), ("int32", (0,), None), ("float32", (0,), None),
    ("float32", (0,), None), ("int32", (), 0), ("int32", (), 8), ("float32", (0,), None),
    ("int32", (), 0), ("int32", (0,), None), ("int32", (0,), None), ("int32", (0,), None),
    ("int32", (0,), None), ("uint8", (0,), None), ("int32", (0,), None),
)  # fmt: skip
INPUTS = ("q", "k", "v", "key_cache", "value_cache", "past_lens", "subsequence_begins")
INPUTS += ("block_indices", "block_indices_begins")


@functools.lru_cache(maxsize=32)
def _compiled(heads: int, kv_heads: int, d: int, v: int, scale: float, max_context: int) -> Any:
    """The compiled one-op model for these head counts and dims."""
    with needs("the openvino-paged target"):
        import openvino as ov
        import openvino.opset13 as ops
        from openvino import op
    f32, i32 = ov.Type.f32, ov.Type.i32
    shapes = ([-1, heads * d], [-1, kv_heads * d], [-1, kv_heads * v], [-1] * 4, [-1] * 4)
    params = [ops.parameter(s, f32, name=n) for s, n in zip(shapes, INPUTS)]
    params += [ops.parameter([-1], i32, name=n) for n in INPUTS[5:]]

    def constant(dtype: str, shape: tuple, value: Any) -> Any:
        return ops.constant(np.full(shape, 0 if value is None else value, dtype=dtype))

    fixed = [("float32", (), scale), ("int32", (), 0), ("float32", (0,), None)]
    fixed += [("int32", (), max_context), *OPTIONAL]
    args = [p.output(0) for p in params] + [constant(*c).output(0) for c in fixed]
    node = op._PagedAttentionExtension(args)
    for name, value in (("num_k_heads", kv_heads), ("k_head_size", d)):
        node.get_rt_info()[name] = value
    for name, value in (("num_v_heads", kv_heads), ("v_head_size", v)):
        node.get_rt_info()[name] = value
    model = ov.Model([node.output(0)], params, "exactattn_paged")
    config = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    return ov.Core().compile_model(model, "CPU", config)


def block_size(heads: int, kv_heads: int, d: int, v: int, scale: float) -> int:
    """The page size the plugin fixed for the key cache (its compiled input's dim 2)."""
    compiled = _compiled(heads, kv_heads, d, v, scale, 1)
    return int(compiled.input(3).get_partial_shape()[2].get_length())


def attention(
    q, k, v, key_cache, value_cache, past_lens, subsequence_begins, block_indices,
    block_indices_begins, *, heads: int, kv_heads: int, scale: float,
) -> np.ndarray:  # fmt: skip
    """The op on NumPy arrays (its inputs 0–8, float32 and int32): ``(tokens, heads·v)``."""
    d, v_dim = q.shape[1] // heads, v.shape[1] // kv_heads
    max_context = int(np.max(past_lens + np.diff(subsequence_begins), initial=1))
    compiled = _compiled(heads, kv_heads, d, v_dim, float(scale), max_context)
    feeds = [q, k, v, key_cache, value_cache, past_lens, subsequence_begins, block_indices]
    feeds.append(block_indices_begins)
    dtypes = (np.float32,) * 5 + (np.int32,) * 4
    return np.asarray(compiled([np.ascontiguousarray(x, t) for x, t in zip(feeds, dtypes)])[0])


class OpenvinoPaged(Convention):
    """A case through the op's inputs (see the module docstring)."""

    name = "openvino-paged"
    reads = ("seqlens", "pages")

    def unsupported(self, target, case, device, grads):
        if case.dropout_p or case.modified:
            return "the openvino-paged convention runs no dropout, bias or soft-cap"
        B, _ = lift(case.batch)
        lengths, reason = key_lengths(case, B)
        if reason is not None:
            return reason
        n_q, n_k = case.sizes["n_q"], case.sizes["n_k"]
        if lengths.min(initial=n_q) < n_q:
            return NOT_PAGED
        i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
        ends = lengths.reshape(B, 1, 1, 1)
        allowed = (j <= i + ends - n_q) & (j < ends)
        if not (case.allowed().reshape((B, -1, n_q, n_k)) == allowed).all():
            return NOT_PAGED
        return None

    def run(self, target, case, held, device, grads):
        fn = target.load()
        B, H = lift(case.batch)
        n = case.sizes
        n_q = n["n_q"]
        bnhd = {
            x: held[x].reshape((B, -1, *held[x].shape[-2:])).transpose(0, 2, 1, 3) for x in "qkv"
        }  # (B, n, heads, ·)
        kv_heads = bnhd["k"].shape[2]
        lengths, _ = key_lengths(case, B)
        size = block_size(H, kv_heads, n["d"], n["v"], case.c())
        drawn = InterfaceDraw.pages(case, B)
        seed = int(np.asarray(drawn["table"]).sum())  # the case's page order, 32-key pages
        pages = interface_fields.fill_pages(size, 0, seed, B, n["n_k"])
        table = np.asarray(pages["table"])
        caches = {x: paged(bnhd[x], pages).transpose(0, 2, 1, 3) for x in "kv"}  # (pool, h, P, ·)
        new = {
            x: np.concatenate([bnhd[x][b, lengths[b] - n_q : lengths[b]] for b in range(B)])
            for x in "kv"
        }  # the last n_q keys of each sequence: (B·n_q, kv_heads, ·)
        y = fn(
            bnhd["q"].reshape(B * n_q, -1),
            new["k"].reshape(B * n_q, -1),
            new["v"].reshape(B * n_q, -1),
            caches["k"],
            caches["v"],
            (lengths - n_q).astype(np.int32),
            np.arange(B + 1, dtype=np.int32) * n_q,
            table.reshape(-1).astype(np.int32),
            np.arange(B + 1, dtype=np.int32) * table.shape[1],
            heads=H,
            kv_heads=kv_heads,
            scale=case.c(),
        )
        expected = (B * n_q, H * n["v"])
        if getattr(y, "shape", None) != expected:
            raise TargetError(f"y has shape {getattr(y, 'shape', None)}; expected {expected}")
        dense = np.asarray(y, dtype=np.float64).reshape(B, n_q, H, n["v"]).transpose(0, 2, 1, 3)
        return {"y": dense.reshape(held["g"].shape), "_dtype": str(y.dtype)}


def entries() -> list[Target]:
    """The ``openvino-paged`` target."""
    caps = Capabilities(
        dtypes=("float32",),
        grads="a compiled OpenVINO model has no gradient",
        dropout="PagedAttention has no dropout",
        empty_rows="every query attends its own key in PagedAttention",
    )
    return [
        Target(
            name="openvino-paged",
            convention="openvino-paged",
            loader=lambda: attention,
            caps=caps,
            claim=Claim(input="float32", block=None),
            description="openvino.op._PagedAttentionExtension on the CPU plugin (f32 hint)",
            requires=("openvino",),
            options=Options(),
        )
    ]
