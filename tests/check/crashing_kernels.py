"""Kernels that crash or hang their process on one size, for the isolation test: torch's SDPA
(math backend), except that 7 keys segfault the process and 9 keys never return."""

from __future__ import annotations

import ctypes
import time

import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def crashes_on_seven_keys(q, k, v, attn_mask=None, is_causal=False, scale=None):
    if k.shape[-2] == 7:
        ctypes.string_at(0)  # reads address 0: SIGSEGV, as a native library's bug would
    if k.shape[-2] == 9:
        time.sleep(3600)
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=is_causal, scale=scale)
