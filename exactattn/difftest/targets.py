"""The units difftest judges: exactattn's own registry entries, each in its dtype(s).

Every configuration of :mod:`exactattn.targets.builtin` marked for difftest (NumPy in each
float type and the FlashAttention-2 policy, the naive NumPy path, mpmath at 11, 24 and 80
bits, exact sympy, flint balls, torch in each dtype and policy) runs in its own format;
the torch autograd path (``exactattn``) runs in float32 and float64, the Triton kernels
(``exactattn-triton``: on CUDA, or under ``TRITON_INTERPRET=1`` on sampled small cases) in
float32 and float16. Whatever does not import here is reported missing with the reason.
"""

from __future__ import annotations

from .. import targets as registry
from ..targets import Variant

DTYPES = {"exactattn": ("float32", "float64"), "exactattn-triton": ("float32", "float16")}
BITWISE = ("numpy", "torch")  # families whose repeated runs are bit-identical by design


def units(device: str = "cpu") -> list[Variant]:
    """Every difftest unit, available or not."""
    out = []
    for target in registry.registry().values():
        if target.options.difftest:
            out += [Variant(target, d, device) for d in target.caps.dtypes]
        elif target.name in DTYPES:
            out += [Variant(target, d, device) for d in DTYPES[target.name]]
    return out


def discover(selection: list[str] | None = None) -> tuple[list[Variant], dict[str, str]]:
    """Units of the selected families (all by default) and why any are missing.

    ``selection`` items are family names (``numpy``), target names (``exactattn``) or unit
    names (``exactattn[float32]``).
    """
    found, missing = [], {}
    for unit in units():
        target = unit.target
        wanted = selection is None or any(
            s in (target.family, target.name, unit.name) for s in selection
        )
        if not wanted:
            continue
        why = registry.unavailable(target)
        if why is not None:
            missing[target.family if selection is None else unit.name] = why
            continue
        found.append(unit)
    return found, missing
