"""What a target is: a callable, its calling convention, what it supports, what it claims.

A :class:`Target` names an attention implementation under test. Its callable is loaded on
first use (:meth:`Target.load`), so the registry can list torch or transformers targets
without importing either. :class:`Capabilities` say which cases it takes (every other case
is skipped with the reason, never passed); :class:`Claim` states its arithmetic — the
formats of the inputs, the scores ``s``, the statistics ``m, ℓ, lse``, the weights ``p``
before the ``P·V`` product and the accumulators, and its key-block size ``b`` — from which
the tolerance is derived (:func:`exactattn.testing.tolerance.bounds`).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..backends.formats import Format, canonical_name, format_names, number_format
from ..error.bounds import Arith
from ..error.lowbit import ACC_FORMATS, Scheme, p_format
from ..error.lowbit_claim import (
    ACCUMULATORS,
    LOWBIT_FIELDS,
    P_CASTS,
    accumulator_name,
    parse_value,
    scheme_of,
)

FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")
CLAIM_FIELDS = (
    "input",
    "scores",
    "stats",
    "p",
    "acc",
    "block",
    "group",
    "qsplit",
    "ftz",
    "dp",
    "pv_acc",
    *LOWBIT_FIELDS,
)
NAIVE_BLOCK = 0  # ``block=0``: one block spanning every key (naive attention)


@dataclass(frozen=True)
class Claim:
    """The arithmetic a target claims; ``None`` formats default to the input's.

    ``input=None`` means "the dtype of the case", so one claim serves a target that runs in
    several dtypes. ``group``: the format a GQA backward sums a group's per-head dK, dV in,
    each rounded to the output format first (``input``: the input's, as torch's SDPA does;
    None: the group is summed before any rounding, :mod:`exactattn.testing.group_sums`).
    ``qsplit``: a backward that forms dK, dV one block of ``qsplit`` query rows at a time,
    rounds each block's part to the output format and sums the parts in it (torch's CPU
    flash backward; None: one rounding of the whole sum).
    ``ftz``: a format whose casts from the compute format (``p``, γ, the outputs, the parts
    and group sums) flush subnormal results to zero, as torch's CPU flash kernel's
    fp32 → bf16 conversions do where its oneDNN runs AVX512-BF16 or AMX code (measured per
    machine: :attr:`Options.ftz_probe`; a bf16 dK whose exact value is
    1.06e-38 returned 0; its fp16 casts round them): each such cast then errs by up to the
    smallest normal number, not half the subnormal spacing. An accumulator with that
    format's exponent range (fp32 beside bf16) flushes too: the kernel's GEMMs sum
    ``γ·q`` before the scale ``c`` with subnormals flushed (measured: bf16 dK = 0 where the
    exact value is 2.09e-38, up to ``|c|·2^-126``, on the replay of a 2000-case check).
    A compute format that is the ``ftz`` format flushes every rounding (OpenVINO's bf16).
    Several formats join by ``+``: ``float32+bfloat16``, a runtime that flushes every float32
    result and every bfloat16 cast (XLA on the CPU, whose executions run with FTZ set).
    ``dp``: the format the reverse rounds ``dP = G·Vᵀ`` to before γ (``input``: the input's,
    as autodiff through a ``P·V`` product in the input dtype does — JAX's; None: the compute
    format, as FlashAttention-2's kernels keep it).
    ``pv_acc``: the format each key block's ``P·V`` is accumulated in, then added to an
    ``acc`` buffer, when it is not ``acc`` (SageAttention's float16 MMA beside float32 ``m, ℓ``;
    None: ``acc``).
    ``block=None`` means "not stated": the bound then assumes the worst case,
    one key per block; ``block=0`` is one block over all keys (naive attention).

    A low-bit kernel (:mod:`exactattn.error.lowbit_claim`, the grammar): ``q``, ``k``, ``v``
    how it quantises each input (``e4m3:block128``, ``int8:block16``, ``e2m1:group32:e8m0``,
    ``nvfp4``), ``smooth`` (``q128+k``), ``rotate`` (``hadamard``), ``p`` a low-bit cast
    (``e4m3``, ``nvfp4``) with its static scale ``p_scale``, ``pv_acc`` (also ``fp22``) and
    ``pv_chunk``; the kernel is given the case's inputs and quantises them itself, and the
    quantisation is charged to the one :class:`~exactattn.error.bounds.Arith`
    (:meth:`scheme`); with ``quantiser=nearest`` the quantiser is stated, and the reference
    is taken at the quantised inputs instead (:meth:`Variant.reference_inputs`).
    """

    input: str | None = None
    scores: str | None = None
    stats: str | None = None
    p: str | None = None
    acc: str | None = None
    block: int | None = None
    group: str | None = None
    qsplit: int | None = None
    ftz: str | None = None
    dp: str | None = None
    pv_acc: str | None = None
    q: str | None = None
    k: str | None = None
    v: str | None = None
    smooth: str | None = None
    rotate: str | None = None
    p_scale: float | None = None
    pv_chunk: int | None = None
    quantiser: str | None = None

    @classmethod
    def parse(cls, text: str) -> Claim:
        """``input=fp16,scores=fp32,stats=fp32,p=fp16,acc=fp32,block=128,group=input`` (any
        subset)."""
        values: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or key not in CLAIM_FIELDS:
                raise ValueError(
                    f"--claim item {item!r} is not KEY=VALUE with KEY one of {CLAIM_FIELDS}"
                )
            if key == "qsplit":
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"--claim qsplit must be an integer >= 1; got {value!r}")
                values[key] = int(value)
                continue
            if key == "block":
                if value in ("naive", "all"):
                    values[key] = NAIVE_BLOCK
                    continue
                if not value.isdigit():
                    raise ValueError(f"--claim block must be an integer >= 0; got {value!r}")
                values[key] = int(value)
            elif key in ("group", "dp") and value == "input":
                values[key] = value
            elif key == "ftz":  # no, a format, or formats joined by + (float32+bfloat16)
                values[key] = None if value == "no" else "+".join(format_names(value))
            elif key in LOWBIT_FIELDS:
                values[key] = parse_value(key, value)
            elif key == "p" and value == "nvfp4":
                values[key] = value
            elif key == "pv_acc":
                if value not in ACCUMULATORS and value not in ("float32", "float16"):
                    raise ValueError(
                        f"--claim pv_acc={value!r}: unknown accumulator; use one of {ACCUMULATORS}"
                    )
                values[key] = canonical_name(value) if value in ("fp32", "fp16") else value
            else:
                values[key] = canonical_name(value)
        if values.get("quantiser") == "nearest" and not any(x in values for x in "qkv"):
            raise ValueError(
                "--claim quantiser=nearest states how q, k or v are quantised: give one of "
                "q=, k=, v= (e4m3:block128, int8:token, nvfp4, …)"
            )
        return cls(**values)

    def arith(self, block: int | None) -> Arith:
        """The arithmetic of this (resolved) claim at key-block size ``block``: the coarser
        of the score and statistics formats computes, an accumulator finer than it sums each
        product and row sum before one rounding into it (bf16 scores of an fp32 GEMM), ``p`` —
        and in the reverse ``p`` and ``γ`` — is cast when it is coarser (FlashAttention-2's
        kernels), outputs are in the input format."""
        compute = max((number_format(self.scores), number_format(self.stats)), key=lambda f: f.u)
        flushed = self.flushed()
        if compute.name in flushed and compute.e_min is not None:  # computes in what flushes
            compute = replace(compute, e_min=compute.e_min + compute.p)

        def fmt(name: str) -> Format:  # a narrower cast that flushes: μ = the least normal
            f = number_format(name)
            if f.name in flushed and f.e_min is not None and f.p < compute.p:
                return replace(f, e_min=f.e_min + f.p)
            return f

        if (self.p in P_CASTS and self.p != "fp16") or self.p_scale not in (None, 1.0):
            p = p_format(self.p, self.p_scale or 1.0)  # a low-bit cast of p·S, then /S
        else:
            p = fmt(self.p) if fmt(self.p).u > compute.u else None
        acc = number_format(self.acc)  # a finer accumulator too (fp16 GEMMs summing in fp32)
        if any(acc.e_min == number_format(name).e_min for name in flushed):
            acc = replace(acc, e_min=acc.e_min + acc.p)  # its GEMMs' accumulators flush too
        return Arith(
            input=number_format(self.input),
            compute=compute,
            acc=acc,
            output=fmt(self.input),
            p=p,
            grad_cast=p,  # a kernel that casts p for P·V casts p and γ for the reverse's GEMMs
            block=block,
            p_normalized=self.block == NAIVE_BLOCK,  # naive attention: P = softmax(S), then P·V
            dp=None if self.dp is None else number_format(self.dp),
            pv_acc=None if self.pv_acc is None else _accumulator(self.pv_acc),
            pv_chunk=self.pv_chunk,
        )

    def scheme(self) -> Scheme | None:
        """The low-bit scheme of this claim's quantisation, smoothing and rotation (None when
        it states none): the kernel quantises the inputs it is given, and
        :meth:`Scheme.quantised` charges that to :meth:`arith`'s arithmetic."""
        return scheme_of(self)

    def flushed(self) -> tuple[str, ...]:
        """The formats whose results ``ftz`` flushes (``float32+bfloat16``: both)."""
        return tuple(self.ftz.split("+")) if self.ftz else ()

    def resolve(self, dtype: str) -> Claim:
        """Every format filled in for inputs of ``dtype`` (unstated ones follow the input)."""
        source = self.input or dtype
        return replace(
            self,
            input=source,
            scores=self.scores or source,
            stats=self.stats or source,
            p=self.p or source,
            acc=self.acc or source,
            group=source if self.group == "input" else self.group,
            dp=source if self.dp == "input" else self.dp,
        )

    def bound_block(self, n_k: int) -> int | None:
        """The block size the bound assumes for ``n_k`` keys (None: unstated, the worst case)."""
        if self.block is None:
            return None
        return max(n_k, 1) if self.block == NAIVE_BLOCK else self.block

    def as_text(self) -> str:
        """The ``--claim`` text that parses back to this claim."""
        parts = [
            f"{name}={getattr(self, name)}"
            for name in CLAIM_FIELDS
            if getattr(self, name) is not None
        ]
        return ",".join(parts)


def _accumulator(name: str) -> Format:
    """A ``pv_acc`` as a format of the bound (``fp22``: truncating, one bit fewer)."""
    return ACC_FORMATS.get(accumulator_name(name)) or number_format(name)


@dataclass(frozen=True)
class Capabilities:
    """Which cases a target takes; anything else is skipped and counted with the reason.

    ``grads`` / ``dropout`` / ``lse`` / ``empty_rows``: ``True`` when supported, else a
    string saying why not. ``dropout=True`` means the target replays exactattn's keep-bits
    (compared element by element); ``"own"`` means it draws its own (checked by the dropout
    probe, :mod:`exactattn.testing.probes`). ``bias``: takes an additive float bias (``−∞``
    entries exclude pairs); ``softcap``: takes ``cap·tanh(s/cap)``; ``program``: runs a
    user's FlexAttention ``mask_mod`` / ``score_mod`` itself (``exactattn check --mask-mod``;
    a target that would only see the mask materialised, or not the score_mod at all, says
    why not). ``negative_scale``: takes a scale ``c < 0``. ``max_size`` bounds
    ``n_q·n_k·(d+v)·batch`` for slow number systems.
    """

    dtypes: tuple[str, ...] = FLOAT_DTYPES
    devices: tuple[str, ...] = ("cpu",)
    grads: bool | str = True
    dropout: bool | str = True
    lse: bool | str = "the calling convention returns no log-sum-exp"
    gqa: bool | str = True
    cross: bool | str = True
    empty_rows: bool | str = True
    bias: bool | str = "takes no bias (not stated)"
    softcap: bool | str = "takes no soft-cap (not stated)"
    negative_scale: bool | str = True
    program: bool | str = "runs no FlexAttention program (mask_mod / score_mod)"
    equal_head_dims: bool = False  # needs v == d
    batch_dims: tuple[int, ...] = (0, 1, 2)  # leading dims it accepts
    max_size: int | None = None
    max_n: int | None = None  # largest n_q, n_k, d, v and batch element count
    masks: tuple[str, ...] | None = None  # mask kinds taken (None: all the convention can)

    @classmethod
    def parse(cls, text: str, base: Capabilities | None = None) -> Capabilities:
        """``masks=none+causal,gqa=no,dropout=own,grads=no,dtypes=float16+bfloat16`` (any
        subset; ``yes``/``no`` for the features; lists joined by ``+``, dtypes also by spaces
        as ``--dtypes`` takes them: :func:`~exactattn.backends.formats.format_names`) over
        ``base``."""
        base = base or cls()
        lists = {"dtypes", "devices", "masks"}
        flags = {"grads", "dropout", "lse", "gqa", "cross", "empty_rows", "equal_head_dims"}
        flags |= {"bias", "softcap", "program", "negative_scale"}
        values: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = (x.strip() for x in item.partition("="))
            if not sep or key not in lists | flags:
                raise ValueError(
                    f"--supports item {item!r} is not KEY=VALUE with KEY one of "
                    f"{sorted(lists | flags)}"
                )
            if key == "dtypes":
                values[key] = format_names(value)  # as --dtypes reads them
            elif key in lists:
                values[key] = tuple(filter(None, value.split("+")))
            elif key == "equal_head_dims":
                values[key] = value == "yes"
            elif value in ("yes", "no", "own"):
                values[key] = {"yes": True, "no": "not supported (--supports)", "own": "own"}[value]
            else:
                raise ValueError(
                    f"--supports {key} takes yes, no (or own for dropout); got {value!r}"
                )
        return replace(base, **values)


REVERSES = (("ml", "gy"), ("lse", "gy"), ("ml", "rowsum"))  # (frozen stats, δ) a reverse uses


@dataclass(frozen=True)
class Options:
    """What a calling convention and the judge read of a target besides its callable.

    exactattn's own number systems (the ``api`` convention): ``ctx`` makes the context,
    ``backend`` names its family (``numpy``, ``torch``, ``mpmath``, ``sympy``, ``flint``,
    ``emulated``: what the judge and the sweep group by; the convention asks the context
    itself how to convert), ``storage`` / ``compute`` / ``p_cast`` / ``quantize`` its formats (a
    precision configuration), ``rounding`` and ``granularity`` an emulated format's,
    ``fine``: its outputs are far finer than float64 (compared as mpmath numbers),
    ``path``: ``tiled`` or ``naive`` (materialising) attention.

    How it is called: ``sdpa_backend`` forces one of torch SDPA's (``math``, ``flash``,
    ``efficient``, ``cudnn``; None: torch's choice), ``mask`` is an hf target's mask form
    (``bool`` or ``additive``), ``keywords`` are passed on every call (the ``exactattn``
    convention's ``impl``), ``triton``: it runs the Triton kernels (sizes limited under the
    interpreter), ``check``: a load check beyond importing ``requires`` (a reason or None).

    How it is judged: ``policy`` resolves the claim per dtype (``fa2``, ``upcast``,
    ``eager``; None: the claim as stated), ``claim_by_dtype`` states another claim for some
    input dtypes (a kernel whose float16 arithmetic is not its float32's),
    ``block_by_device`` overrides the claimed key-block size on a device, ``ftz_probe``
    measures the claim's ``ftz`` on the CPU (the format whose subnormals the kernel flushes
    there, or None: it depends on the machine), ``claim_probe`` measures the whole claim on
    the CPU (a library whose precision depends on the machine: the claim it returns
    replaces ``claim`` there, and says what it measured),
    ``quantisation``: a kernel that quantises the inputs it is given (a low-bit kernel such
    as SageAttention's): ``(inputs, dtype) ↦ (rel, abs)`` with ``|x̂ − x| ≤ rel·|x| + abs``
    for every entry of the held ``q, k, v`` against what the kernel computes with (charged by
    the bound as :attr:`exactattn.error.bounds.Arith.quant_rel` / ``quant_abs``),
    ``holds``: the ``q, k, v`` an ``api`` target's kernel computes with, from those it is
    given (a low-bit scheme quantises them itself: :meth:`exactattn.error.lowbit.Scheme.hold`),
    ``exact_block``: it runs the case's own block size (the bound uses it), ``reverses``: the
    (frozen statistics, δ) structures its reverse may use, ``enclosure``: its outputs are
    balls that must contain the exact value, ``difftest``: one of the
    configurations difftest runs.

    A user's function: ``takes``, the keyword names its signature accepts (None: any; see
    :mod:`.signature`), and ``notes``, what that signature changed (printed once). ``known``:
    the upstream bugs it inherits (:data:`exactattn.testing.known.UPSTREAM` names).
    ``refusals``: the library's documented "not supported" errors, as (exception class name,
    message pattern) pairs (:meth:`Target.refuses`). ``isolated``: every call runs in a child
    process, so a native crash or a hang (no answer within ``case_timeout`` seconds) fails
    that case alone (:mod:`.isolation`).
    """

    ctx: Callable[[], Any] | None = None
    backend: str | None = None
    storage: str | None = None
    compute: str | None = None
    p_cast: str | None = None
    quantize: str | None = None
    rounding: str | None = None
    granularity: str | None = None
    fine: bool = False
    path: str = "tiled"
    sdpa_backend: str | None = None
    mask: str = "bool"
    keywords: tuple[tuple[str, Any], ...] = ()
    triton: bool = False
    check: Callable[[], str | None] | None = None
    policy: str | None = None
    claim_by_dtype: tuple[tuple[str, Claim], ...] = ()
    block_by_device: tuple[tuple[str, int | None], ...] = ()
    ftz_probe: Callable[[], str | None] | None = None
    claim_probe: Callable[[], Claim] | None = None
    quantisation: Callable[[dict[str, Any], str], tuple[float, float]] | None = None
    holds: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    exact_block: bool = False
    reverses: tuple[tuple[str, str], ...] = REVERSES
    enclosure: bool = False
    difftest: bool = False
    takes: frozenset[str] | None = None
    notes: tuple[str, ...] = ()
    known: tuple[str, ...] = ()
    refusals: tuple[tuple[str, str], ...] = ()
    isolated: bool = False
    case_timeout: float = 300.0


@dataclass(frozen=True)
class Target:
    """A named implementation under test (see the module docstring).

    ``loader`` returns the callable (imported on first use); ``requires`` lists modules
    that must import for it to be available; ``devices_needed`` says when it needs CUDA.
    ``options`` (:class:`Options`) are the convention's and the judge's settings (an SDPA
    backend, a mask form, a ``ctx`` factory for exactattn's own number systems). ``rate``:
    run on about one case in ``rate`` (slow interpreters). ``family`` groups targets for
    ``difftest --backends``.
    """

    name: str
    convention: str
    loader: Callable[[], Any]
    caps: Capabilities
    claim: Claim
    description: str = ""
    requires: tuple[str, ...] = ()
    needs_cuda: bool = False
    options: Options = Options()
    family: str = "foreign"
    rate: int = 1

    def load(self) -> Any:
        """The callable (imports its module on first use; cached by the loader)."""
        return self.loader()

    def refuses(self, error: BaseException) -> str | None:
        """The reason, when ``error`` is this target saying it does not support an input:
        a ``NotImplementedError`` from a foreign target (a library's or a user's function;
        exactattn's own configurations take every input, so one there is a bug) or one of its
        library's documented refusals (``options.refusals``: the exception's class or a base
        class by name, and a pattern its message contains); None for any other error (a
        failure of the target). The reason is the message's first line, or for a refusal the
        line it matched, from the match on where the line is longer than 300 characters (ONNX
        Runtime's put the source path and the failed condition first)."""
        message = str(error).strip()
        text = (message.splitlines() or [""])[0][:300]
        if isinstance(error, NotImplementedError) and self.family == "foreign":
            return text or "NotImplementedError"
        names = {cls.__name__ for cls in type(error).__mro__}
        for name, pattern in self.options.refusals:
            found = re.search(pattern, message)
            if name in names and found:
                start = message.rfind("\n", 0, found.start()) + 1
                line = message[start:].partition("\n")[0]
                return (
                    line[:300]
                    if found.end() - start <= 300
                    else line[found.start() - start :][:300]
                )
        return None

    def unavailable(self, quick: bool = False) -> str | None:
        """Why this target cannot run here (a missing package, no CUDA device), or None.

        ``quick`` (``exactattn check --list``) imports nothing: the packages are looked up
        (not imported), a CUDA device is looked for as the driver's device file, and the
        target's own load check is left out; a name listed available may still fail to
        import, which the run then says."""
        for module in self.requires:
            if importlib.util.find_spec(module.split(".")[0]) is None:
                return f"{module} is not installed"
            if quick:
                continue
            try:
                importlib.import_module(module)
            except Exception as error:
                return f"importing {module} failed: {type(error).__name__}: {error}"
        if self.needs_cuda:
            if quick:
                if not Path("/dev/nvidiactl").exists() and not Path("/dev/nvidia0").exists():
                    return "needs a CUDA device (no NVIDIA device file in /dev)"
            else:
                import torch

                if not torch.cuda.is_available():
                    return "needs a CUDA device (torch.cuda.is_available() is False)"
        check = self.options.check
        return check() if check is not None and not quick else None


def size_of(batch: tuple[int, ...], n_q: int, n_k: int, d: int, v: int) -> int:
    return math.prod(batch) * n_q * n_k * (d + v)
