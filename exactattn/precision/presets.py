"""Sweep presets, as data: each is a union of grids (cartesian products of knob values).

Knobs of a grid point: ``config`` (see :mod:`.configs`), ``n`` (n_q = n_k), ``d`` (head
dim, v = d), ``block`` (key-block size ``b``), ``dist`` (:mod:`.inputs`), ``scale`` (the
score scale as a multiple of ``1/sqrt(d)``), ``mask`` (``none``, ``causal``, ``window``:
a sliding window of ``n/8`` keys to the left), ``seed`` and ``grads`` (measure dQ, dK,
dV too). A preset may add ``reference_prec`` (bits of the certified reference) and
``description``. Add a preset by adding a dict here; no library code changes.

Scaling to a 2-core CPU: the certified reference costs about ``8 s · (n/1024)² · d/64``
for forward + backward at 200 bits, and mpmath runs cost ~1 µs per rounded operation in
pure Python, so the mantissa-width (``mpN``) grids stay at ``n ≤ 128, d = 16``.
"""

from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, list[Any]] = {
    "block": [64],
    "d": [64],
    "dist": ["normal"],
    "scale": [1.0],
    "mask": ["none"],
    "grads": [True],
}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "description": "a few seconds: for tests and smoke runs",
        "seeds": [0],
        "grids": [
            {
                "config": ["np-fp16", "np-fa2-fp16", "mp11"],
                "n": [16, 24],
                "d": [8],
                "block": [8],
                "mask": ["none", "causal"],
            },
        ],
    },
    "quick": {
        "description": "the README's main run: dtypes vs n, block sizes, inputs and masks, "
        "mantissa widths; under 2 minutes on 2 cores",
        "seeds": [0],
        "grids": [
            {
                "config": [
                    "np-fp16",
                    "np-fa2-fp16",
                    "np-fp32",
                    "np-fp64",
                    "torch-bf16",
                    "torch-fa2-bf16",
                    "torch-fp8-e4m3",
                ],
                "n": [64, 128, 256, 512],
            },
            {
                "config": ["np-fp16", "np-fa2-fp16", "torch-fa2-bf16"],
                "n": [256],
                "block": [16, 32, 128, 256],
            },
            {
                "config": ["np-fa2-fp16", "np-fp32"],
                "n": [256],
                "dist": ["normal", "fa3-outliers", "large-logits"],
                "mask": ["none", "causal", "window"],
                "scale": [1.0],
            },
            {"config": ["np-fa2-fp16"], "n": [256], "scale": [0.25, 4.0]},
            {
                "config": ["mp6", "mp8", "mp11", "mp16", "mp24"],
                "n": [64],
                "d": [16],
                "block": [16],
                "grads": [False],
            },
        ],
    },
    "fa3": {
        "description": "FlashAttention-3 §4.3: RMSE vs an FP64-or-better reference with "
        "outlier inputs, baseline (naive) FP16, FA-2 policy FP16, baseline FP8 per-tensor",
        "seeds": [0, 1, 2],
        "grids": [
            {
                "config": [
                    "np-fp16",
                    "np-fa2-fp16",
                    "torch-fp16",
                    "torch-fa2-fp16",
                    "torch-fp8-e4m3",
                    "np-fp64",
                ],
                "n": [512, 1024],
                "d": [128],
                "block": [128],
                "dist": ["fa3-outliers"],
                "grads": [False],
            },
        ],
    },
    "golden": {
        "description": "Golden et al. 2024: tiled vs naive deviation as the mantissa "
        "shrinks, and with block size and n (mpmath-emulated formats, scaled down)",
        "seeds": [0, 1],
        "grids": [
            {
                "config": ["mp6", "mp8", "mp11", "mp16", "mp24", "mp53"],
                "n": [64],
                "d": [16],
                "block": [16],
                "grads": [False],
            },
            {
                "config": ["mp8", "mp11"],
                "n": [32, 64, 128],
                "d": [16],
                "block": [8, 16, 32],
                "grads": [False],
            },
            {
                "config": ["torch-bf16", "torch-fa2-bf16", "np-fp16", "np-fa2-fp16"],
                "n": [128, 256, 512, 1024],
                "d": [64],
                "block": [16, 64, 256],
                "grads": [False],
            },
        ],
    },
    "full": {
        "description": "the whole grid up to n = 4096 (reference ~2 min per problem there)",
        "seeds": [0],
        "grids": [
            {
                "config": [
                    "np-fp16",
                    "np-fa2-fp16",
                    "np-fp32",
                    "np-fp64",
                    "torch-fp16",
                    "torch-bf16",
                    "torch-fp32",
                    "torch-fp64",
                    "torch-fa2-fp16",
                    "torch-fa2-bf16",
                    "torch-fp8-e4m3",
                    "torch-fp8-e5m2",
                ],
                "n": [64, 256, 1024, 4096],
                "d": [64],
                "block": [64, 256],
                "dist": ["normal", "fa3-outliers", "large-logits"],
                "mask": ["none", "causal", "window"],
            },
            {
                "config": ["mp8", "mp11", "mp16", "mp24", "mp53"],
                "n": [64, 128],
                "d": [16],
                "block": [16, 64],
            },
        ],
    },
}


def get_preset(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]
