"""The ``flex`` convention: FlexAttention through ``torch.compile``, recompiles bounded.

The mask reaches Flex the way a user's does: a ``mask_mod(b, h, q_idx, kv_idx)`` and the
block mask ``create_block_mask`` builds from it (empty tiles skipped, full tiles unmasked,
partial tiles evaluated in the kernel). The ``mask_mod`` is a lookup into the case's
allowed table (derived from the mask spec's definition): one function body for every
mask kind, so the compiled kernel is not rebuilt per mask.

Shapes are bucketed so the number of compiled variants stays bounded: the function is
compiled with static shapes (``dynamic=False``: with symbolic shapes torch 2.13's CPU
template fails to build, ``'cur_kvSplitSize7' was not declared``, a finding in
docs/check.md), and every problem is padded to a bucket — ``B`` to a power of two ≥ 2,
``H_kv`` to a power of two ≥ 2 (``H`` to ``group·H_kv``, keeping the GQA group), ``n_q`` and
``n_k`` both to the same power of two ≥ 32, ``d`` and ``v`` both to the same power of two
≥ 8. Padding rows and keys are masked out and dropped, padded features are zeros, so
padding changes no score. The scale ``c`` is a tensor read by a ``score_mod`` (with
``scale=1``): a Python float would be guarded as a constant and recompile the kernel for
every new scale. Compile time is measured apart from run time (:data:`STATS`).

Score modification goes through the ``score_mod`` too, as a Flex user writes it: ``cap ·
tanh(s/cap)`` (``cap`` a tensor, for the same reason as the scale), then ``+ bias[b, h, q_idx,
kv_idx]`` from the held bias tensor (padded with zeros). A user's program runs as itself: their
``mask_mod`` (ANDed with "inside the unpadded problem", and called on indices clamped into it,
so a mod that indexes its own tables by position never reads past them) and their
``score_mod`` after the scale.

On the CPU, compiled Flex returns no log-sum-exp and has no backward (torch 2.13): only
``y`` is judged there, the gradients are reported skipped with that reason.

A silent fallback is a failed case: ``fullgraph=True`` turns a graph break into an error,
``fail_on_recompile_limit_hit`` turns an exhausted recompile budget into one, and a call
that took Flex's unfused eager path (its "called without torch.compile()" warning) is
reported as such.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .conventions import Convention, TargetError, dtype_name, lift, lifted_allowed, to_numpy

RECOMPILE_LIMIT = 1024
KV_HEADS = 2
LENGTH = 32
KV_BLOCK = 16  # BLOCK_SIZE given to create_block_mask (the claim's key-block size)


@dataclass
class CompileStats:
    compiles: int = 0
    compile_seconds: float = 0.0
    runs: int = 0
    run_seconds: float = 0.0


STATS = CompileStats()
EAGER_WARNING = "flex_attention_performance"  # flex_attention's warn-once id for the eager path
_COMPILED: dict[str, Any] = {}


def _compiled(fn: Any) -> Any:
    if "fn" not in _COMPILED:
        import torch
        import torch._dynamo

        torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        _COMPILED["fn"] = torch.compile(fn, dynamic=False, fullgraph=True)
    return _COMPILED["fn"]


def _bucket(n: int, least: int) -> int:
    return max(least, 1 << (n - 1).bit_length())


class Flex(Convention):
    name = "flex"

    def grads_unsupported(self, device: str) -> str | None:
        if device == "cpu":
            return "torch 2.13 has no FlexAttention backward on the CPU"
        return None

    def run(self, target, case, held, device, grads):
        import torch
        import torch._dynamo.utils
        import torch.nn.attention.flex_attention as flex_module
        from torch.nn.attention.flex_attention import create_block_mask

        fn = _compiled(target.load())
        dtype = getattr(torch, case.dtype)
        B, H = lift(case.batch)
        n = case.sizes
        group = case.group
        H_kv = H // group
        pb, ph_kv = _bucket(B, 2), _bucket(H_kv, KV_HEADS)
        ph = ph_kv * group  # padding heads keeps the group: head h still reads h // group
        nq = nk = _bucket(max(n["n_q"], n["n_k"]), LENGTH)
        d = v = _bucket(max(n["d"], n["v"]), 8)
        q = _padded(held["q"], (B, H, n["n_q"], n["d"]), (pb, ph, nq, d))
        k = _padded(held["k"], (B, H_kv, n["n_k"], n["d"]), (pb, ph_kv, nk, d))
        vv = _padded(held["v"], (B, H_kv, n["n_k"], n["v"]), (pb, ph_kv, nk, v))
        mask_mod = _mask_mod(case, (pb, ph, nq, nk), device)
        score_mod = _score_mod(case, held, (pb, ph, nq, nk), device)

        block_mask = create_block_mask(mask_mod, pb, ph, nq, nk, device=device, BLOCK_SIZE=KV_BLOCK)
        tensors = [torch.from_numpy(x).to(dtype).to(device) for x in (q, k, vv)]
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        with_lse = device != "cpu"  # compiled CPU Flex: "return_lse is not supported yet"
        shown = getattr(flex_module, "_WARNINGS_SHOWN", set())
        shown.discard(EAGER_WARNING)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn(
                *tensors,
                score_mod=score_mod,
                block_mask=block_mask,
                scale=1.0,
                enable_gqa=group > 1,
                return_lse=with_lse,
            )
        seconds = time.perf_counter() - start
        eager = EAGER_WARNING in shown or any(
            "called without torch.compile" in str(w.message) for w in caught
        )
        if eager:
            raise TargetError("FlexAttention ran its unfused eager path, not the compiled kernel")
        if torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs:
            STATS.compiles += 1
            STATS.compile_seconds += seconds
        else:
            STATS.runs += 1
            STATS.run_seconds += seconds
        if with_lse and (not isinstance(result, tuple) or len(result) != 2):
            raise TargetError(f"returned a {type(result).__name__}; expected (output, lse)")
        y = result[0] if with_lse else result
        y_np = to_numpy("y", y, (pb, ph, nq, v))[:B, :H, : n["n_q"], : n["v"]]
        out = {"y": y_np.reshape(held["g"].shape), "_dtype": dtype_name(y)}
        if with_lse:
            lse_np = to_numpy("lse", result[1], (pb, ph, nq))[:B, :H, : n["n_q"]]
            out["lse"] = lse_np.reshape(held["g"].shape[:-1])
        return out


def _clamped(fn: Any, sizes: tuple[int, ...]) -> Any:
    """``fn(b, h, q_idx, kv_idx)`` on indices clamped into the unpadded ``sizes`` (B, H,
    n_q, n_k)."""
    B, H, n_q, n_k = sizes

    def call(*args: Any) -> Any:
        *score, b, h, q_idx, kv_idx = args
        clamped = (b.clamp(max=B - 1), h.clamp(max=H - 1), q_idx.clamp(max=n_q - 1))
        return fn(*score, *clamped, kv_idx.clamp(max=n_k - 1))

    return call


def _mask_mod(case: Any, padded: tuple[int, ...], device: str) -> Any:
    """The case's mask as a mask_mod: the user's (``mask_mod`` cases), else a lookup into
    the allowed table (one function body for every mask kind: no recompile per mask)."""
    import torch

    from ..cases import mask_kinds

    B, H = lift(case.batch)
    n = case.sizes
    reference = mask_kinds.program(case.mask)
    if reference is not None:
        user = _clamped(case.mask_mod(reference), (B, H, n["n_q"], n["n_k"]))

        def program(b, h, q_idx, kv_idx):
            inside = (b < B) & (h < H) & (q_idx < n["n_q"]) & (kv_idx < n["n_k"])
            return user(b, h, q_idx, kv_idx) & inside

        return program
    table = np.zeros(padded, dtype=bool)
    table[:B, :H, : n["n_q"], : n["n_k"]] = lifted_allowed(case)
    lookup = torch.from_numpy(table).to(device)

    def mask_mod(b, h, q_idx, kv_idx):
        return lookup[b, h, q_idx, kv_idx]

    return mask_mod


def _score_mod(case: Any, held: dict, padded: tuple[int, ...], device: str) -> Any:
    """``c·s``, then the case's soft-cap, bias, and a user's score_mod, as one score_mod
    (constants as tensors: a Python float would be guarded and recompile per value)."""
    import torch

    from ..infra import loading

    B, H = lift(case.batch)
    scale = torch.tensor(case.c(), dtype=torch.float32, device=device)
    steps = []
    if case.softcap is not None:
        cap = torch.tensor(case.softcap, dtype=torch.float32, device=device)
        steps.append(lambda s, b, h, i, j: cap * torch.tanh(s / cap))
    if "bias" in held:
        n = case.sizes
        table = np.zeros(padded)
        table[:B, :H, : n["n_q"], : n["n_k"]] = case.lifted_bias(held["bias"])
        bias = torch.from_numpy(table).to(torch.float32).to(device)  # held: exact in float32
        steps.append(lambda s, b, h, i, j: s + bias[b, h, i, j])
    if case.score_mod is not None:
        user = loading.load_callable(case.score_mod, "--score-mod")
        steps.append(_clamped(user, (B, H, case.sizes["n_q"], case.sizes["n_k"])))

    def score_mod(score, b, h, q_idx, kv_idx):
        score = score * scale
        for step in steps:
            score = step(score, b, h, q_idx, kv_idx)
        return score

    return score_mod


def _padded(x: np.ndarray, shape: tuple[int, ...], padded: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(padded)
    out[tuple(slice(0, s) for s in shape)] = x.reshape(shape)
    return out
