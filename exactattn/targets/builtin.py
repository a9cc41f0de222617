"""exactattn's own configurations as registry entries (the ``api`` and ``exactattn`` conventions).

Each precision configuration — a number system and its policy: ``storage`` (inputs and
outputs), ``compute`` (scores, running ``m, ℓ, z``, accumulators), ``p_cast`` (``p`` is
rounded to it before ``p·V``; the FlashAttention-2 policy casts to the input dtype) and
``quantize`` (per-tensor FP8 inputs, FlashAttention-3 §4.3's baseline) — is one entry;
``mpN`` (any ``N ≥ 2``) is mpmath at ``N`` bits with every operation rounded. ``emuN-rn`` and
``emuN-rz`` (``2 ≤ N ≤ 26``) are ``N`` significand bits emulated on float64 words
(:class:`~exactattn.backends.emulated_backend.EmulatedContext`) with FP64's exponent range,
rounded to nearest-even (``rn``) or truncated (``rz``) after every operation — each whole
operation (a matmul, a row sum, an elementwise op) computed in float64 and its result
rounded: Golden et al.'s (2024) method of truncating an FP64 implementation's mantissas.
Suffixes: ``-fa2`` keeps the FlashAttention-2 policy (inputs and ``p`` in the ``N``-bit
format, everything else in 24 bits, the same rounding), ``-scalar`` rounds every scalar
multiply and add of dot products and sums instead (mpmath's granularity). The sweep
(:mod:`exactattn.precision`), ``exactattn difftest`` and ``exactattn check`` all read these
entries; there is no other list.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from dataclasses import replace
from typing import Any

from .target import Capabilities, Claim, Options, Target

# name: (backend, storage, compute, p_cast, quantize)
CONFIGS: dict[str, tuple[str, str, str, str | None, str | None]] = {
    "np-fp16": ("numpy", "float16", "float16", None, None),
    "np-fp32": ("numpy", "float32", "float32", None, None),
    "np-fp64": ("numpy", "float64", "float64", None, None),
    "np-longdouble": ("numpy", "longdouble", "longdouble", None, None),
    "np-fa2-fp16": ("numpy", "float16", "float32", "float16", None),
    "torch-fp16": ("torch", "float16", "float16", None, None),
    "torch-bf16": ("torch", "bfloat16", "bfloat16", None, None),
    "torch-fp32": ("torch", "float32", "float32", None, None),
    "torch-fp64": ("torch", "float64", "float64", None, None),
    "torch-fa2-fp16": ("torch", "float16", "float32", "float16", None),
    "torch-fa2-bf16": ("torch", "bfloat16", "float32", "bfloat16", None),
    "torch-fp8-e4m3": ("torch", "float32", "float32", "e4m3", "e4m3"),
    "torch-fp8-e5m2": ("torch", "float32", "float32", "e5m2", "e5m2"),
}
MP = re.compile(r"mp(\d+)")
EMU = re.compile(r"emu(\d+)-(rn|rz)(-fa2)?(-scalar)?")
EMU_BITS = (2, 26)  # double rounding through float64 stays within ū of the format up to 26
ROUNDING = {"rn": "nearest", "rz": "toward_zero"}
DIFFTEST_MP = (11, 24, 80)  # the mpmath widths difftest runs
SCORES = {"bias": True, "softcap": True}  # every exactattn entry takes both
SMALL = 600  # n_q·n_k·(d+v)·batch: where the exact and object-array systems stay fast


def _ctx_factory(backend: str, storage: str, compute: str, p_cast: str | None) -> Any:
    def make() -> Any:
        if backend == "numpy":
            from ..backends import NumpyContext

            return NumpyContext(storage, compute=compute, p_cast=p_cast)
        if backend == "mpmath":
            from ..backends import MpmathContext

            return MpmathContext(prec=int(storage[1:]))
        from ..backends import fp8_backend

        return fp8_backend.torch_context(storage, compute, p_cast)

    return make


def _emulated_factory(bits: int, rounding: str, fa2: bool, granularity: str) -> Any:
    def make() -> Any:
        from ..backends.emulated_backend import EmulatedContext, EmulatedFormat

        if not fa2:
            return EmulatedContext(bits, exponent=11, rounding=rounding, granularity=granularity)
        narrow = EmulatedFormat.of(bits, 11, rounding)
        return EmulatedContext(
            24,
            exponent=11,
            rounding=rounding,
            granularity=granularity,
            storage=narrow,
            p_cast=narrow,
        )

    return make


def emulated_target(name: str) -> Target:
    """The entry of an emulated format ``emuN-rn|rz[-fa2][-scalar]`` (module docstring)."""
    match = EMU.fullmatch(name)
    if match is None:
        raise ValueError(f"{name!r} is not emuN-rn or emuN-rz (optionally -fa2, -scalar)")
    bits, mode, fa2, scalar = int(match.group(1)), match.group(2), match.group(3), match.group(4)
    if not EMU_BITS[0] <= bits <= EMU_BITS[1]:
        raise ValueError(
            f"{name!r}: emuN takes {EMU_BITS[0]} <= N <= {EMU_BITS[1]} significand bits "
            "(beyond 26, rounding float64 results twice may exceed the format's unit roundoff)"
        )
    rounding, granularity = ROUNDING[mode], "scalar" if scalar else "op"
    narrow, wide = f"p{bits}", "p24" if fa2 else f"p{bits}"
    policy = "FA-2 policy (24-bit compute, p cast), " if fa2 else ""
    return Target(
        name=name,
        convention="api",
        loader=lambda: None,
        caps=Capabilities(dtypes=("float64",), max_size=None if not scalar else SMALL * 100),
        claim=Claim(input=narrow, scores=wide, stats=wide, p=narrow, acc=wide, block=None),
        description=f"emulated {bits}-bit significand, FP64 exponent range, {rounding} after "
        f"every {'scalar operation' if scalar else 'operation'}, {policy}inputs rounded",
        options=Options(
            ctx=_emulated_factory(bits, rounding, bool(fa2), granularity),
            backend="emulated",
            storage=narrow,
            compute=wide,
            p_cast=narrow if fa2 else None,
            rounding=rounding,
            granularity=granularity,
            exact_block=True,
            reverses=(("ml", "gy"),),
        ),
        family="emulated",
    )


def config_target(name: str) -> Target:
    """The entry of a precision configuration (a key of :data:`CONFIGS`, ``mpN``, ``emu…``
    or a low-bit scheme)."""
    if EMU.fullmatch(name):
        return emulated_target(name)
    from ..error.lowbit import SCHEMES

    if name in SCHEMES:
        return lowbit_target(name)
    match = MP.fullmatch(name)
    if match:
        bits = int(match.group(1))
        if bits < 2:
            raise ValueError(f"mpN needs N >= 2 significand bits; got {name!r}")
        fmt = f"p{bits}"
        spec: tuple[str, str, str, str | None, str | None] = ("mpmath", fmt, fmt, None, None)
    else:
        spec = CONFIGS[name]
    backend, storage, compute, p_cast, quantize = spec
    claim = Claim(
        input=quantize or storage,
        scores=compute,
        stats=compute,
        p=p_cast or compute,
        acc=compute,
        block=None,  # the case's block size: see exactattn's entries in testing.tolerance
    )
    caps = Capabilities(
        dtypes=(quantize or storage,),
        max_size=SMALL if backend == "mpmath" else None,
        **SCORES,
        program=True,
    )
    family = "mpmath" if backend == "mpmath" else backend
    return Target(
        name=name,
        convention="api",
        loader=lambda: None,
        caps=caps,
        claim=claim,
        description=_describe(backend, storage, compute, p_cast, quantize),
        requires=("torch",) if backend == "torch" else (),
        options=Options(
            ctx=_ctx_factory(backend, storage, compute, p_cast),
            backend=backend,
            storage=storage,
            compute=compute,
            p_cast=p_cast,
            quantize=quantize,
            fine=backend == "mpmath" and int(storage[1:]) > 53,
            difftest=quantize is None and (backend != "mpmath" or int(storage[1:]) in DIFFTEST_MP),
            exact_block=True,
            reverses=(("ml", "gy"),),  # the tiled reverse: frozen m, ℓ; δ = G·Y
        ),
        family=family,
    )


def lowbit_target(name: str) -> Target:
    """The entry of a low-bit attention scheme (:data:`exactattn.error.lowbit.SCHEMES`): fp32
    storage and compute on inputs it quantises itself (:meth:`Scheme.hold`), forward only,
    claiming its own arithmetic in the claim grammar (:func:`~exactattn.error.lowbit_claim.
    claim_text`); every mask (reverse key order reverses the mask with the keys, and is
    bounded for any key-block partition, ``exact_block=False``: its blocks are not the
    case's). ``exactattn check NAME`` and ``exactattn sweep --preset lowbit``
    both run it."""
    from ..error.lowbit import SCHEMES
    from ..error.lowbit_claim import claim_text

    scheme = SCHEMES[name]
    return scheme_target(name, scheme, Claim.parse(claim_text(scheme)))


def scheme_target(name: str, scheme: Any, claim: Claim) -> Target:
    """A target that runs the low-bit ``scheme`` (:class:`exactattn.error.lowbit.Scheme`:
    it quantises its inputs, then the tiled algorithm over its context) under ``claim``
    (:func:`lowbit_target`: the scheme's own; a kernel that does not do what it claims is
    one whose scheme and claim differ)."""
    return Target(
        name=name,
        convention="api",
        loader=lambda: None,
        caps=Capabilities(
            dtypes=("float32",),
            grads="low-bit schemes run forward only",
            dropout="low-bit schemes take no dropout (a scaled cast of p·ρ may saturate)",
            lse="K smoothing shifts row i's scores by c·q_i·k̄: its lse is not the input's"
            if scheme.smooth_k
            else True,
            bias="low-bit schemes take no bias",
            softcap="low-bit schemes take no soft-cap",
        ),
        claim=claim,
        description=f"low-bit scheme: {scheme.source}",
        options=Options(
            ctx=scheme.ctx,
            backend="lowbit",
            storage="float32",
            compute="float32",
            p_cast=None,
            quantize=name,
            holds=lambda inputs: scheme.hold(inputs)["inputs"],
            exact_block=not scheme.reverse,
            reverses=(("ml", "gy"),),
        ),
        family="lowbit",
    )


def _describe(backend: str, storage: str, compute: str, p_cast: str | None, quantize) -> str:
    parts = [f"{backend} tiled: {storage} storage, {compute} compute"]
    if p_cast:
        parts.append(f"p cast to {p_cast}")
    if quantize:
        parts.append(f"per-tensor {quantize} inputs")
    return ", ".join(parts)


def _naive_numpy() -> Target:
    base = config_target("np-fp32")
    return Target(
        name="np-naive-fp32",
        convention="api",
        loader=base.loader,
        caps=base.caps,
        claim=Claim(input="float32", block=0),
        description="numpy naive (materialising) attention in float32",
        options=replace(
            base.options, path="naive", exact_block=False, reverses=(("ml", "rowsum"),)
        ),
        family="numpy",
    )


def _sympy() -> Target:
    def make() -> Any:
        from ..backends import SympyContext

        return SympyContext()

    return Target(
        name="sympy",
        convention="api",
        loader=lambda: None,
        caps=Capabilities(
            dtypes=("float64",),
            dropout="the exact run is kept to tiny integer cases",
            batch_dims=(0, 1),
            max_n=3,
            **SCORES,
            program=True,
        ),
        claim=Claim(input="float64", scores="p150", stats="p150", p="p150", acc="p150"),
        description="sympy: exact symbols (rational inputs, Y in closed form, 50 digits)",
        options=Options(ctx=make, backend="sympy", fine=True, difftest=True),
        family="sympy",
        rate=5,
    )


def _flint() -> Target:
    def make() -> Any:
        from ..backends.flint_backend import FlintContext

        return FlintContext(53)

    return Target(
        name="flint",
        convention="api",
        loader=lambda: None,
        caps=Capabilities(dtypes=("float64",), max_size=2000, **SCORES, program=True),
        claim=Claim(input="float64", scores="p200", stats="p200", p="p200", acc="p200"),
        description="python-flint arb balls at 53 bits: each output must enclose the exact value",
        requires=("flint",),
        options=Options(ctx=make, backend="flint", enclosure=True, difftest=True),
        family="flint",
    )


@functools.cache
def _torch_attention() -> Any:
    from .. import torch as exactattn_torch

    return exactattn_torch.attention


def _exactattn_torch() -> Target:
    return Target(
        name="exactattn",
        convention="exactattn",
        loader=_torch_attention,
        caps=Capabilities(devices=("cpu", "cuda"), **SCORES, program=True),  # its mask_mod
        claim=Claim(),  # resolved per dtype: see fa2_claim
        description="exactattn.torch.attention (generic path; FA-2 policy for fp16/bf16)",
        requires=("torch",),
        options=Options(
            keywords=(("impl", "generic"),),
            policy="fa2",
            exact_block=True,
            reverses=(("lse", "gy"),),  # exactattn.torch freezes lse (ℓ = 1)
        ),
        family="torch",
    )


@functools.cache
def _triton_attention() -> Any:
    import torch

    if not torch.cuda.is_available():
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("triton was imported for a GPU that is not here")
        os.environ["TRITON_INTERPRET"] = "1"  # before triton decorates anything
    return _torch_attention()


def _triton_check() -> str | None:
    """Import the kernels the way they must be (the interpreter chosen before triton loads)."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    try:
        _triton_attention()
        from ..torch import dispatch

        dispatch.triton()
    except Exception as error:
        return f"the Triton kernels do not load: {type(error).__name__}: {error}"
    return None


def _exactattn_triton() -> Target:
    return Target(
        name="exactattn-triton",
        convention="exactattn",
        loader=_triton_attention,
        caps=Capabilities(
            dtypes=("float32", "float16", "bfloat16"),
            devices=("cuda", "cpu"),
            dropout="the Triton kernels take no dropout",
            empty_rows="the Triton kernels assume every row has an allowed key",
            max_size=None,
            **SCORES,
        ),
        claim=Claim(block=None),  # FA-2 policy; kernel block sizes are the kernels' own
        description="exactattn.torch.attention(impl='triton'): the FlashAttention-2 kernels "
        "(CUDA; on the CPU under TRITON_INTERPRET=1, sampled)",
        requires=("torch",),
        options=Options(
            keywords=(("impl", "triton"),),
            policy="fa2",
            triton=True,
            check=_triton_check,
            reverses=(("lse", "gy"),),
        ),
        family="triton",
        rate=25,  # on the CPU (the interpreter is slow); every case on CUDA
    )


def fa2_claim(dtype: str) -> Claim:
    """FlashAttention-2's policy for ``dtype``: fp32 statistics and accumulators, ``p``
    cast to the input for fp16/bf16; the input's own arithmetic for fp32/fp64."""
    if dtype in ("float16", "bfloat16"):
        return Claim(input=dtype, scores="float32", stats="float32", p=dtype, acc="float32")
    return Claim(input=dtype)


def entries() -> list[Target]:
    """Every built-in exactattn entry (``mpN`` beyond the listed widths on demand)."""
    from ..error.lowbit import SCHEMES

    out = [config_target(name) for name in CONFIGS]
    out += [config_target(f"mp{bits}") for bits in DIFFTEST_MP]
    out += [lowbit_target(name) for name in SCHEMES]
    out += [_naive_numpy(), _sympy(), _flint(), _exactattn_torch(), _exactattn_triton()]
    return out
