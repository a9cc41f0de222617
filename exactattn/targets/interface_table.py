"""The interface conventions by name: every convention that calls a target through a
production interface (varlen, KV caches, merges, sinks) rather than a dense call.

:data:`CONVENTIONS` gathers them from their modules (:mod:`.interface_conventions`:
flash-attn's varlen, FA4's, xformers', the sinks'; :mod:`.flash_kvcache`;
:mod:`.flashinfer_conventions`;
:mod:`.onnx_conventions`; OpenVINO's paged cache, :mod:`.openvino_paged`);
``exactattn check`` draws the case's interface fields for a target run through any of them.
:data:`FORWARD_ONLY`: those whose outputs have no gradient judged (``q, k, v`` or a sink's).
"""

from __future__ import annotations

from .flash_kvcache import FlashKvcache
from .flashinfer_conventions import (
    FlashinferDecode,
    FlashinferMerge,
    FlashinferPaged,
    FlashinferPrefill,
)
from .interface_conventions import Fa4Combine, FlashVarlen, Sinks, XformersMerge
from .onnx_conventions import OnnxKvcache, OrtGqa
from .openvino_paged import OpenvinoPaged

CONVENTIONS = (
    FlashVarlen(),
    FlashKvcache(),
    Fa4Combine(),
    XformersMerge(),
    FlashinferMerge(),
    Sinks(),
    FlashinferPrefill(),
    FlashinferDecode(),
    FlashinferPaged(),
    OnnxKvcache(),
    OrtGqa(),
    OpenvinoPaged(),
)
NAMES = tuple(c.name for c in CONVENTIONS)
# flash_attn_varlen_func has a backward; a sink's dσ is judged (the case's dQ, dK, dV are
# sink-free: the sink convention judges no other gradient)
WITH_GRADIENTS = ("flash-varlen", "exactattn-sinks")
FORWARD_ONLY = tuple(name for name in NAMES if name not in WITH_GRADIENTS)
