"""What a number system is lives in its context: each one takes a case's float64 values in
exactly (``exact_floats``, ``asarray``) and gives its outputs back as a comparison reads them
(``comparable``), so no caller switches on the system's family or class."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import sympy

from exactattn.backends import MpmathContext, NumpyContext, SympyContext
from exactattn.backends.emulated_backend import EmulatedContext
from exactattn.core import ops
from tests.optional import requires


def _torch(dtype):
    def make():
        torch = requires("torch")
        from exactattn.backends.torch_backend import TorchContext

        return TorchContext(getattr(torch, dtype))

    return make


def _flint():
    requires("flint")
    from exactattn.backends.flint_backend import FlintContext

    return FlintContext(53)


CONTEXTS = {
    "float16": lambda: NumpyContext("float16"),
    "float32": lambda: NumpyContext("float32"),
    "float64": lambda: NumpyContext("float64"),
    "longdouble": lambda: NumpyContext("longdouble"),
    "torch-float16": _torch("float16"),
    "torch-bfloat16": _torch("bfloat16"),
    "torch-float64": _torch("float64"),
    "mpmath-11": lambda: MpmathContext(11),
    "mpmath-80": lambda: MpmathContext(80),
    "sympy": SympyContext,
    "flint": _flint,
    "emulated-bf16": lambda: EmulatedContext(8, exponent=8),
}
# exact in every format above: at most 8 significant bits, inside fp16's range
EXACT = np.array([[0.0, 0.5, -1.25], [3.0, -0.09375, 96.0]])


def _values(out) -> np.ndarray:
    """What ``comparable`` gave, as float64 (an enclosure must be a point: radius 0)."""
    if isinstance(out, tuple):
        mid, rad = out
        assert (rad == 0).all(), rad
        out = mid
    return np.asarray(out).astype(np.float64)


@pytest.mark.parametrize("name", CONTEXTS)
def test_a_value_the_system_holds_goes_in_and_comes_back_exactly(name):
    ctx = CONTEXTS[name]()
    with ctx.scope():
        out = ctx.comparable(ctx.asarray(ctx.exact_floats(EXACT)))
    assert np.array_equal(_values(out), EXACT)


@pytest.mark.parametrize("name", CONTEXTS)
def test_a_comparison_reads_floats_mpf_or_an_enclosure(name):
    ctx = CONTEXTS[name]()
    with ctx.scope():
        out = ctx.comparable(ctx.asarray(ctx.exact_floats(EXACT)))
    if name == "flint":
        assert isinstance(out, tuple) and out[1].dtype == np.float64
        assert all(isinstance(e, mpmath.mpf) for e in out[0].flat)
    elif name.startswith(("mpmath", "sympy")):
        assert all(isinstance(e, mpmath.mpf) for e in out.flat)
    else:
        assert out.dtype == (np.longdouble if name == "longdouble" else np.float64)


def test_sympy_takes_a_binary_float_as_the_rational_it_is():
    ctx = SympyContext()
    exact = sympy.Rational(3602879701896397, 2**55)  # 0.1 as a binary64 number
    assert ctx.exact_floats(0.1) == exact
    assert ctx.scalar_arg("scale", ctx.exact_floats(0.1)) == exact
    assert list(ctx.exact_floats(np.array([0.1, -np.inf]))) == [exact, -sympy.oo]
    assert ops.constant(ctx, np.float32(0.1)) == sympy.Rational(float(np.float32(0.1)))


def test_binary_systems_take_floats_as_they_are():
    x = np.array([0.1, -np.inf])
    for ctx in (NumpyContext("float16"), MpmathContext(11), EmulatedContext(8, exponent=8)):
        assert ctx.exact_floats(x) is x


def test_sympy_outputs_are_read_to_50_digits():
    with mpmath.workprec(300):
        out = SympyContext().comparable(np.array([sympy.sqrt(2), -sympy.oo], dtype=object))
        assert abs(out[0] - mpmath.sqrt(2)) < mpmath.mpf(10) ** -49
        assert out[1] == mpmath.mpf("-inf")


def test_a_ball_is_read_as_an_enclosure_of_its_value():
    flint = requires("flint")
    third = flint.arb(1) / 3
    mid, rad = _flint().comparable(np.array([third], dtype=object))
    with mpmath.workprec(300):
        assert abs(mid[0] - mpmath.mpf(1) / 3) <= rad[0]
    assert 0 < rad[0] < 2.0**-50
