"""ONNX Runtime's KV-cache paths as built-in targets: the standard ``Attention`` with
``past_key`` / ``past_value`` (``ort-attention-kvcache``) and ``com.microsoft``'s
``GroupQueryAttention`` (``ort-gqa``), as the CPU provider runs them.

``ort-attention`` (:mod:`.onnx_attention`) already covers the operator without a cache
(``is_causal``, ``scale``, boolean and float ``attn_mask``, GQA as 4-D ``K, V`` with fewer
heads; one kernel for opsets 23 and 24). What it leaves out and these targets take: the
cache (``present_key = Concat(past_key, K)`` along the sequence axis, ``Y`` over all
``past + new`` keys), the ``softcap`` attribute, and GroupQueryAttention's ``seqlens_k``,
``local_window_size`` and head-dim rules. Both are called through their calling conventions
(:class:`~exactattn.targets.onnx_conventions.OnnxKvcache`,
:class:`~exactattn.targets.onnx_conventions.OrtGqa`): NumPy arrays in the case's dtype,
outputs with the present caches, which the convention checks equal the concatenation of the
case's keys and values bit for bit (a mismatch fails the case).

What the sources say (ONNX Runtime 1.31.1, build ``6af1a93``; ``microsoft/onnxruntime``:
``core/providers/cpu/llm/attention.cc`` at ``025a43f``, ``contrib_ops/cpu/bert/
gqa_attention_base.h`` as stored by the code index; onnx ``onnx/defs/nn/old.cc`` at
``onnx/onnx@f754691``); each was measured on the binary
(``tests/check/test_zoo_onnx_kvcache.py``):

* ``Attention`` with a past (``AttentionBase<T>::ComputeAttentionProbs``,
  ``ConcatStateChunk``): the present caches are ``memcpy`` of the past chunk then the new
  one, per (batch, kv head): exact. ``is_causal`` masks ``t > past_sequence_length + s``
  (the causal overlay loops of ``ComputeAttentionProbs``): query ``i`` sees keys ``j ≤ i +
  P`` with ``P`` the past length, as the Attention-23 schema's ``is_causal`` doc says
  (``onnx/defs/nn/old.cc``, ``Attention_ver23_doc``: "query ``i`` attends key ``j`` iff ``j <=
  i + past_sequence_length``"). That is the case model's causal mask with offset ``o = P``:
  top-left (``o = 0``) without a past, bottom-right (``o = n_k − n_q``) with ``P = n_k −
  n_q`` past keys and the ``n_q`` newest keys as ``K``; a bottom-right mask with ``n_q >
  n_k`` (``o < 0``) is no past and is not drawn. One exception, a deviation:
  ``ComputeAttentionProbs`` skips the causal mask when ``q_sequence_length == 1 &&
  past_sequence_length > 0`` ("the common decode case"), which is the definition only when
  ``K`` holds one new key; with one query and ``L > 1`` new keys the query sees all ``P + L``
  keys where the schema allows ``P + 1`` (``docs/zoo/onnx_causal_decode_skip.py``). The case
  model cannot ask for that offset (``P`` is neither 0 nor ``n_k − 1``), so no case reaches
  it. ``kv_sequence_length`` must be ``> 0`` (``AttentionParameters::checkParameters``): the
  new part holds at least one key.
* ``softcap`` (``Attention<T>::Compute`` → ``ComputeAttentionProbs``): ``cap·tanh(s/cap)``
  after ``scale·QKᵀ`` and before the mask (``AddInPlace``), the case model's order; float32 by
  ``MlasComputeSoftcap``, float16 by ``std::tanh`` on the fp16 score converted to float,
  rounded to fp16 (``ComputeAttentionSoftcapInplace<MLFloat16>``). The arithmetic is
  ``ort-attention``'s otherwise (:data:`~.onnx_attention.ORT_CLAIMS`: float32 throughout;
  float16 scores and ``p``, fp32 statistics and accumulators; ``block=0``).
* ``GroupQueryAttention`` (``GQAAttentionBase::ApplyAttention``, its fused loop): per batch
  ``b`` the total length is ``seqlens_k[b] + 1`` and the past ``seqlens_k[b] + 1 − S``
  (``S`` the new rows; a first prompt, ``S == total_sequence_length``, has no past); query
  ``s`` sees keys ``t < P_b + s + 1`` (bottom-right at its own sequence's length), and with
  ``local_window_size = w ≥ 0`` only the last ``w`` of them, the diagonal included
  (``start_offset = seq_causal_length − local_window_size_``; measured: ``w = 1`` is the
  diagonal alone, ``w = 0`` no key and a zero row): the case model's window ``left = w − 1,
  right = 0``. The new ``K, V`` have ``S`` rows (``kv_input_chunk_length = sequence_length ·
  head_size``), so a case maps onto it when it is causal bottom-right (or square) with
  ``n_q ≤ n_k``, optionally windowed, or has one query row and key lengths ``ℓ_b ≥ 1``
  (key padding as ``seqlens_k = ℓ_b − 1``: the pasts right-padded in one static cache; its
  unused slots hold NaN, which a read of them would show; the kernel's check takes a cache
  of ``total_sequence_length`` or more rows, or exactly ``total_sequence_length − S``). The
  present caches are ``ConcatStateChunkGQA`` copies of ``P_b`` past rows and the new ones
  into a zeroed buffer of ``max(total_sequence_length, cache)`` rows. Its check
  (``group_query_attention_helper.h``) refuses a head size that is not a multiple of 8; the
  convention pads ``d`` and ``v`` with zero columns to one multiple of 8 (``q·k`` and ``P·V``
  unchanged: the added products are exact zeros) and then passes the scale, since the
  kernel's default ``1/√head_size`` would read the padded size.
* GroupQueryAttention's arithmetic: float32 by MLAS SGEMM (``scale`` as ``alpha``), the
  soft-cap, ``MlasComputeSoftmax``, SGEMM for ``P·V``: ``block=0``. float16 on x86
  (``MlasGQASupported<MLFloat16>`` false: no fp16 GEMM) takes the "fp16 input, fp32
  accumulation" branch: ``Q, K, V`` converted to fp32, scores, softmax and ``P`` in fp32,
  the output rounded to fp16 once (``MlasConvertFloatToHalfBuffer``): a float32 claim on
  fp16 inputs. The CPU provider registers float and MLFloat16 only: bfloat16 is
  ``NotImplemented`` (a refusal), float64 an invalid model (not drawn).
* Neither has a backward (inference kernels) nor dropout; ``GroupQueryAttention``'s
  ``attention_bias``, ``head_sink``, rotary and packed-QKV inputs are not exercised.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..infra.optional import needs
from . import onnx_attention as base
from .target import Capabilities, Claim, Options, Target

MS_DOMAIN = "com.microsoft"
HEAD_MULTIPLE = 8  # GroupQueryAttention's head_size rule (group_query_attention_helper.h)
DTYPES = ("float32", "float16")  # what the CPU provider registers (see the module docstring)
NUMPY = {"float32": np.float32, "float16": np.float16}
NO_GRADS = "ONNX Runtime has no backward for Attention or GroupQueryAttention (inference only)"
NO_BIAS_GQA = "GroupQueryAttention's attention_bias is not exercised (causal/window/padding only)"
GQA_REFUSALS = (*base.ORT_REFUSALS, ("InvalidArgument", r"head_size must be a multiple of 8"))


def _dtype(name: str, x: Any) -> str:
    dtype = getattr(x, "dtype", None)
    for key, value in NUMPY.items():
        if dtype == value:
            return key
    raise TypeError(f"{name} must be a float32 or float16 NumPy array; got {dtype or type(x)}")


def _session(proto: Any) -> Any:
    """A CPU session on one intra-op thread (see :func:`.onnx_attention.ort_session`)."""
    with needs("the ONNX Runtime KV-cache targets (exactattn.targets.ort_kvcache)"):
        import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 4
    return onnxruntime.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


@functools.lru_cache(maxsize=base.SESSIONS)
def attention_session(
    dtype: str,
    mask: str | None,
    is_causal: bool,
    scale: float | None,
    softcap: float | None,
    opset: int = base.OPSET,
) -> Any:
    """A session of one ``Attention`` node with a cache: inputs ``Q (B, H, S, E)``, ``K, V
    (B, H_kv, L, ·)``, ``attn_mask (B, H, S, P + L)`` when ``mask`` is ``"bool"`` or
    ``"float"``, ``past_key, past_value (B, H_kv, P, ·)``; outputs ``Y``, ``present_key``,
    ``present_value`` (``(B, H_kv, P + L, ·)``); sizes symbolic."""
    with needs("the ort-attention-kvcache target"):
        from onnx import TensorProto, helper
    element = base.ELEMENT[dtype]
    dims = {
        "Q": ["B", "H", "S", "E"],
        "K": ["B", "H_kv", "L", "E"],
        "V": ["B", "H_kv", "L", "E_v"],
        "attn_mask": ["B", "H", "S", "T"],
        "past_key": ["B", "H_kv", "P", "E"],
        "past_value": ["B", "H_kv", "P", "E_v"],
    }
    names = ["Q", "K", "V", "attn_mask" if mask else "", "past_key", "past_value"]
    kinds = {"attn_mask": TensorProto.BOOL if mask == "bool" else element}
    inputs = [helper.make_tensor_value_info(x, kinds.get(x, element), dims[x]) for x in names if x]
    shapes = {"Y": ["B", "H", "S", "E_v"], "present_key": ["B", "H_kv", "T", "E"]}
    shapes["present_value"] = ["B", "H_kv", "T", "E_v"]
    outputs = [helper.make_tensor_value_info(x, element, shape) for x, shape in shapes.items()]
    attrs: dict[str, Any] = {"is_causal": 1} if is_causal else {}
    if scale is not None:
        attrs["scale"] = float(scale)
    if softcap is not None:
        attrs["softcap"] = float(softcap)
    node = helper.make_node("Attention", names, list(shapes), **attrs)
    graph = helper.make_graph([node], "attention_kvcache", inputs, outputs)
    opsets = [helper.make_opsetid("", opset)]
    return _session(helper.make_model(graph, opset_imports=opsets, ir_version=base.IR_VERSION))


def ort_attention_kvcache(
    query: Any,
    key: Any,
    value: Any,
    past_key: Any,
    past_value: Any,
    attn_mask: Any = None,
    is_causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    opset: int = base.OPSET,
) -> tuple[Any, Any, Any]:
    """ONNX ``Attention`` (opset 23 or 24) with a KV cache on ONNX Runtime's CPU kernel:
    ``Y = softmax(mask(cap·tanh(c·Q·[K_past; K]ᵀ/cap)))·[V_past; V]`` and the present caches
    ``[K_past; K]``, ``[V_past; V]`` (concatenated along the sequence axis), returned as
    ``(Y (B, H, S, E_v), present_key (B, H_kv, P + L, E), present_value)``.

    ``query (B, H, S, E)``, ``key, value (B, H_kv, L ≥ 1, ·)``, ``past_key, past_value (B,
    H_kv, P, ·)``: NumPy arrays of one dtype (float32 or float16); ``attn_mask`` boolean
    (True = attend) or additive of that dtype, broadcastable to ``(B, H, S, P + L)``;
    ``is_causal``: query ``i`` sees keys ``j ≤ i + P``; ``scale`` ``c`` (None: ``1/√E``);
    ``softcap`` ``cap > 0`` (None: none)."""
    arrays = {"query": query, "key": key, "value": value}
    arrays.update(past_key=past_key, past_value=past_value)
    dtype = _dtype("query", query)
    for name, x in arrays.items():
        if _dtype(name, x) != dtype or x.ndim != 4:
            raise ValueError(
                f"{name} must be a 4-d {dtype} array like query; got {x.dtype} {x.shape}"
            )
    B, H_kv = key.shape[:2]
    for name in ("value", "past_key", "past_value"):
        if arrays[name].shape[:2] != (B, H_kv):
            raise ValueError(
                f"{name} has shape {arrays[name].shape}; its (B, H_kv) must be key's {(B, H_kv)}"
            )
    if key.shape[2] < 1:
        raise ValueError(f"key must hold at least one new key; got shape {key.shape}")
    if past_key.shape[2] != past_value.shape[2]:
        raise ValueError(
            f"past_key and past_value must hold the same past length; got {past_key.shape}, "
            f"{past_value.shape}"
        )
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be > 0 (None: none); got {softcap}")
    feeds = dict(Q=query, K=key, V=value, past_key=past_key, past_value=past_value)
    kind = None
    if attn_mask is not None:
        kind = "bool" if attn_mask.dtype == np.bool_ else "float"
        if kind == "float" and attn_mask.dtype != query.dtype:
            raise ValueError(f"attn_mask must be bool or {dtype}; got {attn_mask.dtype}")
        rows = (query.shape[2], past_key.shape[2] + key.shape[2])
        if attn_mask.ndim > 4 or attn_mask.shape[-2:] != rows:
            raise ValueError(
                f"attn_mask must be (..., S, P + L) = (..., {rows[0]}, {rows[1]}) with at most "
                f"4 dims; got {attn_mask.shape}"
            )
        feeds["attn_mask"] = attn_mask.reshape((1,) * (4 - attn_mask.ndim) + attn_mask.shape)
    cap = None if softcap is None else float(softcap)
    session = attention_session(
        dtype, kind, bool(is_causal), None if scale is None else float(scale), cap, opset
    )
    y, present_key, present_value = session.run(None, feeds)
    return y, present_key, present_value


@functools.lru_cache(maxsize=base.SESSIONS)
def gqa_session(
    dtype: str,
    num_heads: int,
    kv_num_heads: int,
    scale: float | None,
    local_window_size: int,
    softcap: float | None,
) -> Any:
    """A session of one ``com.microsoft.GroupQueryAttention`` node: inputs ``query (B, S,
    H·d)``, ``key, value (B, S, H_kv·d)``, ``past_key, past_value (B, H_kv, M, d)``,
    ``seqlens_k (B,)`` and ``total_sequence_length ()`` int32; outputs ``output (B, S,
    H·d)``, ``present_key, present_value (B, H_kv, T, d)``; ``do_rotary = 0``."""
    with needs("the ort-gqa target"):
        from onnx import TensorProto, helper
    element = base.ELEMENT[dtype]
    int32 = TensorProto.INT32
    dims = {
        "query": (element, ["B", "S", "D"]),
        "key": (element, ["B", "S", "D_kv"]),
        "value": (element, ["B", "S", "D_kv"]),
        "past_key": (element, ["B", "H_kv", "M", "d"]),
        "past_value": (element, ["B", "H_kv", "M", "d"]),
        "seqlens_k": (int32, ["B"]),
        "total_sequence_length": (int32, []),
    }
    inputs = [helper.make_tensor_value_info(x, kind, shape) for x, (kind, shape) in dims.items()]
    shapes = {"output": ["B", "S", "D"], "present_key": ["B", "H_kv", "T", "d"]}
    shapes["present_value"] = ["B", "H_kv", "T", "d"]
    outputs = [helper.make_tensor_value_info(x, element, shape) for x, shape in shapes.items()]
    attrs: dict[str, Any] = dict(num_heads=num_heads, kv_num_heads=kv_num_heads, do_rotary=0)
    attrs["local_window_size"] = local_window_size
    if scale is not None:
        attrs["scale"] = float(scale)
    if softcap is not None:
        attrs["softcap"] = float(softcap)
    node = helper.make_node(
        "GroupQueryAttention", list(dims), list(shapes), domain=MS_DOMAIN, **attrs
    )
    graph = helper.make_graph([node], "group_query_attention", inputs, outputs)
    opsets = [helper.make_opsetid("", base.OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
    return _session(helper.make_model(graph, opset_imports=opsets, ir_version=base.IR_VERSION))


def ort_group_query_attention(
    query: Any,
    key: Any,
    value: Any,
    past_key: Any,
    past_value: Any,
    seqlens_k: Any,
    total_sequence_length: int,
    *,
    num_heads: int,
    kv_num_heads: int,
    scale: float | None = None,
    local_window_size: int = -1,
    softcap: float | None = None,
) -> tuple[Any, Any, Any]:
    """``com.microsoft.GroupQueryAttention`` on ONNX Runtime's CPU kernel, ``do_rotary=0``.

    ``query (B, S, H·d)``, ``key, value (B, S, H_kv·d)`` the ``S`` new rows, ``past_key,
    past_value (B, H_kv, M, d)`` (BNSH, each sequence's past right-padded), ``seqlens_k``
    ``(B,)`` int32 ``= ℓ_b − 1`` with ``ℓ_b`` sequence ``b``'s total length ``P_b + S``,
    ``total_sequence_length = max ℓ_b``; ``num_heads = H``, ``kv_num_heads = H_kv`` (query
    head ``h`` reads kv head ``h // (H / H_kv)``), ``scale`` (None: ``1/√d``), ``softcap``
    (None: none), ``local_window_size = w`` (−1: none). Row ``s`` of sequence ``b`` is
    ``softmax_t(cap·tanh(c·q_s·k_t/cap))·v`` over ``max(0, P_b + s + 1 − w) ≤ t ≤ P_b + s``.
    Returns ``(output (B, S, H·d), present_key (B, H_kv, T, d), present_value)``, ``T =
    max(total_sequence_length, M)``, rows past ``ℓ_b`` zero."""
    dtype = _dtype("query", query)
    arrays = {"query": query, "key": key, "value": value}
    for name, x in arrays.items():
        if _dtype(name, x) != dtype or x.ndim != 3:
            raise ValueError(
                f"{name} must be a 3-d (B, S, heads·d) {dtype} array; got {x.dtype} {x.shape}"
            )
    if num_heads < 1 or kv_num_heads < 1 or num_heads % kv_num_heads:
        raise ValueError(
            f"num_heads ({num_heads}) must be a positive multiple of kv_num_heads ({kv_num_heads})"
        )
    B, S, hidden = query.shape
    d = hidden // num_heads
    if hidden != num_heads * d or key.shape != (B, S, kv_num_heads * d) or key.shape != value.shape:
        raise ValueError(
            f"query {query.shape} must be (B, S, num_heads·d) and key, value (B, S, "
            f"kv_num_heads·d) = {(B, S, kv_num_heads * d)}; got key {key.shape}, value "
            f"{value.shape}"
        )
    for name, x in (("past_key", past_key), ("past_value", past_value)):
        if (
            _dtype(name, x) != dtype
            or x.ndim != 4
            or x.shape[:2] != (B, kv_num_heads)
            or (x.shape[3] != d)
        ):
            raise ValueError(
                f"{name} must be a (B, kv_num_heads, M, d) = ({B}, {kv_num_heads}, M, {d}) "
                f"{dtype} array; got {x.dtype} {x.shape}"
            )
    seqlens_k = np.asarray(seqlens_k)
    if seqlens_k.dtype != np.int32 or seqlens_k.shape != (B,):
        raise ValueError(
            f"seqlens_k must be an int32 array of shape ({B},) (total length - 1); got "
            f"{seqlens_k.dtype} {seqlens_k.shape}"
        )
    if not isinstance(local_window_size, int) or local_window_size < -1:
        raise ValueError(f"local_window_size must be an int >= -1; got {local_window_size!r}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be > 0 (None: none); got {softcap}")
    session = gqa_session(
        dtype,
        int(num_heads),
        int(kv_num_heads),
        None if scale is None else float(scale),
        local_window_size,
        None if softcap is None else float(softcap),
    )
    feeds = dict(arrays, past_key=past_key, past_value=past_value, seqlens_k=seqlens_k)
    feeds["total_sequence_length"] = np.array(total_sequence_length, dtype=np.int32)
    output, present_key, present_value = session.run(None, feeds)
    return output, present_key, present_value


def _caps(**kwargs: Any) -> Capabilities:
    return Capabilities(
        dtypes=DTYPES,
        grads=NO_GRADS,
        dropout=base.NO_DROPOUT,
        softcap=True,
        **kwargs,
    )


# fp16 on x86: Q, K, V converted to fp32, fp32 scores, softmax, P and P·V, one rounding out
GQA_CLAIMS = (("float16", Claim(scores="float32", stats="float32", p="float32", acc="float32",
                                block=0)),)  # fmt: skip


def entries() -> list[Target]:
    """``ort-attention-kvcache`` and ``ort-gqa`` (see the module docstring for the claims)."""
    requires = ("onnx", "onnxruntime")
    return [
        Target(
            name="ort-attention-kvcache",
            convention="onnx-kvcache",
            loader=lambda: ort_attention_kvcache,
            caps=_caps(bias=True),  # the float attn_mask
            claim=Claim(block=0),
            description="ONNX Runtime's CPU Attention (opset 23) with past_key/past_value",
            requires=requires,
            options=Options(
                claim_by_dtype=(("float16", dict(base.ORT_CLAIMS)["float16"]),),
                refusals=base.ORT_REFUSALS,
                isolated=True,
            ),
        ),
        Target(
            name="ort-gqa",
            convention="ort-gqa",
            loader=lambda: ort_group_query_attention,
            caps=_caps(bias=NO_BIAS_GQA),
            claim=Claim(block=0),
            description="ONNX Runtime's CPU com.microsoft.GroupQueryAttention (past KV cache)",
            requires=requires,
            options=Options(claim_by_dtype=GQA_CLAIMS, refusals=GQA_REFUSALS, isolated=True),
        ),
    ]
