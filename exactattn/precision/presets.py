"""Sweep presets, as data: each is a union of grids (cartesian products of knob values).

Knobs of a grid point: ``config`` (see :mod:`.configs`), ``n`` (n_q = n_k), ``d`` (head
dim, v = d), ``block`` (key-block size ``b``), ``dist`` (:mod:`exactattn.cases.inputs`), ``scale``
(the score scale as a multiple of ``1/sqrt(d)``), ``mask`` (``none``, ``causal``, ``window``:
a sliding window of ``n/8`` keys to the left), ``seed`` and ``grads`` (measure dQ, dK,
dV too), ``splits`` (split-KV: the keys in that many equal parts, each part's ``(y_t,
lse_t)`` computed by the configuration and returned in its input format, merged by
:func:`exactattn.merge_partials`; forward only) and ``merge`` (the merge's arithmetic:
``fp32``, or ``input``, the configuration's input format), ``sink`` (``none``, or a sink's
offset ``δ`` from the smallest lse: ``σ = δ + min_i lse_i``,
:mod:`exactattn.cases.interface_fields`; forward only). A preset may add ``reference_prec`` (bits of
the certified reference), ``reference`` (``"fast"``: the float64 certified reference where it
serves, arb where it cannot) and ``description``. Add a preset by adding a dict here; no library
code changes.

Scaling to a 2-core CPU: the certified reference costs about ``1.2 s · (n/1024)² · d/64``
forward, ``3 s`` with the gradients (one core, 96 bits); mpmath runs cost ~1 µs per
rounded operation in pure Python, so the ``mpN`` grids stay at ``n ≤ 128, d = 16``, while
the vectorised emulated formats (``emuN-rn|rz``) run Golden et al.'s sizes. Presets whose
names tests rely on: ``tiny`` (seconds).
"""

from __future__ import annotations

from typing import Any

GOLDEN_BITS = (6, 7, 8, 9, 10, 11, 12, 14, 16, 20, 24)  # significand bits p (mantissa p − 1)

DEFAULTS: dict[str, list[Any]] = {
    "block": [64],
    "d": [64],
    "dist": ["normal"],
    "scale": [1.0],
    "mask": ["none"],
    "score": ["none"],
    "grads": [True],
    "splits": [1],
    "merge": ["fp32"],
    "sink": ["none"],
}

FULL_CONFIGS = (
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
)
FULL_KNOBS: dict[str, list[Any]] = {
    "d": [64],
    "block": [64, 256],
    "dist": ["normal", "fa3-outliers", "large-logits"],
    "mask": ["none", "causal", "window"],
}

# score modifications (exactattn.precision.grid.score_terms): additive ALiBi, T5 relative
# buckets, a random bias with −∞ entries, and logit soft-capping
SCORES = ("none", "alibi", "t5", "bias-inf", "softcap")

LOWBIT_SCHEMES = (
    "fa3-fp8-tensor",
    "fa3-fp8-block",
    "fa3-fp8-block-hadamard",
    "sage1",
    "sage2-int8",
    "sage2-int8-fp22",
    "sage2-int4",
    "sage3-nvfp4",
    "mxfp4",
    "pcast-fwd",
    "pcast-fwd-s256",
    "pcast-rev",
    "pcast-rev-s256",
)
PCAST = ("pcast-fwd", "pcast-fwd-s256", "pcast-rev", "pcast-rev-s256")
SINKS = (4, 6, 8, 10, 12)  # attention-sink strengths A (cases.inputs: key 0 scores A)

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "description": "a few seconds: for tests and smoke runs",
        "seeds": [0],
        "grids": [
            {
                "config": ["np-fp16", "np-fa2-fp16", "mp11", "emu8-rn", "emu8-rz"],
                "n": [16, 24],
                "d": [8],
                "block": [8],
                "mask": ["none", "causal"],
            },
            {
                "config": ["np-fa2-fp16", "emu8-rn"],
                "n": [16],
                "d": [8],
                "block": [8],
                "mask": ["causal"],
                "score": list(SCORES[1:]),
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
                "config": ["np-fa2-fp16", "np-fp32", "torch-bf16"],
                "n": [256],
                "mask": ["none", "causal"],
                "score": list(SCORES[1:]),
            },
            {
                "config": ["mp6", "mp8", "mp11", "mp16", "mp24"],
                "n": [64],
                "d": [16],
                "block": [16],
                "grads": [False],
            },
        ],
    },
    "scores": {
        "description": "score modification (ALiBi, T5 buckets, a bias with −∞ entries, "
        "soft-capping) across dtypes, the FA-2 policy and 8-bit emulation, masks, n, inputs",
        "seeds": [0, 1],
        "grids": [
            {
                "config": [
                    "np-fp16",
                    "np-fa2-fp16",
                    "np-fp32",
                    "torch-bf16",
                    "torch-fa2-bf16",
                    "emu8-rn",
                ],
                "n": [256, 1024],
                "mask": ["none", "causal"],
                "dist": ["normal", "large-logits"],
                "score": list(SCORES),
            },
        ],
    },
    "splitkv": {
        "description": "split-KV: the keys in 1-16 parts merged by their lse, in float32 or "
        "in the input format, FA-2 policy fp16 and bf16 (forward; ~10 min on 2 cores)",
        "seeds": [0, 1],
        "grids": [
            {
                "config": ["np-fa2-fp16", "torch-fa2-bf16"],
                "n": [512],
                "d": [64],
                "block": [64],
                "mask": ["none", "causal"],
                "grads": [False],
                "splits": [1],
            },
            {
                "config": ["np-fa2-fp16", "torch-fa2-bf16"],
                "n": [512],
                "d": [64],
                "block": [64],
                "mask": ["none", "causal"],
                "grads": [False],
                "splits": [2, 4, 8, 16],
                "merge": ["fp32", "input"],
            },
        ],
    },
    "sinks": {
        "description": "an attention sink of offset -20 to 6 from the smallest lse, FA-2 "
        "policy fp16 and bf16 and fp32 (forward; a few minutes on 2 cores)",
        "seeds": [0, 1],
        "grids": [
            {
                "config": ["np-fa2-fp16", "torch-fa2-bf16", "np-fp32"],
                "n": [512],
                "d": [64],
                "block": [64],
                "mask": ["none", "causal"],
                "grads": [False],
                "sink": ["none", "-20", "-2", "0", "2", "6"],
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
        "description": "Golden et al. 2024 at their sizes, forward only: tiled vs naive "
        "deviation and each against the certified reference, for 5 to 23 mantissa bits "
        "with every operation's float64 result rounded to nearest or truncated (emuN-rn, "
        "emuN-rz), n = 256..4096, d = 64, 128, b = 16..256, and the FA-2 policy; a small "
        "backward grid checks the gradient bound (45 min on 2 cores shared at load ~8)",
        "seeds": [0, 1],
        "grids": [
            {  # mantissa bits m = p − 1 = 5..23 (BF16: 7, FP16: 10, FP32: 23)
                "config": [f"emu{p}-{r}" for p in GOLDEN_BITS for r in ("rn", "rz")],
                "n": [1024],
                "d": [64, 128],
                "block": [64],
                "grads": [False],
            },
            {  # sequence length, at BF16's and FP16's precision
                "config": ["emu8-rn", "emu8-rz", "emu11-rn", "emu11-rz"],
                "n": [256, 1024, 4096],
                "d": [64, 128],
                "block": [64],
                "grads": [False],
            },
            {  # key-block size
                "config": ["emu8-rn", "emu8-rz"],
                "n": [1024, 4096],
                "d": [64, 128],
                "block": [16, 32, 64, 128, 256],
                "grads": [False],
            },
            {  # the precision policy: FA-2's (24-bit statistics and accumulators)
                "config": ["emu8-rn-fa2", "emu8-rz-fa2"],
                "n": [1024, 4096],
                "d": [64],
                "block": [16, 64, 256],
                "grads": [False],
            },
            {  # the reverse, for the gradient bound
                "config": ["emu8-rn", "emu8-rz", "emu11-rz", "emu8-rz-fa2"],
                "n": [256, 1024],
                "d": [64],
                "block": [64],
            },
        ],
    },
    "golden-tiny": {
        "description": "Golden et al.'s grids scaled down to seconds (for tests)",
        "seeds": [0],
        "grids": [
            {
                "config": [f"emu{p}-{r}" for p in (6, 8, 11, 16) for r in ("rn", "rz")],
                "n": [64],
                "d": [16],
                "block": [16],
                "grads": [False],
            },
            {"config": ["emu8-rn", "emu8-rz"], "n": [32, 64, 128], "d": [16], "block": [16]},
            {"config": ["emu8-rn", "emu8-rz"], "n": [128], "d": [16], "block": [8, 32, 128]},
            {"config": ["emu8-rz-fa2"], "n": [64], "d": [16], "block": [16], "grads": [False]},
        ],
    },
    "golden-16k": {
        "description": "Golden et al. at n = 16384, forward, BF16 precision both roundings; "
        "run with --workers 1 (a naive run holds ~11 GB; ~12 min)",
        "seeds": [0],
        "grids": [
            {
                "config": ["emu8-rn", "emu8-rz"],
                "n": [16384],
                "d": [64],
                "block": [64],
                "grads": [False],
            },
        ],
    },
    "full": {
        "description": "the whole grid — 12 NumPy and torch configurations, 3 input "
        "distributions, 3 masks, b = 64 and 256, with gradients — at n = 64, 256, 1024, "
        "and mpmath widths at n ≤ 128 (8 min on 2 cores shared at load ~5)",
        "seeds": [0],
        "grids": [
            {"config": list(FULL_CONFIGS), "n": [64, 256, 1024], **FULL_KNOBS},
            {
                "config": ["mp8", "mp11", "mp16", "mp24", "mp53"],
                "n": [64, 128],
                "d": [16],
                "block": [16, 64],
            },
        ],
    },
    "lowbit": {
        "description": "low-bit attention (exactattn.error.lowbit: FA3 FP8, SageAttention 1/2/3, "
        "MXFP4, the P cast to e4m3 in forward and reverse key order) against the certified "
        "reference (float64, exactattn.oracle.float64) and the fp16/bf16 FA-2 baselines, "
        "forward only: N(0,1), FA3's outliers, large logits, attention sinks of strength "
        "4..12, n up to 4096; 3 seeds, the claims table with each figure's range over them",
        "seeds": [0, 1, 2],
        "reference": "fast",
        "grids": [
            {  # FlashAttention-3 §4.3's FP8 claim: per-tensor vs block vs block + Hadamard
                "config": [*LOWBIT_SCHEMES[:3], "np-fa2-fp16"],
                "n": [1024],
                "d": [64, 128],
                "block": [128],
                "dist": ["normal", "fa3-outliers"],
                "grads": [False],
            },
            {  # every scheme and both baselines at the papers' kinds of inputs
                "config": [*LOWBIT_SCHEMES, "np-fa2-fp16", "torch-fa2-bf16"],
                "n": [512],
                "d": [64],
                "block": [64],
                "dist": ["normal", "fa3-outliers", "large-logits"],
                "grads": [False],
            },
            {  # arXiv:2606.06521: the P cast behind an attention sink, by its strength
                "config": [*PCAST, "np-fa2-fp16"],
                "n": [1024],
                "d": [64],
                "block": [64],
                "dist": [f"sink-{a}" for a in SINKS],
                "grads": [False],
            },
            {  # long sequences
                "config": ["fa3-fp8-block-hadamard", "pcast-fwd", "pcast-rev"],
                "n": [4096],
                "d": [64],
                "block": [128],
                "dist": ["sink-8"],
                "grads": [False],
            },
        ],
    },
    "lowbit-tiny": {
        "description": "the lowbit preset scaled down to seconds (for tests)",
        "seeds": [0],
        "reference": "fast",
        "grids": [
            {
                "config": [*LOWBIT_SCHEMES, "np-fa2-fp16"],
                "n": [64],
                "d": [32],
                "block": [32],
                "dist": ["normal", "fa3-outliers", "sink-8"],
                "grads": [False],
            },
        ],
    },
    "full-4096": {
        "description": "the full grid at n = 4096, for a Dask cluster (--scheduler): the "
        "runs, not the reference, dominate — ~16x the n = 1024 slice, hours of CPU",
        "seeds": [0],
        "grids": [{"config": list(FULL_CONFIGS), "n": [4096], **FULL_KNOBS}],
    },
}


def get_preset(name: str, targets: list[str] | None = None) -> dict[str, Any]:
    """The preset called ``name``; with ``targets``, every grid runs those instead of its
    own configurations (``exactattn sweep --targets``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    preset = PRESETS[name]
    if not targets:
        return preset
    grids = [{**grid, "config": list(targets)} for grid in preset["grids"]]
    return {**preset, "grids": grids}
