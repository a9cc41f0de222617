"""Side by side: the planted bugs under three peers' rules on those peers' own grids.

Columns (b)-(d) of ``docs/check.md``'s side-by-side table, for the dense twins
(:mod:`tests.check.kernels`); column (a) is ``docs/side_by_side_exactattn.py``. Rules and
references: :mod:`side_by_side_rules`. Each peer's grid is the parametrize lists of its
cited test, batch and heads scaled down for 2 CPU cores, dropout and bias points left out
(the twins take neither); a seeded sample of ``--points`` grid points per bug::

    PYTHONPATH=. python docs/side_by_side.py --points 6 OUT.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time

import side_by_side_rules as rules
import torch
from side_by_side_rows import ROWS, Row

# flash-attn test_flash_attn_output (v2.8.3, l. 864-903); batch 4 → 1, heads 6 → 2 (mqa 2/1,
# gqa 4/2), alibi, dropout and softcap points left out
FLASH_GRID = {
    "dtype": [torch.float16, torch.bfloat16],
    "mha_type": ["mha", "mqa", "gqa"],
    "causal": [False, True],
    "local": [False, True],
    "d": [32, 40, 59, 64, 96, 111, 128, 160, 192, 224, 256],
    "seqlens": [
        (113, 203),
        (128, 217),
        (113, 211),
        (108, 256),
        (256, 512),
        (512, 256),
        (1024, 1024),
        (1023, 1024),
        (1024, 1023),
        (2048, 2048),
    ],
}
# PyTorch test_flash_attention_vs_math_ref_grads (00030eb8); batch [1, 8] → 1, heads 4 → 2;
# dropout 0.22, 0.48 left out; is_causal with seq_len_q != seq_len_k skipped, as the test does
TORCH_GRID = {
    "dtype": [torch.float16, torch.bfloat16],
    "seq_len_q": [4, 8, 64, 143, 256, 512, 1024, 2048],
    "seq_len_k": [4, 8, 64, 128, 256, 587, 1024, 2048],
    "head_dim": [8, 16, 21, 32, 64, 72, 96, 128, 160, 192, 203, 256],
    "is_causal": [True, False],
    "scale": [None, "l1"],
}
# FlexAttention test_builtin_score_mods / _different_seqlen / test_GQA (00125ef3): B, H, S, D
# = 4, 8, 2048, 64 → B 1, H 2 (GQA (4, 2), (4, 1) kept); the score mods a dense SDPA call can
# express (_identity, _times_two as the scale, _causal, _inverse_causal as a bool mask)
FLEX_GRID = {
    "dtype": [torch.float32, torch.bfloat16, torch.float16],
    "score_mod": ["identity", "times_two", "causal", "inverse_causal"],
    "shape": [
        ("builtin", 2, 2, 2048, 2048),
        ("different_seqlen", 2, 2, 1024, 2048),
        ("GQA", 4, 2, 2048, 2048),
        ("GQA", 4, 1, 2048, 2048),
    ],
}


def allowed_of(kind: str, n_q: int, n_k: int, window=(-1, -1)) -> torch.Tensor:
    """The ``(n_q, n_k)`` allowed set, from the peers' definitions: top-left causal ``j ≤ i``
    (SDPA, Flex ``_causal``), bottom-right ``j ≤ i + n_k − n_q`` (flash-attn), flash-attn's
    local window (``construct_local_mask``), Flex ``_inverse_causal`` ``j ≥ i``."""
    i = torch.arange(n_q)[:, None]
    j = torch.arange(n_k)[None, :]
    if kind == "none":
        return torch.ones(n_q, n_k, dtype=torch.bool)
    if kind == "causal-tl":
        return j <= i
    if kind == "inverse-causal":
        return j >= i
    left, right = window
    if kind == "causal-br":
        left, right = left, 0
    shift = i + n_k - n_q
    if left < 0:
        return ~(j > shift + right)
    return ~((j > torch.clamp(shift + right, max=n_k)) | (j < shift - left))


def call_dense(row: Row, fn, q, k, v, kind, window=(-1, -1), scale=None):
    """The kernel on ``(B, H, n, d)`` inputs under mask ``kind``, as an author adapts the
    peer's call to the kernel's convention; None where that convention cannot express it."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    gqa = q.shape[1] != k.shape[1]
    square_causal = kind in ("causal-tl", "causal-br") and n_q == n_k
    if row.convention == "sdpa":
        if kind == "none":
            return fn(q, k, v, scale=scale, enable_gqa=gqa)
        if kind == "causal-tl" or square_causal:
            return fn(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
        mask = allowed_of(kind, n_q, n_k, window)
        return fn(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    t = [x.transpose(1, 2) for x in (q, k, v)]
    if kind == "none":
        out = fn(*t, softmax_scale=scale)
    elif kind == "causal-br" or square_causal:
        out = fn(*t, softmax_scale=scale, causal=True)
    elif kind == "local":
        out = fn(*t, softmax_scale=scale, window_size=window)
    else:
        return None
    return out.transpose(1, 2)


def _grads(out, inputs, g):
    return torch.autograd.grad(out, inputs, g, allow_unused=True)


def flash_point(row: Row, fn, p: dict) -> bool | None:
    """flash-attn's rule at grid point ``p``: out ``2×``, dQ, dK, dV ``3×`` (l. 1121-1132)."""
    torch.manual_seed(0)
    n_q, n_k = p["seqlens"]
    h = {"mha": (2, 2), "mqa": (2, 1), "gqa": (4, 2)}[p["mha_type"]]
    window = (-1, -1) if not p["local"] else tuple(int(x) for x in torch.randint(0, n_k, (2,)))
    kind = "causal-br" if p["causal"] else ("local" if p["local"] else "none")
    if p["causal"] and p["local"]:
        kind, window = "local", (window[0], 0)
    dt = p["dtype"]
    q = torch.randn(1, n_q, h[0], p["d"], dtype=dt, requires_grad=True)
    k = torch.randn(1, n_k, h[1], p["d"], dtype=dt, requires_grad=True)
    v = torch.randn(1, n_k, h[1], p["d"], dtype=dt, requires_grad=True)
    allowed = allowed_of(kind, n_q, n_k, window)
    out = call_dense(row, fn, *(x.transpose(1, 2) for x in (q, k, v)), kind, window)
    if out is None:
        return None
    out = out.transpose(1, 2)
    ref = rules.flash_attn_ref(q, k, v, allowed)
    pt = rules.flash_attn_ref(q, k, v, allowed, upcast=False, reorder_ops=True)
    g = torch.randn_like(out)
    ok = rules.flash_attn_rule(out, ref, pt)
    for a, b, c in zip(_grads(out, (q, k, v), g), _grads(ref, (q, k, v), g),
                       _grads(pt, (q, k, v), g)):  # fmt: skip
        ok &= a is not None and rules.flash_attn_rule(a, b, c, mult=3)
    return ok


def torch_point(row: Row, fn, p: dict) -> bool | None:
    """PyTorch's rule: fudge out 1 (3 if head_dim % 8), dQ 4, dK 2, dV 2."""
    if p["is_causal"] and p["seq_len_q"] != p["seq_len_k"]:
        return None
    torch.manual_seed(0)
    d, dt = p["head_dim"], p["dtype"]
    scale = None if p["scale"] is None else 1 / d
    q = torch.rand(1, 2, p["seq_len_q"], d, dtype=dt, requires_grad=True)
    k = torch.rand(1, 2, p["seq_len_k"], d, dtype=dt, requires_grad=True)
    v = torch.rand(1, 2, p["seq_len_k"], d, dtype=dt, requires_grad=True)
    kind = "causal-tl" if p["is_causal"] else "none"
    out = call_dense(row, fn, q, k, v, kind, scale=scale)
    if out is None:
        return None
    hp = rules.torch_higher_precision(dt)
    qr, kr, vr = (x.detach().to(hp).requires_grad_(True) for x in (q, k, v))
    ref = rules.torch_math_ref(qr, kr, vr, is_causal=p["is_causal"], scale=scale)
    lp = rules.torch_math_ref(q, k, v, is_causal=p["is_causal"], scale=scale)
    g = torch.rand_like(out)
    ok = rules.torch_rule(out, ref, lp, 3 if d % 8 else 1)
    got, low = _grads(out, (q, k, v), g), _grads(lp, (q, k, v), g)
    for a, b, c, fudge in zip(got, _grads(ref, (qr, kr, vr), g.to(hp)), low, (4, 2, 2)):
        ok &= a is not None and rules.torch_rule(a, b, c, fudge)
    return ok


def flex_point(row: Row, fn, p: dict) -> bool | None:
    """Flex's rule: out and dQ, dK, dV each within fudge × the eager low-precision error."""
    torch.manual_seed(0)
    _, hq, hkv, n_q, n_k = p["shape"]
    dt, mod = p["dtype"], p["score_mod"]
    scale = 2 / 64**0.5 if mod == "times_two" else None
    kind = {"identity": "none", "times_two": "none", "causal": "causal-tl"}.get(mod, mod)
    kind = "inverse-causal" if mod == "inverse_causal" else kind
    q = torch.randn(1, hq, n_q, 64, dtype=dt, requires_grad=True)
    k = torch.randn(1, hkv, n_k, 64, dtype=dt, requires_grad=True)
    v = torch.randn(1, hkv, n_k, 64, dtype=dt, requires_grad=True)
    out = call_dense(row, fn, q, k, v, kind, scale=scale)
    if out is None:
        return None
    allowed = allowed_of(kind, n_q, n_k)
    qg, kg, vg = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    golden = rules.flex_math_ref(qg, kg, vg, allowed, scale)
    ref = rules.flex_math_ref(q, k, v, allowed, scale)
    g = torch.randn_like(out)
    fudge = rules.flex_fudge(dt)
    ok = rules.flex_rule(out, golden, ref, fudge)
    for a, b, c in zip(_grads(out, (q, k, v), g), _grads(golden, (qg, kg, vg), g.double()),
                       _grads(ref, (q, k, v), g)):  # fmt: skip
        ok &= a is not None and rules.flex_rule(a, b, c, fudge)
    return ok


PEERS = {
    "flash-attn": (FLASH_GRID, flash_point),
    "pytorch": (TORCH_GRID, torch_point),
    "flex": (FLEX_GRID, flex_point),
}


def sample(grid: dict, count: int, seed: int) -> list[dict]:
    """``count`` grid points drawn without replacement, seeded."""
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    return random.Random(seed).sample(points, min(count, len(points)))


def judge(row: Row, peer: str, count: int, seed: int = 0) -> dict:
    """``row``'s kernel at ``count`` points of ``peer``'s grid: caught when an applicable
    point fails the rule (a kernel error counts as a failure, as in the peer's test); the
    points are judged in the sample's order up to the first failure."""
    from side_by_side_rows import kernel_of

    if not row.kind.startswith("dense"):
        return {"verdict": "n/a", "run": 0, "failed": 0, "errors": 0}
    grid, point = PEERS[peer]
    fn = kernel_of(row)
    run = failed = errors = 0
    for p in sample(grid, count, seed):
        try:
            ok = point(row, fn, p)
        except Exception:
            ok, errors = False, errors + 1
        if ok is None:
            continue
        run += 1
        failed += not ok
        if failed:  # caught: the peer's test run fails at its first failing point
            break
    verdict = "caught" if failed else ("missed" if run else "n/a")
    return {"verdict": verdict, "run": run, "failed": failed, "errors": errors}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--points", type=int, default=6)
    parser.add_argument("--rows", nargs="*", default=[])
    args = parser.parse_args(argv)
    with open(args.out, "a") as sink:
        for row in ROWS:
            if args.rows and not any(w in row.name for w in args.rows):
                continue
            for peer in PEERS:
                start = time.perf_counter()
                record = {"row": row.name, "column": peer, **judge(row, peer, args.points)}
                record["seconds"] = round(time.perf_counter() - start, 1)
                sink.write(json.dumps(record) + "\n")
                sink.flush()
                print(record, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
