"""OpenVINO's ``ScaledDotProductAttention`` on its CPU plugin, one target per precision hint.

``openvino-f32``, ``openvino-f16``, ``openvino-bf16``: the wrapper (:func:`attention`, SDPA's
signature) builds a model of one ``openvino.opset13.scaled_dot_product_attention(q, k, v,
[attn_mask], [scale], causal=...)`` with static shapes and float32 inputs and output,
compiles it on ``"CPU"`` with ``{"INFERENCE_PRECISION_HINT": hint}`` (cached per shape, mask,
flags and scale) and runs it. The case's dtype is float32; the hint sets the precision the
plugin computes in. Forward only: a compiled OpenVINO model is an inference graph with no
gradient, so the wrapper returns a tensor detached from its inputs.

What the plugin does with the op (static shapes, OpenVINO 2026.4), from the source:

* The CPU pipeline decomposes the op (``transformations/op_conversions/
  scaled_dot_product_attention_decomposition.cpp``, ``decompose``: ``MatMul(q·scale, Kᵀ)``,
  the mask added — a boolean one as ``Select(¬mask, −inf, 0)``, ``causal`` as a top-left
  ``triu(−inf, 1)`` —, ``Softmax(axis=-1)`` over the whole row, ``MatMul(P, V)``; the
  stored source scales ``Q``, 2026.4 folds the scale into ``K``: measured below), and the
  plugin's own ``ScaledDotProductAttention`` node (``nodes/scaled_attn.cpp``) is not used:
  its ``isSupportedOperation`` says "Only run in dynamic mode" for static shapes. The softmax
  is over every key of a row at once: no key blocks (``block=0``); Snippets' MHA blocks
  only its GEMMs (``src/common/snippets/docs/mha_optimization_guide.md``, "Brgemm
  Blocking").
* Where the hint is bf16 the MatMuls take bf16 operands and accumulate in fp32; their
  output, the softmax's and the mask's are bf16 unless Snippets tokenizes the three ops into
  one MHA subgraph, which keeps the scores and the softmax in fp32 and casts the normalised
  ``p`` to bf16 before ``P·V``. Which of the two runs depends on the shapes and the thread
  count (the CPU callback of ``TokenizeMHASnippets``, per the guide above).
* The f16 hint is honoured only where the CPU computes f16 natively (``config.cpp``,
  ``Config::readProperties``: ``if (hasHardwareSupport(ov::element::f16))
  inferencePrecision = f16``); elsewhere the precision stays the default, which is bf16
  where the CPU has it (OpenVINO's documentation: the CPU plugin infers in bf16 by default
  on CPUs with native bf16).

Measured (an AMD EPYC with AVX512-BF16, 2 threads; the compiled model's runtime graph, and
each stage emulated; docs/zoo/openvino_*.py reproduce them):

* bf16, to within fp32 rounding: ``K`` is multiplied by the scale in fp32 and rounded to
  bf16 (the scale is folded into ``K``, default scale or not), ``Q`` and ``V`` are rounded
  to bf16, ``Q K̂ᵀ`` is accumulated in fp32 and — on problems too small to split over the
  threads (here e.g. ``B = H = 1``, ``n_q = 3``), where no MHA subgraph forms — rounded to
  bf16, the softmax is computed in fp32 and ``p = e/ℓ`` rounded to bf16, ``P·V`` is
  accumulated in fp32 and returned in fp32. One claim covers both paths: the case's fp32
  inputs (``input=float32``), ``scores=bf16``, fp32 statistics and accumulators, ``p``
  bf16; :meth:`~.target.Claim.arith` then computes in bf16 (the inputs rounded into it,
  every elementwise step in it, the GEMMs summed in fp32 and rounded once): looser than
  the fused path needs. On ill-conditioned cases (logits ~10^4) the bf16 ``K̂`` moves
  scores by tens, beyond the linearised expected error (a SUSPICIOUS line), within the
  bound.
* The format a hint computes in (:func:`internal_format`, a probe per hint and process,
  run where the claim is read): one key, values ``1 + 2^-9`` (exact in f16, not in bf16)
  and ``1 + 2^-12`` (exact only in f32) come back exactly only where the format holds them.
  Here the f16 hint computes in bf16.
* Whether bf16 flushes subnormals (:func:`flushes`): the value ``2^-130`` (a bf16
  subnormal) through one key comes back 0 here (AVX512-BF16 takes subnormal operands as 0):
  ``ftz=bf16``. Products flush too: with 40 equal keys every ``p·v = 2^-121/40`` is below
  ``2^-126`` and ``Y = 0`` for an exact ``3.8e-37`` (the fused path; the unfused one with
  ``v = 1`` column); since ``p`` is normalised first, the bound charges each such product
  ``ℓ·μ`` (:attr:`~exactattn.error.bounds.Arith.p_normalized`, set for ``block=0``).
* A row with no allowed key is NaN (the ``−inf`` mask through the softmax), so such rows
  are not taken; GQA: the op refuses fewer key/value heads (``key_input_correctness``), so
  the wrapper repeats ``K, V`` over each group (head ``h`` reads ``h // group``).

Not measured: the f16 path of a CPU with AVX512-FP16 or AMX-FP16 (where the probe finds
f16); its claim follows the bf16 path's structure with f16 in place of bf16. A CPU without
native bf16 keeps f32 for the bf16 hint as well (``config.cpp``, the same
``hasHardwareSupport`` test), which the probe then finds: the claim is f32's. A plugin that
cannot compile a hint here (:func:`compile_error`) leaves its target unavailable, saying why.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..infra.optional import needs
from .target import Capabilities, Claim, Options, Target

HINTS = {"openvino-f32": "f32", "openvino-f16": "f16", "openvino-bf16": "bf16"}
FORMATS = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
PROBE = (1 + 2.0**-9, 1 + 2.0**-12, 2.0**-130)  # exact in f16 / f32 only; a bf16 subnormal
NO_DROPOUT = "OpenVINO's ScaledDotProductAttention has no dropout"


@functools.cache
def _core() -> Any:
    with needs("the openvino targets"):
        import openvino as ov
    return ov.Core()


@functools.lru_cache(maxsize=64)
def _compiled(
    shapes: tuple[tuple[int, ...], ...], mask: str | None, causal: bool, scale: float | None,
    hint: str,
) -> Any:  # fmt: skip
    """The compiled one-op model: inputs ``q, k, v`` (and the mask), f32 in and out."""
    with needs("the openvino targets"):
        import openvino as ov
        import openvino.opset13 as ops
    params = [ops.parameter(list(shape), ov.Type.f32) for shape in shapes[:3]]
    args = list(params)
    if mask is not None:
        kind = ov.Type.boolean if mask == "bool" else ov.Type.f32
        params.append(ops.parameter(list(shapes[3]), kind))
        args.append(params[-1])
    if scale is not None:
        if mask is None:
            args.append(ops.constant(np.float32(0.0)))  # the op takes a scale after a mask only
        args.append(ops.constant(np.float32(scale)))
    y = ops.scaled_dot_product_attention(*args, causal=causal)
    model = ov.Model([y], params, "exactattn_sdpa")
    return _core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint})


def run(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    hint: str,
    mask: np.ndarray | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> np.ndarray:
    """OpenVINO's attention of float32 arrays ``(B, H, n, ·)`` under ``hint`` (float32 out)."""
    feeds = [np.ascontiguousarray(x, dtype=np.float32) for x in (q, k, v)]
    kind = None
    if mask is not None:
        kind = "bool" if mask.dtype == np.bool_ else "float"
        feeds.append(np.ascontiguousarray(mask, dtype=bool if kind == "bool" else np.float32))
    shapes = tuple(x.shape for x in feeds)
    compiled = _compiled(shapes, kind, causal, None if scale is None else float(scale), hint)
    return np.asarray(compiled(feeds)[0])


def attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    dropout_p: float = 0.0,
    *,
    hint: str,
) -> Any:
    """SDPA's signature over OpenVINO: torch float32 tensors ``(B, H, n, E)`` in, one out."""
    import torch

    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.dtype != torch.float32 or x.dim() != 4:
            raise TypeError(
                f"{name} must be a 4-d float32 tensor (B, H, n, E); got {x.dtype} of shape "
                f"{tuple(x.shape)} (the hint, not the dtype, sets OpenVINO's precision)"
            )
    if dropout_p:
        raise NotImplementedError(NO_DROPOUT)
    q, k, v = (x.detach().cpu().numpy() for x in (query, key, value))
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads != heads:
        if not enable_gqa or heads % kv_heads:
            raise ValueError(
                f"query has {heads} heads and key/value {kv_heads}: pass enable_gqa=True "
                "with a head count that divides the query's"
            )
        k, v = (np.repeat(x, heads // kv_heads, axis=1) for x in (k, v))  # the op takes no GQA
    mask = None if attn_mask is None else attn_mask.detach().cpu().numpy()
    y = run(q, k, v, hint, mask, bool(is_causal), scale)
    return torch.from_numpy(y)


@functools.cache
def probe(hint: str) -> tuple[float, ...]:
    """:data:`PROBE` as values ``v`` of one key (``p = 1``) through ``hint``: what comes back."""
    one = np.ones((1, 1, 1, 1), np.float32)
    v = np.array(PROBE, np.float32).reshape(1, 1, 1, len(PROBE))
    return tuple(float(x) for x in run(one, one, v, hint).ravel())


@functools.cache
def compile_error(hint: str) -> str | None:
    """Why the CPU plugin cannot compile the op under ``hint`` on this machine, or None.

    A plugin that believes the CPU computes bf16 (its own CPU detection) while oneDNN is held
    below it (``ONEDNN_MAX_CPU_ISA=AVX2`` on an AVX512-BF16 machine) finds no Softmax kernel for
    the bf16 and f16 hints: "Supported primitive descriptors list is empty for node:
    Softmax_…". The target is then unavailable (:attr:`Options.check`), with that line."""
    try:
        probe(hint)
    except RuntimeError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        return (
            f"OpenVINO's CPU plugin cannot compile the {hint} precision hint on this machine: "
            f"{lines[-1] if lines else type(error).__name__}"
        )
    return None


def internal_format(hint: str) -> str:
    """The format ``hint`` computes in on this CPU (measured, :func:`probe`)."""
    near, fine, _ = probe(hint)
    if near == PROBE[0] and fine == PROBE[1]:
        return "float32"
    if near == PROBE[0] and fine == 1.0:
        return "float16"
    if near == 1.0 and fine == 1.0:
        return "bfloat16"
    raise RuntimeError(
        f"OpenVINO's {hint} hint returned {near!r}, {fine!r} for {PROBE[0]!r}, {PROBE[1]!r} "
        "through one key: neither f32, f16 nor bf16 rounding"
    )


def flushes(hint: str) -> bool:
    """Whether ``hint`` returns the bf16 subnormal ``2^-130`` as 0 (measured, :func:`probe`)."""
    return internal_format(hint) == "bfloat16" and probe(hint)[2] == 0.0


def claim(fmt: str, ftz: bool = False) -> Claim:
    """The claim for a hint that computes in ``fmt`` (see the module docstring)."""
    if fmt == "float32":
        return Claim(input=fmt, block=0)
    return Claim(
        input="float32",  # the case's: rounded to fmt inside (the compute format)
        scores=fmt,  # the unfused MatMul writes its scores in fmt
        stats="float32",
        p=fmt,
        acc="float32",
        block=0,
        ftz=fmt if ftz else None,
    )


def measured_claim(hint: str) -> Claim:
    """The claim of ``hint`` on this CPU: its format and flushing measured (an
    :attr:`Options.claim_probe`)."""
    return claim(internal_format(hint), flushes(hint))


def _target(name: str, hint: str) -> Target:
    return Target(
        name=name,
        convention="sdpa",
        loader=lambda: functools.partial(attention, hint=hint),
        caps=Capabilities(
            dtypes=("float32",),
            devices=("cpu",),
            grads="forward only: a compiled OpenVINO model has no gradient",
            dropout=NO_DROPOUT,
            empty_rows="a row with no allowed key is NaN (the -inf mask through its softmax)",
            bias=True,
            softcap="the calling convention has no soft-cap",
        ),
        claim=claim(FORMATS[hint]),  # as documented where the CPU has the format natively
        description=f"OpenVINO ScaledDotProductAttention, CPU plugin, {hint} precision hint",
        requires=("torch", "openvino"),
        options=Options(
            claim_probe=functools.partial(measured_claim, hint),
            check=functools.partial(compile_error, hint),
            isolated=True,
        ),
    )


def entries() -> list[Target]:
    """One target per precision hint."""
    return [_target(name, hint) for name, hint in HINTS.items()]
