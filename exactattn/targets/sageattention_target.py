"""SageAttention's ``sageattn`` (PyPI ``sageattention==1.0.6``) as the target ``sageattention``.

The callable, :func:`sage_attention`, takes the ``sdpa`` convention (:mod:`.conventions`):
torch tensors ``(B, H, n, d)``, ``is_causal``, ``scale``, ``enable_gqa``. It calls
``sageattn(q, k, v, tensor_layout="HND", is_causal=..., sm_scale=scale)``, whose ``HND``
layout is SDPA's; K and V with fewer heads for GQA as ``sageattn`` takes them natively
(query head ``h`` reads key/value head ``h // G``, ``num_kv_groups`` in its kernels). It
takes no mask but causal, no dropout and no bias (``sageattn`` has no such arguments: its
``**kwargs`` would swallow them silently, so the wrapper passes only what it names).

What the source says (``sageattention/core.py``, ``sageattn``; the Triton kernels in
``quant_per_block.py``, ``attn_qk_int8_per_block.py`` and ``attn_qk_int8_per_block_causal.py``):

* refusals (``assert``, so ``AssertionError``): ``"Input tensors must be on cuda."``,
  the dtypes float16/bfloat16/float32, ``"headdim should be in [64, 96, 128]."``, ``"Last
  dim of qkv must be contiguous."``; the causal kernel's ``forward``: ``"qo_len and kv_len
  must be equal for causal attention"`` (so causal is square, top-left = bottom-right).
  ``v`` must have ``d`` columns (one ``HEAD_DIM`` for Q, K, V and the output);
* K smoothing (``smooth_k=True``, the default): ``km = k.mean(dim=seq_dim)`` and
  ``k -= km`` **in place, on the caller's tensor**, in the input dtype. Every score of row
  ``i`` moves by ``q_i·km``; softmax is invariant to that shift;
* ``v = v.to(torch.float16)`` for bfloat16 (and float32) inputs;
* ``per_block_int8`` (``quant_per_block.py``): Q in blocks of ``BLKQ = 128`` rows, K in
  blocks of ``BLKK = 64`` rows, one float32 scale per (batch, head, block) over the block's
  rows × ``d``: ``x·sm'`` in float32 (``sm' = sm_scale·1.44269504`` for Q, folding ``log₂e``
  in, 1 for K), ``scale = max|x|/127``, ``x/scale`` rounded half away from zero
  (``+0.5·sign``, then the truncating cast to int8);
* ``_attn_fwd`` / ``_attn_fwd_inner``: key tiles of ``BLOCK_N = 64`` (query tiles of
  ``BLOCK_M = 128``), ``qk = dot(q_int8, k_int8)`` (exact in int32) ``· q_scale · k_scale``
  in float32, the online softmax in base 2 (``exp2``) with ``m, ℓ`` and ``acc`` in float32,
  ``p`` cast to float16 and ``acc += dot(p, v, out_dtype=float16)``: each tile's ``P·V``
  accumulated in float16, then added to the float32 ``acc``; the output ``acc/ℓ`` cast to
  the input dtype. The causal kernel adds ``−10⁶`` (not ``−∞``) to the diagonal tile's
  masked scores. There is no backward.

The claim: scores, statistics and accumulators float32, ``p`` float16, each key block's
``P·V`` accumulated in float16 (``pv_acc``) and key blocks of 64, for both input dtypes; and
the quantisation (:func:`quantisation`, charged by the bound as
:attr:`exactattn.error.bounds.Arith.quant_rel` / ``quant_abs``). What it approximates,
always upwards (never tighter than the kernel):

* ``QKᵀ`` is charged a float32 accumulation (the kernel's int32 dot is exact);
* the int8 quantisation and the smoothing's rounding are one per-entry model
  ``|x̂ − x| ≤ rel·|x| + abs`` over ``q, k, v`` (the largest of the three), ``x̂`` what the
  kernel computes with: ``q̂ = int8·scale/sm'``, ``k̂ = int8·scale + km`` (``km`` cancels in
  the softmax), ``v̂ = fp16(v)``. The bound of ``exactattn.error.lowbit``'s ``sage1`` scheme
  is the same quantisation on float32 inputs; this is its kernel-side error model, the
  smallest the existing ``Arith`` fields say. Its ``abs`` is the largest block's grid,
  charged to every entry with all errors aligned: it cannot tell per-block from per-tensor
  scales, and on N(0, 1) inputs it is about 80 times the measured error. The low-bit
  claim grammar (:mod:`exactattn.error.lowbit_claim`, ``quantiser=nearest`` included) is
  not used here: it assumes the smoothing and rotation in the compute format (fp32),
  while ``sageattn`` 1.0.6 subtracts K's mean in the input dtype (``k - km`` in fp16 or
  bf16), which moves its pre-quantisation keys by that dtype's unit roundoff (``2^-11``
  relative in fp16, ``2^-8`` in bf16), a field the grammar does not have.

What the check finds that the claim does not excuse: ``_attn_fwd_inner`` (non-causal) loads
the last key tile with ``mask=offs_n < kv_len − start_n`` and no ``other``, and never masks
those columns' scores: for ``n_k`` not a multiple of 64 the padded keys (K = 0 after the
smoothing, so score 0, V = 0) add ``e^{−m}`` each to ``ℓ`` (measured under the Triton
interpreter: ``n_k = 70`` errs by 0.25 where ``n_k = 64`` errs by 0.01; the check catches it
where the padding outweighs the row, e.g. ``n_k = 3``: its worst-case bound is loose). It is
the KNOWN-UPSTREAM ``sageattention-unmasked-tail`` (:mod:`exactattn.testing.known`, replay
``tests/regressions/sageattention_unmasked_tail.json``, reproducer
``docs/zoo/sageattention_unmasked_tail.py``), reported as such, not as a failure.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from ..backends.formats import get_format
from .target import Capabilities, Claim, Options, Target

BLOCK_Q, BLOCK_K = 128, 64  # per_block_int8's BLKQ, BLKK (= the kernels' BLOCK_M, BLOCK_N)
HEAD_DIMS = (64, 96, 128)  # sageattn: "headdim should be in [64, 96, 128]."
INT8_TOP = 127
CLAIM = Claim(
    scores="float32", stats="float32", p="float16", acc="float32", pv_acc="float16", block=BLOCK_K
)
REFUSALS = (
    ("AssertionError", r"headdim should be in"),
    ("AssertionError", r"qo_len and kv_len must be equal for causal attention"),
)
FP32_OPS = 2.0**-13  # the float32 steps before the integer rounding (quantisation())
NO_GRADS = "sageattn has no backward (SageAttention 1.0.6: forward kernels only)"


def sage_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """``sageattention.sageattn(query, key, value, "HND", is_causal, sm_scale=scale)`` in
    SDPA's signature (the module docstring); ``key`` is smoothed in place by ``sageattn``."""
    if attn_mask is not None or dropout_p:
        raise NotImplementedError("sageattn takes no attn_mask and no dropout_p")
    if not enable_gqa and key.shape[-3] != query.shape[-3]:
        raise ValueError(
            f"query has {query.shape[-3]} heads and key {key.shape[-3]}: "
            "pass enable_gqa=True for grouped-query attention"
        )
    sageattn = importlib.import_module("sageattention").sageattn  # imported on first call
    return sageattn(query, key, value, tensor_layout="HND", is_causal=is_causal, sm_scale=scale)


def quantisation(inputs: dict[str, Any], dtype: str) -> tuple[float, float]:
    """``(rel, abs)`` with ``|x̂ − x| ≤ rel·|x| + abs`` for every entry of the held ``q, k,
    v`` (``dtype``: their format), ``x̂`` what ``sageattn`` computes with.

    Each block's grid is ``s = A/127`` (``A`` its largest magnitude); the float32 steps
    before the rounding (``x·sm'``, ``/s``, ``+0.5``) move a value at most ``2^{−15}``
    grid steps, and ``s``'s own rounding ``2^{−24}``: ``|x̂ − x| ≤ (s/2)(1 + 2^{−13})``.
    ``q``: exact in float32, so that is all. ``k``: the kernel quantises
    ``k'' = fl(k − k̃)`` (``k̃ = fl(mean)``, within ``w·max|k| + μ`` of the exact mean ``k̄``,
    ``w = u + (n_k + 2)·2^{−24}``: a float32 sum, its quotient and the rounding to ``dtype``);
    ``k̂ = Q(k'') + k̃``, so ``|k̂ − k| ≤ |Q(k'') − k''| + u|k| + u|k̃| + μ``, with
    ``|k''| ≤ (|k − k̄| + w·max|k| + μ)(1 + u) + μ`` bounding each block's grid.
    ``v``: cast to float16 for bfloat16 inputs (``u = 2^{−11}``, ``μ = 2^{−25}``)."""
    fmt = get_format(dtype)
    u, mu = fmt.u, fmt.mu
    q, k = (np.asarray(inputs[x], dtype=np.float64) for x in "qk")
    grid = (1 + FP32_OPS) / (2 * INT8_TOP)  # (s/2)(1 + 2^-13) per unit of a block's amax
    abs_q = grid * float(_block_amax(q, BLOCK_Q).max(initial=0.0))
    top_k = float(np.abs(k).max(initial=0.0))
    w = u + (k.shape[-2] + 2) * 2.0**-24
    smoothed = np.abs(k - k.mean(axis=-2, keepdims=True))
    top_smoothed = (_block_amax(smoothed, BLOCK_K) + w * top_k + mu) * (1 + u) + mu
    mean_top = top_k * (1 + w) + mu
    abs_k = grid * float(top_smoothed.max(initial=0.0)) + u * mean_top + mu
    half = get_format("float16")
    v_cast = (half.u, half.mu) if dtype == "bfloat16" else (0.0, 0.0)
    return max(u, v_cast[0]), max(abs_q, abs_k, v_cast[1])


def _block_amax(x: np.ndarray, rows: int) -> np.ndarray:
    """The largest ``|x|`` of each block of ``rows`` consecutive rows (all columns)."""
    n = x.shape[-2]
    pad = -n % rows
    padded = np.pad(np.abs(x), [(0, 0)] * (x.ndim - 2) + [(0, pad), (0, 0)])
    blocks = padded.reshape((*x.shape[:-2], (n + pad) // rows, rows * x.shape[-1]))
    return blocks.max(axis=-1, initial=0.0)


def entries() -> list[Target]:
    """The ``sageattention`` entry (CUDA only: ``sageattn`` asserts CUDA tensors)."""
    return [
        Target(
            name="sageattention",
            convention="sdpa",
            loader=lambda: sage_attention,
            caps=Capabilities(
                dtypes=("float16", "bfloat16"),
                devices=("cuda",),
                grads=NO_GRADS,
                dropout="sageattn has no dropout",
                empty_rows="sageattn takes no mask that leaves a row without keys",
                masks=("causal",),
                equal_head_dims=True,
                softcap="sageattn has no soft-cap",
            ),
            claim=CLAIM,
            description="SageAttention 1.0.6 sageattn (INT8 Q, K per block, fp16 P·V)",
            requires=("torch", "sageattention"),
            needs_cuda=True,
            options=Options(
                quantisation=quantisation,
                refusals=REFUSALS,
                known=("sageattention-unmasked-tail",),  # exactattn.testing.known
            ),
        )
    ]
