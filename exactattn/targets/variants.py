"""A :class:`Variant`: a target in one dtype on one device, the unit that runs cases.

It resolves the target's claim for its dtype (:func:`claim_for`), holds a case's inputs in
its format, says which cases it does not take and why (:meth:`Variant.unsupported`), and
runs a case through its calling convention (:func:`conventions`, the table of them).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..backends.formats import Format, get_format, number_format
from ..cases import mask_kinds
from ..error.bounds import Arith
from . import builtin, isolation
from .conventions import Api, Convention, Exactattn, Flash, Hf, Sdpa, Xformers
from .flex_convention import Flex
from .interface_table import CONVENTIONS as INTERFACES
from .jax_convention import Jax
from .resolve import UnknownTarget, get, registry
from .target import NAIVE_BLOCK, Claim, Target, size_of

OWN_ARITHMETIC = ("numpy", "torch", "mpmath", "emulated")  # contexts whose Arith is known


@functools.cache
def conventions() -> dict[str, Convention]:
    """Every calling convention by name."""
    own = (Api(), Sdpa(), Hf(), Flash(), Exactattn(), Xformers(), Flex(), Jax())
    return {c.name: c for c in (*own, *INTERFACES)}


def claim_for(target: Target, dtype: str, device: str = "cpu") -> Claim:
    """The target's claim resolved for inputs of ``dtype`` on ``device`` (measured there by
    its ``claim_probe`` when it has one, else its claim for that dtype)."""
    measure = target.options.claim_probe
    if measure is not None and device == "cpu":
        base = measure()
    else:
        base = dict(target.options.claim_by_dtype).get(dtype, target.claim)
    block = dict(target.options.block_by_device).get(device, base.block)
    policy = target.options.policy
    group = dtype if base.group == "input" else base.group
    qsplit = base.qsplit if device == "cpu" else None
    probe = target.options.ftz_probe
    ftz = (probe() if probe else base.ftz) if device == "cpu" else None  # a CPU kernel's
    if policy == "fa2":
        fa2 = builtin.fa2_claim(dtype).resolve(dtype)
        return replace(fa2, block=block, group=group, qsplit=qsplit, ftz=ftz)
    if policy == "upcast":
        wide = dtype if dtype in ("float32", "float64") else "float32"
        return Claim(dtype, wide, wide, wide, wide, block, group, qsplit, ftz)
    if policy == "eager":
        p = "float32" if dtype == "float64" else dtype
        return Claim(dtype, dtype, "float32", p, dtype, NAIVE_BLOCK, group, qsplit, ftz)
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

    @property
    def group_sum(self) -> str | None:
        """The format a GQA group's per-head gradients (each rounded to the output format)
        are summed in, or None when the target sums the group before rounding: its claim's
        ``group``, float64 for a function the check calls with ``K, V`` expanded (it takes no
        ``enable_gqa``; the check sums the heads, :mod:`.signature`)."""
        takes = self.target.options.takes
        if self.target.convention == "sdpa" and takes is not None and "enable_gqa" not in takes:
            return "float64"
        return self.claim.group

    def hold(self, x: np.ndarray) -> np.ndarray:
        """The float64 input as this variant stores it (rounded to its input format)."""
        from ..cases import hold

        fmt = self.claim.input or self.dtype
        if fmt in ("e4m3", "e5m2"):  # per-tensor FP8 quantisation
            from ..backends.quantize import quantize_per_tensor

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
        from ..cases import hold

        fmt = self.claim.input or self.dtype
        return hold(bias, self.claim.scores if fmt in ("e4m3", "e5m2") else fmt)

    def bound_block(self, case: Any) -> int | None:
        """The key-block size the tolerance assumes for ``case`` (None: the worst case)."""
        if self.target.options.exact_block:
            return case.block_size
        return self.claim.bound_block(case.sizes["n_k"])

    def arith(self, block: int | None, inputs: dict[str, np.ndarray] | None = None) -> Arith:
        """The arithmetic this variant claims at key-block size ``block``: the one map from a
        claim to the :class:`~exactattn.error.bounds.Arith` the error bound reads (check, difftest
        and the sweep all call it).

        exactattn's own IEEE, mpmath and emulated configurations: their context's arithmetic
        (:meth:`Arith.of_context`); per-tensor FP8 inputs ``s·fp8(x/s)`` (then held in fp32)
        as a binary format of the FP8 precision whose subnormal error covers ``s·μ_fp8`` for
        the largest of the three scales ``s`` of ``inputs`` (``q, k, v``; the fp32 rounding
        on top stays within ``ū``). Every other target: its claim (the coarser of the score
        and statistics formats computes, ``p`` — and in the reverse ``p`` and ``γ`` — is
        cast when it is coarser, as FlashAttention-2's kernels do; outputs are in the input
        format); a kernel that quantises its inputs itself (``options.quantisation``) adds
        that quantisation's error model on ``inputs``, and so does a low-bit claim
        (:meth:`Claim.scheme`: its quantisation, smoothing and rotation of ``inputs``, as
        given, by :meth:`~exactattn.error.lowbit.Scheme.quantised`; the low-bit schemes'
        entries claim their own arithmetic so).
        """
        options = self.target.options
        if self.target.convention == "api" and options.backend in OWN_ARITHMETIC:
            arith = Arith.of_context(options.ctx(), block=block)
            if options.quantize is not None and options.p_cast is not None:
                arith = replace(arith, p=number_format(options.p_cast))  # FP8's cast of p
            if options.quantize is None or inputs is None:
                return arith
            from ..backends.quantize import tensor_scale

            base = get_format(options.quantize)
            s = max(tensor_scale(inputs[x], options.quantize) for x in "qkv")
            e_min = base.e_min + math.ceil(math.log2(s)) + 1  # 2^(e_min − p) ≥ 2·s·μ_fp8
            return replace(arith, input=Format(f"{options.quantize}*s", base.p, e_min))
        claim = self.claim
        arith = claim.arith(block)
        scheme = claim.scheme()
        if scheme is not None and inputs is not None:  # a low-bit claim's quantisation
            return scheme.quantised(arith, inputs)
        if options.quantisation is None or inputs is None:
            return arith
        rel, abs_ = options.quantisation(inputs, self.dtype)
        return replace(arith, quant_rel=rel, quant_abs=abs_)

    def reference_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The inputs the exact answer is taken at, for ``inputs`` as this variant receives
        them: a low-bit claim that states its quantiser (``quantiser=nearest``) is asked for
        exact attention at the quantised inputs (:meth:`~exactattn.error.lowbit.Scheme.
        reference_inputs`); every other claim for exact attention at ``inputs``."""
        scheme = self.claim.scheme()
        at = None if scheme is None else scheme.reference_inputs(inputs)
        return inputs if at is None else at

    def bound_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The inputs the bound is taken on (``inputs`` as received): a stated quantiser's
        quantised inputs (:meth:`reference_inputs`), else a low-bit claim's exact
        transformations of ``q, k, v`` (rotation, smoothing: the same exact attention,
        :meth:`~exactattn.error.lowbit.Scheme.exact`), else ``inputs``."""
        scheme = self.claim.scheme()
        if scheme is None:
            return inputs
        if scheme.exactly_quantised:
            return self.reference_inputs(inputs)
        exact = scheme.exact({x: inputs[x] for x in "qkv"})[0]
        return {**inputs, **{x: exact[x] for x in "qkv"}}

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
        for field, what, applies in FEATURES:
            capability = getattr(caps, field)
            if field == "empty_rows":  # what reaches the target: its convention's rows
                applies = self.convention.passes_empty_rows
            if capability is not True and applies(case):
                if capability == "own":
                    return f"{what}: draws its own keep-bits (see the dropout probe)"
                return f"{what}: {capability}" if isinstance(capability, str) else what
        if caps.equal_head_dims and n["d"] != n["v"]:
            return NEEDS_EQUAL_HEAD_DIMS
        scheme = self.claim.scheme()
        if scheme is not None:
            from ..error.lowbit_claim import unsupported

            why = unsupported(scheme, n["d"], n["v"])
            if why:
                return why
        size = size_of(case.batch, n["n_q"], n["n_k"], n["d"], n["v"])
        if caps.max_size is not None and size > caps.max_size:
            return f"size {size} > {caps.max_size} (slow number system)"
        if caps.max_n is not None and max(*n.values(), math.prod(case.batch)) > caps.max_n:
            return f"sizes above {caps.max_n} (slow number system)"
        if caps.masks is not None:
            kinds = mask_kinds.kinds_named(case.mask)
            taken = set(caps.masks) | {"none"} | set(self.convention.expresses)
            if not kinds <= taken:
                return f"mask kinds {sorted(kinds - taken)} not supported"
        if self.target.options.triton:
            why = _triton_unsupported(case, self.device)
            if why:
                return why
        return self.convention.unsupported(self.target, case, self.device, True)

    def run(self, case: Any, held: dict[str, np.ndarray], grads: bool) -> dict[str, Any]:
        target = self.target
        # a child rebuilds the target by name: one changed after lookup (a test's broken twin)
        # could not be rebuilt there, and runs here
        rebuilt = ":" in target.name or registry().get(target.name) is target
        if target.options.isolated and rebuilt and not isolation.in_child():
            recipe = (target.name, target.convention, target.claim, target.caps)
            args = (recipe, self.dtype, self.device, case, held, grads)
            key = (target.name, self.dtype, self.device)
            return isolation.run(key, run_in_child, *args, timeout=target.options.case_timeout)
        return self.convention.run(
            self.target, replace(case, dtype=self.dtype), held, self.device, grads
        )


def run_in_child(
    recipe: tuple, dtype: str, device: str, case: Any, held: dict, grads: bool
) -> dict[str, Any]:
    """An isolated variant's run inside its child (:mod:`.isolation`): rebuilt from its
    recipe, run in place; a refusal crosses back as :class:`.isolation.Refused`."""
    isolation.enter_child()
    variant = _rebuilt(recipe, dtype, device)
    try:
        return variant.run(case, held, grads)
    except Exception as error:
        refused = variant.target.refuses(error)
        if refused is None:
            raise  # as it is (the worker sends a picklable stand-in if it is not)
        raise isolation.Refused(f"{type(error).__name__}: {refused}") from None


@functools.cache
def _rebuilt(recipe: tuple, dtype: str, device: str) -> Variant:
    name, convention, claim, caps = recipe
    if name in registry():
        return Variant(registry()[name], dtype, device)
    return Variant(get(name, convention=convention, claim=claim, supports=caps), dtype, device)


def _program(case: Any) -> bool:
    """Whether the case runs a user's ``score_mod`` or ``mask_mod``."""
    return case.score_mod is not None or bool(mask_kinds.programs(case.mask))


FEATURES: tuple[tuple[str, str, Any], ...] = (
    ("gqa", "GQA", lambda case: case.group > 1),
    ("cross", "n_q != n_k", lambda case: case.sizes["n_q"] != case.sizes["n_k"]),
    ("dropout", "dropout", lambda case: bool(case.dropout_p)),
    ("empty_rows", "rows with no allowed key", lambda case: case.empty_rows == "zero"),
    ("bias", "bias", lambda case: case.bias is not None),
    ("softcap", "softcap", lambda case: case.softcap is not None),
    ("negative_scale", "negative scale", lambda case: case.scale is not None and case.scale < 0),
    ("program", "a user's program", _program),
)
"""The features a :class:`~.target.Capabilities` field gates: (its field, the label a skip's
reason starts with, whether a case has it)."""
NEEDS_EQUAL_HEAD_DIMS = "needs v == d"


def _triton_unsupported(case: Any, device: str) -> str | None:
    if device == "cpu" and max(case.sizes.values()) > 16:
        return "under the Triton interpreter (no CUDA) only sizes <= 16 run"
    from ..core.masks import Geometry
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
