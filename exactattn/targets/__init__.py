"""One registry of named attention targets: exactattn's own configurations and foreign ones.

A target (:class:`~.base.Target`) is a callable with a calling convention
(:mod:`.conventions`: ``api``, ``exactattn``, ``sdpa``, ``flash``, ``hf``, ``flex``,
``xformers``), its capabilities and its claimed arithmetic. The entries are exactattn's
precision configurations and torch paths (:mod:`.builtin`) and the foreign
implementations (:mod:`.foreign`); ``mpN`` and a user's ``package.module:function`` or
``path/to/file.py:function`` resolve on demand (:func:`get`). ``exactattn sweep``,
``exactattn difftest``, ``exactattn check``, :func:`exactattn.testing.assert_attention_close`
and ``gpu/check.py`` all read this registry. Listing it imports nothing optional; a target
whose packages do not import, or that needs a CUDA device, says why (:func:`unavailable`).

A :class:`Variant` is a target in one dtype on one device: the unit that runs cases,
holds inputs in its format and has one derived tolerance.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import loading
from . import builtin, foreign
from .base import NAIVE_BLOCK, Capabilities, Claim, Target, size_of
from .conventions import USER_CONVENTIONS, conventions
from .interfaces import FORWARD_ONLY
from .interfaces import NAMES as INTERFACE_CONVENTIONS

__all__ = [
    "Capabilities",
    "Claim",
    "Target",
    "UnknownTarget",
    "Variant",
    "claim_for",
    "get",
    "names",
    "registry",
    "unavailable",
    "user_capabilities",
]


class UnknownTarget(ValueError):
    """A target name that is neither registered nor a loadable ``module:function``."""


@functools.cache
def registry() -> dict[str, Target]:
    """Every registered target by name (exactattn's own first, then foreign ones)."""
    return {t.name: t for t in [*builtin.entries(), *foreign.entries()]}


def names() -> list[str]:
    return list(registry())


def get(
    name: str,
    *,
    convention: str | None = None,
    claim: Claim | None = None,
    supports: Capabilities | None = None,
) -> Target:
    """The target called ``name``: a registered name, ``mpN``, or a user's callable given as
    ``package.module:function`` / ``path/to/file.py:function`` (``convention`` default
    ``sdpa``, ``claim`` default: the input dtype throughout, block size unstated)."""
    if name in registry() and convention is None and claim is None and supports is None:
        return registry()[name]
    if builtin.MP.fullmatch(name) or builtin.EMU.fullmatch(name):
        return builtin.config_target(name)
    if ":" in name:
        return user_target(name, convention or "sdpa", claim or Claim(), supports)
    raise UnknownTarget(
        f"unknown target {name!r}; available: {', '.join(names())}, mpN (N >= 2), "
        "emuN-rn / emuN-rz (2 <= N <= 26; -fa2, -scalar), "
        "or your own as package.module:function or path/to/file.py:function"
    )


def user_target(
    spec: str, convention: str, claim: Claim, supports: Capabilities | None = None
) -> Target:
    """A user's function as a target; its module is imported now (errors name the cause)."""
    allowed = (*USER_CONVENTIONS, *INTERFACE_CONVENTIONS)
    if convention not in allowed:
        raise ValueError(f"--convention must be one of {allowed}; got {convention!r}")
    fn = load_callable(spec)
    return from_callable(fn, convention=convention, claim=claim, supports=supports, name=spec)


def from_callable(
    fn: Any,
    *,
    convention: str = "sdpa",
    claim: Claim | None = None,
    supports: Capabilities | None = None,
    name: str | None = None,
) -> Target:
    """A callable as a target (``exactattn.testing.assert_attention_close`` uses this)."""
    if not callable(fn):
        raise TypeError(f"the target must be callable; got {type(fn).__name__}")
    caps = supports or user_capabilities(convention)
    return Target(
        name=name or getattr(fn, "__qualname__", repr(fn)),
        convention=convention,
        loader=lambda: fn,
        caps=caps,
        claim=claim or Claim(),
        description=f"user function ({convention} convention)",
        requires=("torch",),
        options={"mask": "bool"} if convention == "hf" else {},
    )


def user_capabilities(convention: str) -> Capabilities:
    """What a user's function is assumed to take before ``--supports`` says more: a bias and a
    soft-cap only under the ``exactattn`` convention, whose keywords carry them (a function
    with SDPA's signature may take boolean masks only: ``--supports bias=yes``)."""
    own = convention == "exactattn"
    unstated = "not stated for a user's function (--supports {}=yes)"
    return Capabilities(
        devices=("cpu", "cuda"),
        grads=f"the {convention} convention is forward only"
        if convention in FORWARD_ONLY
        else True,
        dropout=True if own else "own",
        bias=True if own else unstated.format("bias"),
        softcap=True if own else unstated.format("softcap"),
    )


def load_callable(spec: str) -> Any:
    """``package.module:function`` or ``path/to/file.py:function`` → the function
    (:func:`exactattn.loading.load_callable`; an :class:`UnknownTarget` when it names none)."""
    try:
        return loading.load_callable(spec, f"target {spec!r}")
    except loading.LoadError as error:
        raise UnknownTarget(str(error)) from error


def unavailable(target: Target, device: str = "cpu") -> str | None:
    """Why ``target`` cannot run here on ``device`` (None when it can)."""
    why = target.unavailable()
    if why is None and device not in target.caps.devices:
        why = f"runs on {', '.join(target.caps.devices)}, not {device}"
    return why


def claim_for(target: Target, dtype: str, device: str = "cpu") -> Claim:
    """The target's claim resolved for inputs of ``dtype`` on ``device``."""
    base = target.claim
    block = target.options.get("block_by_device", {}).get(device, base.block)
    policy = target.options.get("policy") or (target.options.get("fa2_policy") and "fa2")
    if policy == "fa2":
        return replace(builtin.fa2_claim(dtype).resolve(dtype), block=block)
    if policy == "upcast":
        wide = dtype if dtype in ("float32", "float64") else "float32"
        return Claim(dtype, wide, wide, wide, wide, block)
    if policy == "eager":
        p = "float32" if dtype == "float64" else dtype
        return Claim(dtype, dtype, "float32", p, dtype, NAIVE_BLOCK)
    return replace(base.resolve(dtype), block=block)


@dataclass(frozen=True)
class Variant:
    """A target in one dtype on one device (see the module docstring)."""

    target: Target
    dtype: str
    device: str = "cpu"

    @property
    def name(self) -> str:
        if len(self.target.caps.dtypes) == 1:
            return self.target.name
        return f"{self.target.name}[{self.dtype}]"

    @property
    def claim(self) -> Claim:
        return claim_for(self.target, self.dtype, self.device)

    @property
    def convention(self) -> Any:
        return conventions()[self.target.convention]

    def hold(self, x: np.ndarray) -> np.ndarray:
        """The float64 input as this variant stores it (rounded to its input format)."""
        from ..difftest.cases import hold

        fmt = self.claim.input or self.dtype
        if fmt in ("e4m3", "e5m2"):  # per-tensor FP8 quantisation
            from ..precision.fp8 import quantize_per_tensor

            return quantize_per_tensor(x, fmt)
        return hold(x, fmt)

    def held(self, case: Any) -> dict[str, np.ndarray]:
        """The case's ``q, k, v, g`` and bias as this variant stores them (the arrays its
        calling convention reads: a bias left out here would silently not be applied)."""
        held = {x: self.hold(getattr(case, x)) for x in "qkvg"}
        if case.bias is not None:
            held["bias"] = self.hold_bias(case.bias)
        return held

    def hold_bias(self, bias: np.ndarray) -> np.ndarray:
        """A bias as this variant takes it: in its input format (the compute format for
        per-tensor FP8 inputs, whose scaling a bias does not share)."""
        from ..difftest.cases import hold

        fmt = self.claim.input or self.dtype
        return hold(bias, self.claim.scores if fmt in ("e4m3", "e5m2") else fmt)

    def bound_block(self, case: Any) -> int | None:
        """The key-block size the tolerance assumes for ``case`` (None: the worst case)."""
        if self.target.options.get("exact_block"):
            return case.block_size
        return self.claim.bound_block(case.sizes["n_k"])

    def grads_unsupported(self) -> str | None:
        caps = self.target.caps
        if caps.grads is not True:
            return str(caps.grads)
        hook = getattr(self.convention, "grads_unsupported", None)
        return hook(self.device) if hook is not None else None

    def unsupported(self, case: Any) -> str | None:
        """Why this variant does not take ``case`` (None: it does); see :class:`Capabilities`."""
        caps = self.target.caps
        n = case.sizes
        if case.dtype is not None and case.dtype != self.dtype:
            return f"dtype {case.dtype}: this variant runs {self.dtype}"
        if len(case.batch) not in caps.batch_dims:
            return f"{len(case.batch)} leading dims (takes {caps.batch_dims})"
        checks = (
            (case.group > 1, caps.gqa, "GQA"),
            (n["n_q"] != n["n_k"], caps.cross, "n_q != n_k"),
            (bool(case.dropout_p), caps.dropout, "dropout"),
            (case.empty_rows == "zero", caps.empty_rows, "rows with no allowed key"),
            (case.bias is not None, caps.bias, "bias"),
            (case.softcap is not None, caps.softcap, "softcap"),
            (_program(case), caps.program, "a user's program"),
        )
        for applies, capability, what in checks:
            if applies and capability is not True:
                if capability == "own":
                    return f"{what}: draws its own keep-bits (see the dropout probe)"
                return f"{what}: {capability}" if isinstance(capability, str) else what
        if caps.equal_head_dims and n["d"] != n["v"]:
            return "needs v == d"
        size = size_of(case.batch, n["n_q"], n["n_k"], n["d"], n["v"])
        if caps.max_size is not None and size > caps.max_size:
            return f"size {size} > {caps.max_size} (slow number system)"
        if caps.max_n is not None and max(*n.values(), math.prod(case.batch)) > caps.max_n:
            return f"sizes above {caps.max_n} (slow number system)"
        if caps.masks is not None:
            from ..testing.spec import leaves

            kinds = {leaf["kind"] for leaf in leaves(case.mask)} | {case.mask["kind"]}
            if not kinds <= set(caps.masks) | {"none"}:
                return f"mask kinds {sorted(kinds - set(caps.masks))} not supported"
        if self.target.options.get("triton"):
            why = _triton_unsupported(case, self.device)
            if why:
                return why
        return self.convention.unsupported(self.target, case, self.device, True)

    def run(self, case: Any, held: dict[str, np.ndarray], grads: bool) -> dict[str, Any]:
        return self.convention.run(
            self.target, replace(case, dtype=self.dtype), held, self.device, grads
        )


def _program(case: Any) -> bool:
    """Whether the case runs a user's ``score_mod`` or ``mask_mod``."""
    from ..testing.spec import leaves

    return case.score_mod is not None or any(
        leaf["kind"] == "mask_mod" for leaf in leaves(case.mask)
    )


def _triton_unsupported(case: Any, device: str) -> str | None:
    if device == "cpu" and max(case.sizes.values()) > 16:
        return "under the Triton interpreter (no CUDA) only sizes <= 16 run"
    from ..masks import Geometry
    from .conventions import lifted_case

    lifted = lifted_case(case)
    mask = lifted.mask_object()
    n = case.sizes
    geometry = Geometry(n["n_q"], n["n_k"], lifted.batch, case.group)
    if mask is not None and mask.lower(geometry) is None:
        return "the Triton kernels express causal, window and key-padding masks only"
    return None


def variant(name: str, device: str = "cpu", dtype: str | None = None, **spec: Any) -> Variant:
    """The variant called ``name`` (``target[dtype]``, or a target's name and ``dtype`` when it
    runs in several)."""
    base, bracket, named = name.partition("[")
    target = get(base if bracket else name, **spec)
    chosen = named.rstrip("]") if bracket else dtype
    if chosen is None:
        if len(target.caps.dtypes) != 1:
            raise UnknownTarget(f"{name!r} runs in several dtypes; name one: {name}[float32]")
        chosen = target.caps.dtypes[0]
    return Variant(target, chosen, device)
