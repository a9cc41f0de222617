"""Triton kernel tests: on CUDA when a GPU is present, else on Triton's CPU interpreter.

``TRITON_INTERPRET=1`` must be in the environment before ``@triton.jit`` decorates the
kernels (the decorator reads it), so it is set here, before any test module imports
``exactattn.torch.triton_kernels``; a module imported earlier without it is reloaded.

The interpreter stores bfloat16 as raw ``uint16`` and its ``tl.dot`` multiplies those bit
patterns (triton-lang/triton#11584, "bfloat16 is not supported by the interpreter"). The
GPU's bf16 MMA multiplies the values exactly and accumulates in float32, so the interpreter's
``create_dot`` is patched to widen bfloat16 operands to float32 first: exact, and what the
hardware computes.
"""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest

from tests.optional import requires

torch = requires("torch")
ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

triton = requires("triton")


def _patch_interpreter_bf16_dot() -> None:
    from triton import language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_exactattn_bf16", False):
        return
    original = builder.create_dot

    def widen(x):  # bfloat16 bits are the top half of the float32 with the same value
        if x.dtype != tl.bfloat16:
            return x
        data = (x.data.astype(np.uint32) << 16).view(np.float32)
        return interpreter.TensorHandle(data, tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot._exactattn_bf16 = True
    builder.create_dot = create_dot


def _load_kernels():
    module = sys.modules.get("exactattn.torch.triton_kernels")
    if module is None:
        return importlib.import_module("exactattn.torch.triton_kernels")
    if module._INTERPRETED == ON_GPU:  # imported before this file set the mode
        module = importlib.reload(module)
    return module


if not ON_GPU:
    _patch_interpreter_bf16_dot()
kernels = _load_kernels()


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if ON_GPU else "cpu"


@pytest.fixture(scope="session")
def tk():
    """The exactattn.torch.triton_kernels module, in the mode this session runs."""
    return kernels
