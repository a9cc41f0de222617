"""exactattn: exact tiled softmax attention, written once, run over many number systems.

The tiled algorithm (:mod:`exactattn.core.algorithm`) is written against a small number-system
protocol (:mod:`exactattn.backends`), so one code runs over IEEE floats (NumPy, torch),
arbitrary precision (mpmath), certified balls (python-flint) and exact symbols (sympy).
"""

from .api import (
    Stats,
    attention,
    attention_backward,
    attention_hvp,
    flash_attention,
    naive_attention,
    naive_attention_backward,
    self_attention,
    self_attention_backward,
)
from .backends import MpmathContext, NumpyContext, SympyContext, backend_of
from .core import masks
from .core.hvp import Tangents
from .core.merge import merge_partials
from .infra import aliases
from .layouts.paged import paged_attention
from .layouts.varlen import varlen_attention, varlen_attention_backward

aliases.install()  # exactattn.masks, exactattn.bounds, ...: the names users write

__all__ = [
    "MpmathContext",
    "NumpyContext",
    "Stats",
    "SympyContext",
    "Tangents",
    "attention",
    "attention_backward",
    "attention_hvp",
    "backend_of",
    "flash_attention",
    "masks",
    "merge_partials",
    "naive_attention",
    "naive_attention_backward",
    "paged_attention",
    "self_attention",
    "self_attention_backward",
    "varlen_attention",
    "varlen_attention_backward",
]
