"""FlashInfer (``flashinfer-python``) as targets: ``flashinfer-prefill``, ``flashinfer-decode``,
``flashinfer-paged`` and ``flashinfer-merge``, CUDA only, float16 and bfloat16, forward only.

Each runs through a convention of :mod:`.flashinfer_conventions` (where the calls are laid
out): ``single_prefill_with_kv_cache`` per batch element, ``single_decode_with_kv_cache`` per
query row, ``BatchPrefillWithPagedKVCacheWrapper`` on the case's paged cache, and
``merge_state`` folded over split-KV partials. The API, from flashinfer-python 0.7.4:

* ``flashinfer/prefill.py`` ``single_prefill_with_kv_cache(q, k, v, scale_q=None, ...,
  custom_mask=None, packed_custom_mask=None, causal=False, kv_layout="NHD", ...,
  sm_scale=None, window_left=-1, logits_soft_cap=None, ..., return_lse=False, ...)``:
  ``q (n_q, H, d)``, ``k, v (n_k, H_kv, ·)``; ``head_dim_vo`` may differ from ``d``; ``lse``
  ``(n_q, H)`` float32 as the kernel writes it, base 2 (``_finish_lse``: "Kernels write
  base-2 LSE"; ``attention/prefill.cuh``: ``lse = ptx_log2(d) + m`` over scores scaled by
  ``sm_scale_log2 = sm_scale·log2e``). Causal is aligned bottom-right (its docstring's
  ``tril(diagonal=kv_len - qo_len)``); the window is ``j + n_q + window_left ≥ n_k + i``
  (``attention/variants.cuh`` ``DefaultAttention::LogitsMask``); the soft-cap
  ``cap·tanh(sm_scale·s/cap)`` (``LogitsTransform``). ``num_qo_heads`` a multiple of
  ``num_kv_heads`` (GQA, query head ``h`` reading ``h // group``).
* ``flashinfer/decode.py`` ``single_decode_with_kv_cache(q (H, d), k, v, kv_layout="NHD",
  ..., window_left=-1, logits_soft_cap=None, sm_scale=None, ..., return_lse=False)``: its
  output is ``empty_like(q)``, so ``v == d``; lse ``(H,)`` base 2 (``state_t::get_lse``,
  ``attention/state.cuh``: ``m + ptx_log2(d)``).
* ``flashinfer/prefill.py`` ``BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer,
  kv_layout="NHD", ...)``, ``.plan(qo_indptr, paged_kv_indptr, paged_kv_indices,
  paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim_qk, page_size,
  head_dim_vo=None, ..., causal=False, ..., sm_scale=None, window_left=-1,
  logits_soft_cap=None, ..., q_data_type="float16", kv_data_type=None, ...)``,
  ``.run(q, paged_kv_cache, ..., return_lse=False, lse_base="log2", ...)``: the cache
  ``(k_cache, v_cache)``, each ``(pages, page_size, H_kv, ·)`` (NHD).
* ``flashinfer/cascade.py`` ``merge_state(v_a, s_a, v_b, s_b)``: ``v (n, H, d)``,
  ``s (n, H)`` float32, base 2 (``attention/cascade.cuh`` ``MergeStateKernel``:
  ``ptx_exp2(s − s_max)`` and ``s = ptx_log2(d_sum) + s_max``); float16/bfloat16 only
  (``csrc/cascade.cu``); two empty states merge to ``(0, −∞)`` (its ``d_sum > 0`` guard).

The claim, FlashAttention-2's (``Options(policy="fa2")``, as flash-attn's): scores ``s``,
the running ``m``, ``ℓ`` and the accumulator ``z`` in float32, ``P`` rounded to the input
dtype before ``P·V`` (``attention/prefill.cuh`` ``compute_sfm_v``: ``vec_cast<DTypeQ,
float>`` of ``s_frag`` before the ``mma``); ``y = z/ℓ`` rounded once to the input dtype. The
key-tile size is not stated: the prefill kernels' ``CTA_TILE_KV = NUM_MMA_KV·16`` (times
the KV warps) and decode's ``bdy·tile_size_per_bdx·bdz`` are chosen per head dim, dtype and
GPU at dispatch, so the bound assumes the worst case (one key per block). Decode keeps
``P`` in float32 (``attention/decode.cuh``: ``st.o`` accumulates ``s[j]·v`` in float), so
the fa2 claim bounds it with room. The merge rounds once per call: ``v`` in float32
internally, stored in the input dtype (``cast_store``). ``use_fp16_qk_reduction`` (float16
scores) is never passed.

Unavailable without the package (``flashinfer``) or a CUDA device, with the reason.
"""

from __future__ import annotations

import importlib
from typing import Any

from .target import Capabilities, Claim, Options, Target

REQUIRES = ("torch", "flashinfer")
DTYPES = ("float16", "bfloat16")  # csrc: DISPATCH_DLPACK_DTYPE_TO_CTYPE_FP16
FORWARD_ONLY = "FlashInfer's attention kernels are forward only (no backward)"
NO_DROPOUT = "FlashInfer's attention has no dropout"
EMPTY_ROWS = "FlashInfer's prefill and decode do not state their result for a row with no key"


def _loader(name: str) -> Any:
    """``flashinfer.<name>``, looked up on each load (the package as imported now)."""
    return lambda: getattr(importlib.import_module("flashinfer"), name)


def _target(name: str, convention: str, function: str, description: str, **caps: Any) -> Target:
    defaults: dict[str, Any] = dict(
        dtypes=DTYPES,
        devices=("cuda",),
        grads=FORWARD_ONLY,
        dropout=NO_DROPOUT,
        lse=True,
        empty_rows=EMPTY_ROWS,
        bias="FlashInfer takes no bias tensor (its ALiBi is pos_encoding_mode's own slopes)",
        softcap=True,
    )
    return Target(
        name=name,
        convention=convention,
        loader=_loader(function),
        caps=Capabilities(**{**defaults, **caps}),
        claim=Claim(),
        description=description,
        requires=REQUIRES,
        needs_cuda=True,
        options=Options(policy="fa2"),
    )


def entries() -> list[Target]:
    """The FlashInfer targets (see the module docstring)."""
    return [
        _target(
            "flashinfer-prefill",
            "flashinfer-prefill",
            "single_prefill_with_kv_cache",
            "FlashInfer's single_prefill_with_kv_cache, one call per batch element",
        ),
        _target(
            "flashinfer-decode",
            "flashinfer-decode",
            "single_decode_with_kv_cache",
            "FlashInfer's single_decode_with_kv_cache, one call per query row",
            equal_head_dims=True,
        ),
        _target(
            "flashinfer-paged",
            "flashinfer-paged",
            "BatchPrefillWithPagedKVCacheWrapper",
            "FlashInfer's BatchPrefillWithPagedKVCacheWrapper on a paged KV cache",
        ),
        _target(
            "flashinfer-merge",
            "flashinfer-merge",
            "merge_state",
            "FlashInfer's merge_state of split-KV partials",
            empty_rows=True,
            bias=True,
        ),
    ]
