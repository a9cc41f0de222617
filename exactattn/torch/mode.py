"""``exact_sdpa()``: every ``torch.nn.functional.scaled_dot_product_attention`` call inside a
``with`` block runs :func:`exactattn.torch.scaled_dot_product_attention` instead.

A :class:`~torch.overrides.TorchFunctionMode` sees the call whatever name the caller
imported it under (``F.scaled_dot_product_attention``, ``from torch.nn.functional import
scaled_dot_product_attention``, a module attribute captured at import time), since they
are all the one function object the mode is handed; every other torch function passes
through unchanged. Calls below ``__torch_function__`` (``torch.ops.aten.*`` directly) are not
seen.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .sdpa import scaled_dot_product_attention


class ExactSDPA(TorchFunctionMode):
    """Routes SDPA to exactattn while active; counts the calls it routed in :attr:`calls`."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.calls += 1
            return scaled_dot_product_attention(*args, **kwargs)
        return func(*args, **kwargs)


def exact_sdpa() -> ExactSDPA:
    """``with exact_sdpa(): model(x)`` runs every SDPA call in the block exactly."""
    return ExactSDPA()


__all__ = ["ExactSDPA", "exact_sdpa"]
