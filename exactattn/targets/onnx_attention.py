"""ONNX's standard ``Attention`` operator as built-in targets: ONNX Runtime's CPU kernel
(``ort-attention``) and the specification's reference (``onnx-reference``).

Both run one graph, a single ``Attention`` node of the default domain at opset 23, built
here with SDPA's signature (:func:`ort_attention`, :func:`onnx_reference`; the ``sdpa``
calling convention): ``(B, H, n, E)`` inputs, ``is_causal``, ``scale``, a boolean or an
additive float ``attn_mask``, GQA as 4-D ``K, V`` with fewer heads (ONNX reads the head
counts from the shapes of 4-D inputs); ``ort-attention-3d`` feeds the same node as exported
models do, 3-D ``(B, n, H·E)`` inputs with the head counts as ``q_num_heads`` /
``kv_num_heads`` (:func:`ort_attention_packed`).
The model is built once per dtype and flags (symbolic sizes: one session serves every
shape). Opset 24 is not a second target: ONNX Runtime registers one kernel class,
``Attention<T>``, for 23 and 24 (``onnxruntime/core/providers/cpu/llm/attention.cc``,
``REGISTER_ONNX_KERNEL_VERSIONED_TYPED`` / ``REGISTER_ONNX_KERNEL_TYPED``) and the reference
one function (``Attention_24(Attention_23)``), and opset 24 adds only ``nonpad_kv_seqlen``,
which SDPA's signature has no use for (the two opsets' outputs are compared bit for bit in
``tests/check/test_zoo_onnx.py``).

What the sources say (ONNX Runtime 1.31.1, build ``6af1a93``, read at
``microsoft/onnxruntime@025a43f``, whose messages the binary holds; onnx 1.23.2's
``onnx/reference/ops/op_attention.py``):

* ONNX Runtime, float32 (``AttentionBase<T>::ComputeAttentionProbs``,
  ``ComputeVxAttentionScore``, ``AttentionGemm``): ``S = scale·Q Kᵀ (+ mask)`` by MLAS's
  SGEMM (fp32 products and sums; the mask preloaded into ``C`` with ``beta = 1``), the
  softmax by ``MlasComputeSoftmax`` (``onnxruntime/core/mlas/lib/compute.cpp``: the row
  maximum, ``MlasComputeSumExpF32Kernel``'s polynomial exp of ``s − m`` and their fp32 sum,
  then each ``e`` times ``1/ℓ``), ``P V`` by SGEMM: float32 throughout, one block over all
  keys (``block=0``, naive attention).
* ONNX Runtime, float16: ``AttentionGemm<MLFloat16>`` has no native fp16 GEMM on x86
  (``MlasHGemmSupported`` false), so it converts ``Q, K`` to fp32, runs SGEMM and rounds
  ``S`` to fp16 (measured: the kernel's ``qk_matmul_output`` equals the fp32 product rounded
  once); ``ComputeAttentionSoftmaxInplace<MLFloat16>`` converts ``S`` to fp32, runs
  ``MlasComputeSoftmax`` and rounds ``P`` to fp16; ``P V`` is the fp32 SGEMM of fp16
  operands rounded to fp16. Claim: scores fp16, statistics fp32, ``p`` fp16, accumulators
  fp32, ``block=0``.
* ONNX Runtime refuses: a scale ``<= 0`` (``Attention<T>::Attention``: ``ORT_ENFORCE(scale_ >
  0 || std::isnan(scale_), "scale must be greater than 0 if specified")``, raised as
  ``onnxruntime...Fail`` when the session is created, ``attention.cc:233`` in this build)
  and bfloat16 (no kernel is registered
  for it: ONNX Runtime inlines the operator's function body and finds no bfloat16
  ``Expand``, ``NotImplemented: Could not find an implementation for ...``). Both are
  :attr:`Options.refusals`, skipped with ONNX Runtime's message. float64 has no kernel
  either: ONNX Runtime runs the specification's function body (``onnx/defs/nn/old.cc``,
  the Attention-23 schema's function builder: the default scale ``CalculatedScale =
  Div(One1DF, SqrtHeadSize)`` in float32, ``float_type = FLOAT``, lines 4421 and 4484-4494 at
  ``onnx/onnx@f754691``; ``ScaleFactorSqrt = Sqrt(ScaleFactor)`` cast to the input type on
  ``Q`` and ``K``, ``MatMul``, ``Add``, ``Softmax``, ``MatMul``) with its own float64
  kernels, and returns NaN for a negative scale as the reference does.
* The reference (``_compute_attention``): ``√scale`` cast to the input dtype (line 207-210)
  multiplies ``Q`` and ``K`` before ``numpy_matmul`` (line 344; NumPy accumulates float16
  products in float32, ml_dtypes' bfloat16 matmul returns float32, cast back), the bias
  added, ``_softmax`` (lines 18-33: ``np.max``, ``np.exp``, ``np.sum``, the division) in the
  input dtype, ``P`` cast to it and ``P V`` by ``numpy_matmul``: the input dtype throughout,
  ``block=0``; in float16 the products and the row sum accumulate in float32 (NumPy's half
  matmul and pairwise sum), ``acc=float32``; in bfloat16 ``np.sum`` (line 31) adds one term
  at a time in bfloat16 (ml_dtypes has no pairwise sum), ``acc=bfloat16``, so ℓ stops
  growing past 256 equal terms (``docs/zoo/onnx_reference_bf16_rowsum.py``: ``y = 4`` where
  the exact value is 1 for 1024 keys) and the bound of long bf16 rows is vacuous: the
  reference is no bfloat16 oracle beyond a few hundred keys. A negative scale gives NaN
  (line 207: ``np.sqrt(scale)``): KNOWN-UPSTREAM ``onnx-attention-negative-scale``,
  ``docs/zoo/onnx_negative_scale.py``.
* The scale. The operator's ``scale`` is a float32 attribute (``AttributeProto::FLOAT``),
  and ONNX Runtime's float64 function body computes the default ``1/√E`` in float32; in
  fp32 and fp16 that rounding, ``√ĉ``'s and the two products by it are within the bound's
  five roundings of the scale (:func:`exactattn.error.bounds._scores`), but a float64 run
  errs by ~1e-8 relative (``docs/zoo/onnx_float32_scale.py``; measured up to 1.7e9 float64
  ulps): the float64 claims state float32 scores, the format its ``ĉ`` is held in.
* Causal masks are aligned top-left, as SDPA's ``is_causal`` (``ComputeAttentionProbs``
  masks ``t > past_sequence_length + s``, with no past 0; the reference's ``_apply_causal``
  with ``offset = 0``), also for one query row (measured: it attends key 0 only).
* A row with no allowed key comes back as zeros from both (measured on 1.31.1; the
  reference's fully-masked-row guard, lines 370-382).
* Forward only: ONNX Runtime has no backward for ``Attention`` (inference only), nor has the
  reference; no dropout (the operator has none); no soft-cap (the ``sdpa`` convention has
  no soft-cap argument, though the operator has a ``softcap`` attribute).
"""

from __future__ import annotations

import functools
from typing import Any

from ..infra.optional import needs
from .target import Capabilities, Claim, Options, Target

OPSET = 23
IR_VERSION = 10  # onnxruntime 1.31 rejects IR version 14, what onnx 1.23 writes by default
SESSIONS = 256  # cached sessions: one per dtype, flags and scale
NO_GRADS = "ONNX Runtime has no backward for Attention (inference only)"
NO_REFERENCE_GRADS = "onnx.reference evaluates the forward only (no backward)"
NO_DROPOUT = "the ONNX Attention operator has no dropout"
NO_SOFTCAP = "the sdpa calling convention has no soft-cap (the operator's softcap is not passed)"
NEGATIVE_SCALE = "onnx-attention-negative-scale"  # exactattn.testing.known.UPSTREAM
EMPTY_ROW_FLOAT64 = "onnx-attention-empty-row-float64"  # ditto: the float64 function body
ELEMENT = {"float64": 11, "float32": 1, "float16": 10, "bfloat16": 16}  # onnx.TensorProto
ORT_REFUSALS = (
    ("Fail", r"scale must be greater than 0 if specified"),
    ("NotImplemented", r"Could not find an implementation for"),
)


@functools.lru_cache(maxsize=SESSIONS)
def model(
    dtype: str,
    mask: str | None,
    is_causal: bool,
    scale: float | None,
    opset: int = OPSET,
    heads: tuple[int, int] | None = None,
):
    """The ``ModelProto`` of one ``Attention`` node: inputs ``Q (B, H, L, E)``, ``K, V (B,
    H_kv, S, ·)`` and, when ``mask`` is ``"bool"`` or ``"float"``, ``attn_mask (B, H, L,
    S)``; output ``Y``; sizes symbolic. With ``heads = (H, H_kv)`` the inputs are 3-D, as
    exported models feed them: ``Q (B, L, H·E)``, ``K, V (B, S, H_kv··)``, ``Y (B, L,
    H·E_v)``, the head counts as the ``q_num_heads`` / ``kv_num_heads`` attributes."""
    with needs("the ONNX Attention targets (exactattn.targets.onnx_attention)"):
        from onnx import TensorProto, helper
    if dtype not in ELEMENT:
        raise ValueError(f"dtype must be one of {sorted(ELEMENT)}; got {dtype!r}")
    element = ELEMENT[dtype]
    dims = {
        "Q": ["B", "H", "L", "E"],
        "K": ["B", "H_kv", "S", "E"],
        "V": ["B", "H_kv", "S", "E_v"],
        "attn_mask": ["B", "H", "L", "S"],
    }
    out = ["B", "H", "L", "E_v"]
    attrs: dict[str, Any] = {"is_causal": 1} if is_causal else {}
    if heads is not None:
        dims |= {"Q": ["B", "L", "HE"], "K": ["B", "S", "HE_kv"], "V": ["B", "S", "HE_v"]}
        out = ["B", "L", "HE_vq"]
        attrs |= {"q_num_heads": heads[0], "kv_num_heads": heads[1]}
    names = ["Q", "K", "V"] + (["attn_mask"] if mask else [])
    kinds = {"attn_mask": TensorProto.BOOL if mask == "bool" else element}
    inputs = [helper.make_tensor_value_info(x, kinds.get(x, element), dims[x]) for x in names]
    output = helper.make_tensor_value_info("Y", element, out)
    if scale is not None:
        attrs["scale"] = float(scale)
    node = helper.make_node("Attention", names, ["Y"], **attrs)
    graph = helper.make_graph([node], "attention", inputs, [output])
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


@functools.lru_cache(maxsize=SESSIONS)
def ort_session(
    dtype: str,
    mask: str | None,
    is_causal: bool,
    scale: float | None,
    opset: int,
    heads: tuple[int, int] | None = None,
):
    """An ONNX Runtime CPU session of :func:`model`, on one intra-op thread: MLAS partitions
    its GEMMs by rows and columns and the softmax by rows, never a sum, so the thread count
    does not change the arithmetic (and the check's machine is shared)."""
    with needs("the ort-attention target"):
        import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 4  # fatal only: a refusal is raised, not also logged
    proto = model(dtype, mask, is_causal, scale, opset, heads).SerializeToString()
    return onnxruntime.InferenceSession(proto, options, providers=["CPUExecutionProvider"])


@functools.lru_cache(maxsize=SESSIONS)
def reference_evaluator(
    dtype: str,
    mask: str | None,
    is_causal: bool,
    scale: float | None,
    opset: int,
    heads: tuple[int, int] | None = None,
):
    with needs("the onnx-reference target"):
        from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(model(dtype, mask, is_causal, scale, opset, heads))


def _run_ort(key: tuple, feeds: dict[str, Any]) -> Any:
    return ort_session(*key).run(["Y"], feeds)[0]


def _run_reference(key: tuple, feeds: dict[str, Any]) -> Any:
    return reference_evaluator(*key).run(None, feeds)[0]


RUNNERS = {"ort": _run_ort, "reference": _run_reference}


def _numpy(x: Any) -> Any:
    """A torch tensor as the NumPy array ONNX takes (bfloat16 as ml_dtypes' bfloat16)."""
    import torch

    x = x.detach().to("cpu").contiguous()
    if x.dtype == torch.bfloat16:
        with needs("bfloat16 inputs to the ONNX targets"):
            import ml_dtypes
        return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return x.numpy()


def _tensor(y: Any, dtype: Any) -> Any:
    import numpy as np
    import torch

    if dtype == torch.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(y).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(y))


def attention(
    runner: str,
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    dropout_p: float = 0.0,
    opset: int = OPSET,
    packed: bool = False,
) -> Any:
    """``F.scaled_dot_product_attention``'s signature over the ONNX ``Attention`` node, run by
    ``runner`` (``"ort"`` or ``"reference"``); ``packed``: fed as 3-D inputs, each token's
    heads side by side (``(B, H, n, E) → (B, n, H·E)``), with the head counts as attributes."""
    if runner not in RUNNERS:
        raise ValueError(f"runner must be one of {sorted(RUNNERS)}; got {runner!r}")
    if dropout_p:
        raise NotImplementedError(f"dropout_p={dropout_p}: {NO_DROPOUT}")
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        raise ValueError(
            f"query, key, value must be 4-d (B, H, n, E); got {tuple(query.shape)}, "
            f"{tuple(key.shape)}, {tuple(value.shape)}"
        )
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError(
            f"{query.shape[1]} query heads and {key.shape[1]} key/value heads need "
            "enable_gqa=True (as SDPA's)"
        )
    dtype = str(query.dtype).removeprefix("torch.")
    kind = None if attn_mask is None else ("float" if attn_mask.is_floating_point() else "bool")
    heads = (int(query.shape[1]), int(key.shape[1])) if packed else None
    q, k, v = (_tokens(x) if packed else x for x in (query, key, value))
    feeds = {"Q": _numpy(q), "K": _numpy(k), "V": _numpy(v)}
    if attn_mask is not None:
        feeds["attn_mask"] = _numpy(attn_mask)
    key_ = (dtype, kind, bool(is_causal), None if scale is None else float(scale), opset, heads)
    y = _tensor(RUNNERS[runner](key_, feeds), query.dtype)
    if packed:  # (B, n, H·E_v) back to (B, H, n, E_v)
        B, n = y.shape[:2]
        y = y.reshape(B, n, query.shape[1], -1).transpose(1, 2)
    return y


def _tokens(x: Any) -> Any:
    """``(B, H, n, E)`` as the 3-D ``(B, n, H·E)`` of exported models (heads side by side)."""
    B, H, n, E = x.shape
    return x.transpose(1, 2).reshape(B, n, H * E)


def ort_attention(query, key, value, attn_mask=None, is_causal=False, scale=None,
                  enable_gqa=False, dropout_p=0.0):  # fmt: skip
    """SDPA's signature over ONNX Runtime's CPU ``Attention`` kernel (opset 23)."""
    return attention("ort", query, key, value, attn_mask, is_causal, scale, enable_gqa, dropout_p)


def ort_attention_packed(query, key, value, attn_mask=None, is_causal=False, scale=None,
                         enable_gqa=False, dropout_p=0.0):  # fmt: skip
    """SDPA's signature over ONNX Runtime's ``Attention`` fed as exported models feed it: 3-D
    ``(B, n, H·E)`` inputs with ``q_num_heads`` / ``kv_num_heads``."""
    return attention(
        "ort", query, key, value, attn_mask, is_causal, scale, enable_gqa, dropout_p, packed=True
    )


def onnx_reference(query, key, value, attn_mask=None, is_causal=False, scale=None,
                   enable_gqa=False, dropout_p=0.0):  # fmt: skip
    """SDPA's signature over ``onnx.reference.ReferenceEvaluator`` running the same node."""
    return attention(
        "reference", query, key, value, attn_mask, is_causal, scale, enable_gqa, dropout_p
    )


def _caps(grads: str) -> Capabilities:
    return Capabilities(
        grads=grads,
        dropout=NO_DROPOUT,
        bias=True,  # the float attn_mask, added to the scores
        softcap=NO_SOFTCAP,
    )


F32_SCALE = Claim(scores="float32", block=0)  # float64 runs: ĉ is a float32 (see above)
ORT_CLAIMS = (
    ("float16", Claim(scores="float16", stats="float32", p="float16", acc="float32", block=0)),
    ("float64", F32_SCALE),
)
REFERENCE_CLAIMS = (
    ("float16", Claim(acc="float32", block=0)),  # NumPy: half products and sums in float32
    ("float64", F32_SCALE),
)


def entries() -> list[Target]:
    """``ort-attention``, ``ort-attention-3d`` and ``onnx-reference`` (see the module
    docstring for the claims)."""
    return [
        Target(
            name="ort-attention",
            convention="sdpa",
            loader=lambda: ort_attention,
            caps=_caps(NO_GRADS),
            claim=Claim(block=0),
            description="ONNX Runtime's CPU Attention kernel (ONNX opset 23), SDPA's signature",
            requires=("torch", "onnx", "onnxruntime"),
            options=Options(
                claim_by_dtype=ORT_CLAIMS,
                refusals=ORT_REFUSALS,
                known=(NEGATIVE_SCALE, EMPTY_ROW_FLOAT64),
                isolated=True,  # native code: a crash or a hang fails one case only
            ),
        ),
        Target(
            name="ort-attention-3d",
            convention="sdpa",
            loader=lambda: ort_attention_packed,
            caps=_caps(NO_GRADS),
            claim=Claim(block=0),
            description="ONNX Runtime's CPU Attention kernel with 3-D inputs and "
            "q_num_heads / kv_num_heads (as exported models call it)",
            requires=("torch", "onnx", "onnxruntime"),
            options=Options(
                claim_by_dtype=ORT_CLAIMS,  # the same kernel, after its own head split
                refusals=ORT_REFUSALS,
                known=(NEGATIVE_SCALE, EMPTY_ROW_FLOAT64),
                isolated=True,
            ),
        ),
        Target(
            name="onnx-reference",
            convention="sdpa",
            loader=lambda: onnx_reference,
            caps=_caps(NO_REFERENCE_GRADS),
            claim=Claim(block=0),
            description="onnx.reference's Attention (ONNX opset 23), the specification's own",
            requires=("torch", "onnx"),
            options=Options(claim_by_dtype=REFERENCE_CLAIMS, known=(NEGATIVE_SCALE,)),
        ),
    ]
