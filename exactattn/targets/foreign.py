"""Foreign attention implementations as registry entries: torch SDPA and its backends,
FlexAttention, transformers' attention functions, flash-attn and xformers.

Each claim states the arithmetic the implementation documents or its source shows, with
the source named; a claim that the measured error exceeds is a finding.

* SDPA math (``aten/src/ATen/native/transformers/attention.cpp``,
  ``_scaled_dot_product_attention_math``): fp16/bf16 inputs are upcast to fp32 unless
  ``torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)``; one block (the whole
  score row), the output cast back.
* SDPA flash on the CPU (``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``,
  ``cpu_flash_attention``): ``accum_t = opmath_type`` (fp32 for fp16/bf16) for scores,
  ``m``, ``ℓ`` and the output accumulator, ``P`` cast to the input type for reduced types
  (``qk_reduced_data``), key blocks of ``kv_split_size = 512``.
* Its backward (``cpu_flash_attention_backward``) forms dK, dV one block of query rows at a
  time (``qSplitSize`` 32, 64 or 256 by ``n_q``) and adds each block's part to the output
  in the input type: ``qsplit=32`` (the most parts, so it bounds every split), charged by
  :mod:`exactattn.testing.group_sums` (found as fp16/bf16 dV ~1.2–1.4× beyond one rounding
  at n = 256–511, and a float32 dK half a subnormal off at n_k = 1546).
* SDPA default dispatch on the CPU: the flash kernel when it applies, else math; the flash
  claim bounds both.
* FlexAttention compiled on the CPU (``torch/_inductor/codegen/cpp_flex_attention_template.py``):
  ``accum_t`` fp32, ``P`` cast to the input type for reduced types, key blocks of the
  block mask's ``KV_BLOCK_SIZE`` (:data:`exactattn.targets.flex_convention.KV_BLOCK` here, passed to
  ``create_block_mask``; ``torch/_inductor/kernel/flex/flex_cpu.py``); on CUDA the Triton
  template's blocks are not stated.
* GQA backward (``enable_gqa``; transformers' ``repeat_kv``): ``K, V`` are expanded over the
  group, so each head's ``dK_h, dV_h`` is rounded to the input dtype and the group summed in
  it (autograd of ``repeat_interleave`` / ``expand``): ``group=input`` in the claims of SDPA
  and transformers (:mod:`exactattn.testing.group_sums`).
* transformers ``eager_attention_forward`` (Llama): ``Q Kᵀ`` in the input dtype, softmax in
  fp32 then cast to the input dtype, ``P V`` in the input dtype: naive attention.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from .flex_convention import KV_BLOCK
from .target import FLOAT_DTYPES, REVERSES, Capabilities, Claim, Options, Target

CPU_QSPLIT = 32  # the CPU flash backward's smallest query split (32, 64 or 256 rows)
# FA-2 policy (docstring); whether the CPU flash kernel flushes bf16 subnormals is measured
SDPA_CLAIM = Claim(block=512, group="input", qsplit=CPU_QSPLIT)
OWN_DROPOUT = "own"
NO_SOFTCAP = "the calling convention has no soft-cap"
CAUSAL_NEGATIVE_SCALE = "sdpa-causal-negative-scale"  # exactattn.testing.known.UPSTREAM


@functools.cache
def cpu_flash_flush() -> str | None:
    """``"bfloat16"`` where torch's CPU flash SDPA kernel flushes bf16 subnormals, else None:
    a measured probe, run once per process (:attr:`Options.ftz_probe`).

    Whether it flushes depends on the machine, not on torch: its bf16 GEMMs and casts go
    through oneDNN, whose AVX512-BF16 and AMX code flushes (``vdpbf16ps``,
    ``vcvtneps2bf16``) and whose AVX2 and AVX-512 code rounds, chosen by oneDNN's own CPU
    detection (``ONEDNN_MAX_CPU_ISA``), not by ``ATEN_CPU_CAPABILITY``. The probe: n = 64
    queries ``q_i = 2^-128·e_0`` (bf16 subnormals), keys 0 (so ``p_ij = 1/64``), values
    ``±e_0`` alternating and ``G_i = e_0``, so δ = 0, γ_ij = ±1/64 and the exact
    ``dK_j = c·Σ_i γ_ij q_i = ±c·2^-128 = ±2^-129.5``, a bf16 subnormal: a kernel that flushes
    returns 0, one that rounds returns it within a subnormal spacing. 64 rows, since the
    kernel's smaller problems (≤ 16 rows, measured) take a path that rounds."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    n, d = 64, 8
    q, k, v, g = (torch.zeros(1, 1, n, d, dtype=torch.bfloat16) for _ in range(4))
    q[..., 0], g[..., 0] = 2.0**-128, 1.0
    v[..., 0::2, 0], v[..., 1::2, 0] = 1.0, -1.0
    k.requires_grad_()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.enable_grad():
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        (dk,) = torch.autograd.grad(y, k, g)
    return "bfloat16" if bool((dk[..., 0] == 0).all()) else None


@functools.cache
def _attr(module: str, name: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _loader(module: str, name: str) -> Any:
    return lambda: _attr(module, name)


def _sdpa(name: str, backend: str | None, description: str) -> Target:
    cuda_only = backend in ("efficient", "cudnn")
    caps = Capabilities(
        devices=("cuda",) if cuda_only else ("cpu", "cuda"),
        dropout=OWN_DROPOUT if backend != "flash" else "the CPU flash kernel takes no dropout",
        equal_head_dims=backend == "flash",
        bias=True,
        softcap=NO_SOFTCAP,
    )
    policy = "upcast" if backend == "math" else "fa2"
    block = 0 if backend == "math" else (512 if backend in (None, "flash") else None)
    return Target(
        name=name,
        convention="sdpa",
        loader=_loader("torch.nn.functional", "scaled_dot_product_attention"),
        caps=caps,
        claim=Claim(
            block=block,
            group="input",
            qsplit=None if backend == "math" else CPU_QSPLIT,
        ),
        description=description,
        requires=("torch",),
        needs_cuda=cuda_only,
        options=Options(
            sdpa_backend=backend,
            policy=policy,
            block_by_device=(("cuda", None),),
            ftz_probe=None if backend == "math" else cpu_flash_flush,
            reverses=(("ml", "rowsum"),) if backend == "math" else REVERSES,  # naive autograd
            known=() if backend in ("math", "efficient", "cudnn") else (CAUSAL_NEGATIVE_SCALE,),
        ),
    )


def _flex() -> Target:
    return Target(
        name="flex",
        convention="flex",
        loader=_loader("torch.nn.attention.flex_attention", "flex_attention"),
        caps=Capabilities(
            dtypes=FLOAT_DTYPES[1:],  # compiled Flex on the CPU takes no float64
            devices=("cpu", "cuda"),
            dropout="FlexAttention has no dropout",
            lse=True,
            bias=True,
            softcap=True,
            program=True,
        ),
        claim=Claim(block=KV_BLOCK),
        description="FlexAttention through torch.compile, block mask from create_block_mask",
        requires=("torch",),
        options=Options(policy="fa2", block_by_device=(("cuda", None),)),
    )


def _hf(name: str, module: str, function: str, mask: str, description: str) -> Target:
    if mask == "additive":
        caps = Capabilities(
            dropout=OWN_DROPOUT,
            empty_rows="an additive finfo.min mask averages every key of a row with none allowed",
            bias=True,
            softcap=NO_SOFTCAP,
        )
        claim = Claim(stats="float32", block=0, group="input")  # repeat_kv: per-head sums
        options = Options(
            mask="additive",
            policy="eager",
            reverses=(("ml", "rowsum"),),  # autograd through naive attention
        )
    else:
        caps = Capabilities(dropout=OWN_DROPOUT, bias=True, softcap=NO_SOFTCAP)
        claim = SDPA_CLAIM
        options = Options(
            mask="bool",
            policy="fa2",
            block_by_device=(("cuda", None),),
            ftz_probe=cpu_flash_flush,  # calls SDPA's default dispatch: the same kernel
            known=(CAUSAL_NEGATIVE_SCALE,),  # passes is_causal to SDPA on square problems
        )
    return Target(
        name=name,
        convention="hf",
        loader=_loader(module, function),
        caps=caps,
        claim=claim,
        description=description,
        requires=("torch", "transformers"),
        options=options,
    )


def entries() -> list[Target]:
    """Every built-in foreign entry."""
    return [
        _sdpa("sdpa", None, "torch SDPA, default dispatch"),
        _sdpa("sdpa-math", "math", "torch SDPA forced to the math backend"),
        _sdpa("sdpa-flash", "flash", "torch SDPA forced to the flash backend"),
        _sdpa("sdpa-efficient", "efficient", "torch SDPA forced to memory-efficient (CUDA)"),
        _sdpa("sdpa-cudnn", "cudnn", "torch SDPA forced to cuDNN (CUDA)"),
        _flex(),
        _hf(
            "hf-sdpa",
            "transformers.integrations.sdpa_attention",
            "sdpa_attention_forward",
            "bool",
            "transformers' registered 'sdpa' attention function",
        ),
        _hf(
            "hf-eager",
            "transformers.models.llama.modeling_llama",
            "eager_attention_forward",
            "additive",
            "transformers' Llama eager_attention_forward",
        ),
        Target(
            name="flash-attn",
            convention="flash",
            loader=_loader("flash_attn", "flash_attn_func"),
            caps=Capabilities(
                dtypes=("float16", "bfloat16"),
                devices=("cuda",),
                dropout=OWN_DROPOUT,
                lse=True,
                bias=True,  # as ALiBi slopes only: the convention says when not
                softcap=True,
            ),
            claim=Claim(),
            description="flash-attn's flash_attn_func (FlashAttention-2)",
            requires=("torch", "flash_attn"),
            needs_cuda=True,
            options=Options(policy="fa2"),
        ),
        Target(
            name="xformers",
            convention="xformers",
            loader=_loader("xformers.ops", "memory_efficient_attention"),
            caps=Capabilities(
                dtypes=FLOAT_DTYPES[1:],
                devices=("cuda",),
                dropout=OWN_DROPOUT,
                gqa="the xformers convention here passes one head per key/value head",
                bias=True,
                softcap=NO_SOFTCAP,
            ),
            claim=Claim(),
            description="xformers.ops.memory_efficient_attention",
            requires=("torch", "xformers"),
            needs_cuda=True,
            options=Options(policy="fa2"),
        ),
    ]
