"""The backends under test, discovered at run time: whatever imports on this machine.

A :class:`Target` is one configuration (number system, precision policy, code path). It
says which values it holds for the float64 inputs (``hold``: the inputs rounded to its
storage), runs the forward and the reverse on a :class:`~exactattn.difftest.cases.Case`
and returns ``y, dq, dk, dv`` (float64 arrays, or mpf object arrays for configurations
finer than float64, with ball radii for flint). Optional systems (flint, torch, Triton
under ``TRITON_INTERPRET=1``) are imported inside guards, so the differential test runs
over whichever exist.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mpmath
import numpy as np

from .. import api
from .cases import Case
from .reference import arb_mid
from .tolerance import Arith, binary, ieee

Outputs = dict[str, Any]


@dataclass
class Target:
    """One configuration under test."""

    name: str
    arith: Arith
    hold: Callable[[np.ndarray], np.ndarray]  # float64 -> the float64 values it stores
    run: Callable[[Case, dict[str, np.ndarray]], Outputs]
    supports: Callable[[Case], bool] = lambda case: True
    fine: bool = False  # compare in mpf (finer than float64)
    enclosure: bool = False  # balls: check |mid − exact| ≤ radius instead of a bound
    bound_block: int | None = None  # block size the bound assumes (kernels pick their own)
    rate: int = 1  # run on about one case in ``rate`` (slow interpreters)
    tags: set[str] = field(default_factory=set)

    def wants(self, case: Case) -> bool:
        if not self.supports(case):
            return False
        if self.rate == 1:
            return True
        key = (case.q.tobytes(), case.k.shape, case.block_size, repr(case.mask)[:200])
        return zlib.crc32(repr(key).encode()) % self.rate == 0


def _size(case: Case) -> int:
    batch = int(np.prod(case.batch)) if case.batch else 1
    n = case.sizes
    return batch * n["n_q"] * n["n_k"] * (n["d"] + n["v"])


# --- the public API over a context ------------------------------------------------------
def _api_run(
    ctx: Any, path: str = "tiled", scale: Callable[[float], Any] | None = None
) -> Callable[[Case, dict], Outputs]:
    forward = api.attention if path == "tiled" else api.naive_attention
    backward = api.attention_backward if path == "tiled" else api.naive_attention_backward

    def run(case: Case, x: dict[str, np.ndarray]) -> Outputs:
        kw = case.keywords()
        if scale is not None and "scale" in kw:
            kw["scale"] = scale(kw["scale"])
        if path == "naive":
            kw.pop("block_size")
        mask = case.mask_object()
        q, k, v, g = (_to(ctx, x[n]) for n in "qkvg")
        y, stats = forward(q, k, v, mask=mask, backend=ctx, return_stats=True, **kw)
        dq, dk, dv = backward(q, k, v, y, stats, g, mask=mask, backend=ctx, **kw)
        return {"y": y, "dq": dq, "dk": dk, "dv": dv}

    return run


def _to(ctx: Any, x: np.ndarray) -> Any:
    dtype = getattr(ctx, "storage_dtype", None)
    return x.astype(dtype) if isinstance(dtype, np.dtype) else x


def _round_numpy(dtype: str) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: x.astype(dtype).astype(np.float64)


def _round_bits(prec: int) -> Callable[[np.ndarray], np.ndarray]:
    def hold(x: np.ndarray) -> np.ndarray:
        with mpmath.workprec(prec):
            out = np.frompyfunc(lambda e: float(mpmath.mpf(float(e))), 1, 1)(x)
        return np.asarray(out, dtype=np.float64).reshape(x.shape)

    return hold


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def numpy_targets() -> list[Target]:
    from ..backends import NumpyContext

    out = []
    for dtype in ("float16", "float32", "float64", "longdouble"):
        fine = np.finfo(np.longdouble).eps < np.finfo(np.float64).eps and dtype == "longdouble"
        out.append(
            Target(
                f"numpy[{dtype}]",
                ieee(dtype),
                _round_numpy(dtype),
                _api_run(NumpyContext(dtype)),
                fine=fine,
                tags={"numpy", "bitwise"},
            )
        )
    fa2 = NumpyContext("float16", compute="float32", p_cast="float16")
    out.append(
        Target(
            "numpy[float16,compute=float32,p_cast=float16]",
            ieee("float32", "float16", "float16"),
            _round_numpy("float16"),
            _api_run(fa2),
            tags={"numpy", "bitwise"},
        )
    )
    out.append(
        Target(
            "numpy-naive[float32]",
            ieee("float32"),
            _round_numpy("float32"),
            _api_run(NumpyContext("float32"), "naive"),
            bound_block=10**9,
            tags={"numpy"},
        )
    )
    return out


def mpmath_targets() -> list[Target]:
    from ..backends import MpmathContext

    def small(case: Case) -> bool:
        return _size(case) <= 600

    return [
        Target(
            f"mpmath[prec={prec}]",
            binary(prec),
            _round_bits(prec),
            _api_run(MpmathContext(prec)),
            small,
            fine=prec > 53,
            tags={"mpmath"},
        )
        for prec in (11, 24, 80)
    ]


def sympy_targets() -> list[Target]:
    """Exact symbols (tiny sizes): binary inputs as exact rationals, ``Y`` in closed form,
    compared after evaluation to 50 digits."""
    import sympy

    from ..backends import SympyContext

    ctx = SympyContext()
    tiled = _api_run(ctx, scale=sympy.Rational)  # the binary scale, exactly

    def supports(case: Case) -> bool:
        n = case.sizes
        return (
            not case.dropout_p
            and case.batch in ((), (1,))
            and n["n_q"] <= 3
            and n["n_k"] <= 3
            and n["d"] <= 2
            and n["v"] <= 2
        )

    def run(case: Case, x: dict[str, np.ndarray]) -> Outputs:
        exact = {n: np.frompyfunc(sympy.Rational, 1, 1)(x[n]) for n in "qkvg"}
        out = tiled(case, exact)
        numeric = np.frompyfunc(lambda e: mpmath.mpf(str(sympy.N(e, 50))), 1, 1)
        with mpmath.workprec(200):
            return {n: np.asarray(numeric(a), dtype=object) for n, a in out.items()}

    return [
        Target("sympy", binary(150), _identity, run, supports, fine=True, rate=5, tags={"sympy"})
    ]


def flint_targets() -> list[Target]:
    module = importlib.import_module("exactattn.backends.flint_backend")
    ctx = module.FlintContext(53)
    tiled = _api_run(ctx)

    def run(case: Case, x: dict[str, np.ndarray]) -> Outputs:
        out = tiled(case, x)
        mid = np.frompyfunc(arb_mid, 1, 1)
        rad = np.frompyfunc(lambda e: float(e.rad()) * (1 + 2.0**-50), 1, 1)  # rounded up
        with mpmath.workprec(200):
            return {
                n: (np.asarray(mid(a), dtype=object), np.asarray(rad(a), dtype=np.float64))
                for n, a in out.items()
            }

    return [
        Target(
            "flint[prec=53]",
            binary(200),
            _identity,
            run,
            lambda c: _size(c) <= 2000,
            fine=True,
            enclosure=True,
            tags={"flint"},
        )
    ]


# --- torch ----------------------------------------------------------------------------
_TORCH_ARITH = {
    "float32": lambda: ieee("float32"),
    "float64": lambda: ieee("float64"),
    "bfloat16": lambda: ieee("float32", "bfloat16", "bfloat16"),
    "float16": lambda: ieee("float32", "float16", "float16"),
}


def _round_torch(dtype: Any) -> Callable[[np.ndarray], np.ndarray]:
    import torch

    return lambda x: torch.from_numpy(x).to(dtype).to(torch.float64).numpy()


def _torch_tensors(x: dict[str, np.ndarray], dtype: Any) -> dict[str, Any]:
    import torch

    return {n: torch.from_numpy(np.ascontiguousarray(a)).to(dtype) for n, a in x.items()}


def _float64(outputs: dict[str, Any]) -> Outputs:
    import torch

    return {n: t.detach().to(torch.float64).numpy() for n, t in outputs.items()}


def torch_targets() -> list[Target]:
    import torch

    from ..backends.torch_backend import TorchContext

    out = []
    for name, make in _TORCH_ARITH.items():
        dtype = getattr(torch, name)
        ctx = TorchContext(dtype, device="cpu")
        generic = _api_run(ctx)

        def run(case: Case, x: dict, generic=generic, dtype=dtype) -> Outputs:
            t = _torch_tensors(x, dtype)
            kw = case.keywords()
            mask = case.mask_object(like=t["q"])
            y, stats = api.attention(t["q"], t["k"], t["v"], mask=mask, return_stats=True, **kw)
            grads = api.attention_backward(
                t["q"], t["k"], t["v"], y, stats, t["g"], mask=mask, **kw
            )
            return _float64({"y": y, "dq": grads[0], "dk": grads[1], "dv": grads[2]})

        out.append(
            Target(
                f"torch[{name},cpu]", make(), _round_torch(dtype), run, tags={"torch", "bitwise"}
            )
        )
    # exactattn.torch needs only torch (imported above): should its import still fail, the
    # autograd targets drop out and the torch[...] ones above stay.
    with contextlib.suppress(ImportError):
        out += _torch_autograd_targets()
    return out


def _torch_autograd_targets() -> list[Target]:
    import torch

    module = importlib.import_module("exactattn.torch")

    def make(dtype: Any) -> Callable[[Case, dict], Outputs]:
        def run(case: Case, x: dict) -> Outputs:
            t = _torch_tensors(x, dtype)
            q, k, v = (t[n].requires_grad_(True) for n in "qkv")
            kw = case.keywords()
            y = module.attention(q, k, v, mask=case.mask_object(like=t["q"]), impl="generic", **kw)
            y.backward(t["g"])
            return _float64({"y": y, "dq": q.grad, "dk": k.grad, "dv": v.grad})

        return run

    return [
        Target(
            f"torch.autograd[{n},cpu]",
            _TORCH_ARITH[n](),
            _round_torch(getattr(torch, n)),
            make(getattr(torch, n)),
            tags={"torch"},
        )
        for n in ("float32", "float64")
    ]


def triton_targets() -> list[Target]:
    """The Triton kernels, on CUDA if present, else under the interpreter (slow: sampled)."""
    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        if (
            "exactattn.triton_kernels" in __import__("sys").modules
            and os.environ.get("TRITON_INTERPRET") != "1"
        ):
            return []  # already compiled for a GPU that is not here
        os.environ["TRITON_INTERPRET"] = "1"
    module = importlib.import_module("exactattn.triton_kernels")
    device = "cuda" if cuda else "cpu"

    def supports(case: Case) -> bool:
        kind = case.mask["kind"]
        n = case.sizes
        return (
            not case.dropout_p
            and kind in ("none", "causal", "causal_br", "window", "padding")
            and len(case.batch) <= 2
            and (cuda or max(n.values()) <= 16)
        )

    def kernel_mask(case: Case) -> dict[str, Any]:
        kind = case.mask["kind"]
        if kind == "causal":
            return {"causal": "top-left"}
        if kind == "causal_br":
            return {"causal": "bottom-right"}
        if kind == "window":
            return {"window": (case.mask["left"], case.mask["right"])}
        if kind == "padding":
            lengths = np.atleast_1d(case.mask["lengths"])
            return {"kv_lengths": torch.tensor(lengths, dtype=torch.int32, device=device)}
        return {}

    def make(dtype: Any) -> Callable[[Case, dict], Outputs]:
        def run(case: Case, x: dict) -> Outputs:
            # kernels take (B, H, n, features): a 1-d batch is B (kv_lengths are per B)
            pad = (1,) * (2 - len(case.batch))
            t = {
                n: torch.from_numpy(a.reshape(case.batch + pad + a.shape[-2:])).to(dtype).to(device)
                for n, a in x.items()
            }
            kw = {"scale": case.c(), **kernel_mask(case)}
            o, lse = module.triton_forward(t["q"], t["k"], t["v"], **kw)
            grads = module.triton_backward(t["q"], t["k"], t["v"], o, lse, t["g"], **kw)
            res = {"y": o, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
            shapes = {"y": x["g"].shape, "dq": x["q"].shape, "dk": x["k"].shape, "dv": x["v"].shape}
            return {
                n: a.reshape(shapes[n])
                for n, a in _float64({n: r.cpu() for n, r in res.items()}).items()
            }

        return run

    return [
        Target(
            f"triton[{n},{'cuda' if cuda else 'interpret'}]",
            _TORCH_ARITH[n](),
            _round_torch(getattr(torch, n)),
            make(getattr(torch, n)),
            supports,
            bound_block=1,
            rate=1 if cuda else 25,
            tags={"triton"},
        )
        for n in ("float32", "float16")
    ]


FAMILIES: dict[str, Callable[[], list[Target]]] = {
    "numpy": numpy_targets,
    "mpmath": mpmath_targets,
    "sympy": sympy_targets,
    "flint": flint_targets,
    "torch": torch_targets,
    "triton": triton_targets,
}


def discover(selection: list[str] | None = None) -> tuple[list[Target], dict[str, str]]:
    """Targets of the selected families (all by default) and why any are missing.

    ``selection`` items are family names (``numpy``) or target names (``numpy[float32]``).
    """
    targets, missing = [], {}
    for family, make in FAMILIES.items():
        wanted = (
            selection is None or family in selection or any(s.startswith(family) for s in selection)
        )
        if not wanted:
            continue
        try:
            found = make()
        except Exception as error:
            missing[family] = f"{type(error).__name__}: {error}"
            continue
        for t in found:
            if selection is None or family in selection or t.name in selection:
                targets.append(t)
    return targets, missing
