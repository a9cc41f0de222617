"""A stand-in for FlashInfer on the CPU, written from the maths in plain torch (not exactattn).

:func:`make` returns a module named ``flashinfer`` with FlashInfer 0.7.4's names and
signatures (``single_prefill_with_kv_cache``, ``single_decode_with_kv_cache``,
``BatchPrefillWithPagedKVCacheWrapper``, ``merge_state``), computing as FlashAttention-2
does: scores ``s_ij = c·q_i·k_j`` (soft-capped ``cap·tanh(s/cap)``) in float32, the row max
``m_i``, ``p_ij = e^{s_ij − m_i}``, ``ℓ_i = Σ_j p_ij`` in float32, ``P`` rounded to the input
dtype before ``z_i = Σ_j p_ij v_j`` (float32), ``y_i = z_i/ℓ_i`` rounded once; the lse in
base 2, ``lse₂ = (m_i + ln ℓ_i)·log₂e``. Masks: causal aligned bottom-right (``j ≤ i + n_k −
n_q``), ``window_left = w``: ``j ≥ i + n_k − n_q − w``. Query head ``h`` reads key/value head
``h // (H/H_kv)``. Like the real kernels it takes float16/bfloat16 only, tensors whose last
dimension is contiguous (``merge_state``: contiguous), ``custom_mask`` (True = attend) in
place of ``causal``, and raises on arguments it does not model, naming them.

``make(flaw)`` builds the same module with one mistake a real kernel could make
(:data:`FLAWS`), for the checks' broken twins.
"""

from __future__ import annotations

import importlib.machinery
import math
import types

import torch

LOG2_E = 1 / math.log(2)
FLAWS = {
    "top-left": "causal aligned top-left (j <= i) instead of bottom-right",
    "lse-base-e": "the lse returned in base e where base 2 is the contract",
    "decode-short": "decode reading kv_len - 1 keys (the newest key left out)",
    "page-off-by-one": "the paged cache read one page on (page id + 1)",
    "merge-base-e": "merge_state reading its base-2 lse as natural",
}
DTYPES = (torch.float16, torch.bfloat16)


def _check(name: str, x: torch.Tensor, dims: int) -> None:
    if x.dtype not in DTYPES:
        raise ValueError(f"{name} has dtype {x.dtype}; FlashInfer takes float16 or bfloat16")
    if x.dim() != dims:
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {dims} dims")
    if x.stride(-1) != 1:
        raise ValueError(f"{name}'s last dimension is not contiguous (stride {x.stride(-1)})")


def _unmodelled(**given: object) -> None:
    """Raise for an argument given a value this stand-in does not model."""
    defaults = {"kv_layout": "NHD", "pos_encoding_mode": "NONE"}
    for name, value in given.items():
        unset = value == defaults[name] if name in defaults else value is None or value is False
        if not unset:
            raise ValueError(f"{name}={value!r}: the fake FlashInfer does not model it")


def _allowed(n_q: int, n_k: int, causal: bool, window_left: int, flaw: str | None):
    """The ``(n_q, n_k)`` mask: causal bottom-right and the left window (see the docstring)."""
    i, j = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
    offset = 0 if flaw == "top-left" else n_k - n_q
    allowed = torch.ones(n_q, n_k, dtype=torch.bool)
    if causal:
        allowed &= j <= i + offset
    if window_left >= 0:
        allowed &= j + n_q + window_left >= n_k + i
    return allowed


def _attend(q, k, v, allowed, sm_scale, logits_soft_cap, flaw):
    """``(y (n_q, H, v), lse₂ (n_q, H))`` of ``q (n_q, H, d)``, ``k, v (n_k, H_kv, ·)``."""
    H, H_kv = q.shape[1], k.shape[1]
    if H % H_kv:
        raise ValueError(f"num_qo_heads {H} is not a multiple of num_kv_heads {H_kv}")
    heads = torch.arange(H) // (H // H_kv)
    c = 1 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    qf = q.float().transpose(0, 1)  # (H, n_q, d)
    kf, vf = (x.float()[:, heads].transpose(0, 1) for x in (k, v))  # (H, n_k, ·)
    s = c * qf @ kf.transpose(1, 2)
    if logits_soft_cap:
        s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
    s = torch.where(allowed, s, -math.inf)
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isinf(m), 0.0, m))
    l = p.sum(-1, keepdim=True)
    z = p.to(q.dtype).float() @ vf  # P rounded to the input dtype before P·V
    y = torch.where(l > 0, z / l, 0.0).to(q.dtype).transpose(0, 1)
    lse = (m + torch.log(l)).squeeze(-1).transpose(0, 1)
    return y, lse if flaw == "lse-base-e" else lse * LOG2_E


def make(flaw: str | None = None) -> types.ModuleType:
    """The stand-in module, correct or with ``flaw`` (a key of :data:`FLAWS`)."""
    if flaw is not None and flaw not in FLAWS:
        raise ValueError(f"flaw {flaw!r} is not one of {sorted(FLAWS)}")

    def single_prefill_with_kv_cache(
        q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None, custom_mask=None,
        packed_custom_mask=None, causal=False, kv_layout="NHD", pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
        rope_scale=None, rope_theta=None, backend="auto", return_lse=False, kv_cache_sf=None,
        k_scale=None, v_scale=None,
    ):  # fmt: skip
        _unmodelled(
            scale_q=scale_q, scale_k=scale_k, scale_v=scale_v, o_dtype=o_dtype,
            packed_custom_mask=packed_custom_mask, kv_layout=kv_layout,
            pos_encoding_mode=pos_encoding_mode, use_fp16_qk_reduction=use_fp16_qk_reduction,
            kv_cache_sf=kv_cache_sf, k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip
        for name, x in (("q", q), ("k", k), ("v", v)):
            _check(name, x, 3)
        allowed = _allowed(q.shape[0], k.shape[0], causal, window_left, flaw)
        if custom_mask is not None:  # it replaces causal (the real one's docstring)
            if tuple(custom_mask.shape) != tuple(allowed.shape):
                raise ValueError(f"custom_mask has shape {tuple(custom_mask.shape)}")
            allowed = custom_mask.to(torch.bool) & _allowed(
                *allowed.shape, False, window_left, flaw
            )
        y, lse = _attend(q, k, v, allowed, sm_scale, logits_soft_cap, flaw)
        return (y, lse) if return_lse else y

    def single_decode_with_kv_cache(
        q, k, v, kv_layout="NHD", pos_encoding_mode="NONE", use_tensor_cores=False,
        q_scale=None, k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None,
        sm_scale=None, rope_scale=None, rope_theta=None, return_lse=False,
    ):  # fmt: skip
        _unmodelled(
            kv_layout=kv_layout, pos_encoding_mode=pos_encoding_mode, q_scale=q_scale,
            k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip
        _check("q", q, 2)
        for name, x in (("k", k), ("v", v)):
            _check(name, x, 3)
        if v.shape[-1] != q.shape[-1]:
            raise ValueError(f"v's head dim {v.shape[-1]} is not q's {q.shape[-1]}")
        if flaw == "decode-short" and k.shape[0] > 1:
            k, v = k[:-1], v[:-1]
        allowed = _allowed(1, k.shape[0], False, window_left, flaw)
        y, lse = _attend(q[None], k, v, allowed, sm_scale, logits_soft_cap, flaw)
        return (y[0], lse[0]) if return_lse else y[0]

    class BatchPrefillWithPagedKVCacheWrapper:
        def __init__(
            self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
            qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
            paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
            backend="auto", jit_args=None, jit_kwargs=None, variant_owns_mask=False,
            max_total_num_rows=None,
        ):  # fmt: skip
            _unmodelled(kv_layout=kv_layout, use_cuda_graph=use_cuda_graph)
            self._plan = None

        def plan(
            self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
            num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
            custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
            use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
            rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
            **more,
        ):  # fmt: skip
            _unmodelled(
                custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
                pos_encoding_mode=pos_encoding_mode, use_fp16_qk_reduction=use_fp16_qk_reduction,
            )  # fmt: skip
            last = paged_kv_last_page_len
            if ((last < 1) | (last > page_size)).any():
                raise ValueError(f"paged_kv_last_page_len {last.tolist()} not in 1..{page_size}")
            self._plan = dict(
                qo=qo_indptr.tolist(), kv=paged_kv_indptr.tolist(),
                pages=paged_kv_indices.tolist(), last=last.tolist(), heads=(num_qo_heads,
                num_kv_heads), page_size=page_size, causal=causal, window_left=window_left,
                sm_scale=sm_scale, cap=logits_soft_cap,
                dtype=getattr(torch, q_data_type) if isinstance(q_data_type, str) else q_data_type,
            )  # fmt: skip

        def run(self, q, paged_kv_cache, *args, return_lse=False, lse_base="log2", **more):
            plan = self._plan
            if plan is None:
                raise RuntimeError("run() before plan()")
            if lse_base != "log2":
                raise ValueError(f"lse_base={lse_base!r}: the fake FlashInfer models log2")
            k_cache, v_cache = paged_kv_cache
            _check("q", q, 3)
            if q.dtype != plan["dtype"]:
                raise ValueError(f"q has dtype {q.dtype}; plan() was given {plan['dtype']}")
            pool, size = k_cache.shape[0], plan["page_size"]
            ys, lses = [], []
            for b in range(len(plan["qo"]) - 1):
                pages = plan["pages"][plan["kv"][b] : plan["kv"][b + 1]]
                if flaw == "page-off-by-one":
                    pages = [(page + 1) % pool for page in pages]
                n_k = (len(pages) - 1) * size + plan["last"][b]
                k, v = (torch.cat([c[page] for page in pages])[:n_k] for c in (k_cache, v_cache))
                rows = q[plan["qo"][b] : plan["qo"][b + 1]]
                allowed = _allowed(rows.shape[0], n_k, plan["causal"], plan["window_left"], flaw)
                y, lse = _attend(rows, k, v, allowed, plan["sm_scale"], plan["cap"], flaw)
                ys.append(y)
                lses.append(lse)
            y, lse = torch.cat(ys), torch.cat(lses)
            return (y, lse) if return_lse else y

    def merge_state(v_a, s_a, v_b, s_b):
        for name, x, dims in (("v_a", v_a, 3), ("v_b", v_b, 3)):
            _check(name, x, dims)
        for name, x in (("v_a", v_a), ("s_a", s_a), ("v_b", v_b), ("s_b", s_b)):
            if not x.is_contiguous():
                raise ValueError(f"{name} must be contiguous")
        exp, log = (torch.exp, torch.log) if flaw == "merge-base-e" else (torch.exp2, torch.log2)
        s_a, s_b = s_a.float(), s_b.float()
        s_max = torch.maximum(s_a, s_b)
        shift = torch.where(torch.isinf(s_max), 0.0, s_max)  # two empty states: no NaN
        w_a, w_b = exp(s_a - shift), exp(s_b - shift)
        total = w_a + w_b
        a, b = (torch.where(total > 0, w / total, 0.0)[..., None] for w in (w_a, w_b))
        v = (a * v_a.float() + b * v_b.float()).to(v_a.dtype)
        return v, log(total) + shift

    fake = types.ModuleType("flashinfer", __doc__)
    fake.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None)
    fake.single_prefill_with_kv_cache = single_prefill_with_kv_cache
    fake.single_decode_with_kv_cache = single_decode_with_kv_cache
    fake.BatchPrefillWithPagedKVCacheWrapper = BatchPrefillWithPagedKVCacheWrapper
    fake.merge_state = merge_state
    return fake
