"""How ``exactattn check`` calls an SDPA-convention kernel: the share of each calling path.

``python -m tests.check.call_shares [--examples N] [--seed S]`` checks a spying function
(torch's SDPA math backend behind a recorder, ``--supports bias=yes``: a passing
function, so no failure's shrink adds calls) and prints what it was called with:
``is_causal`` (and with ``n_q ≠ n_k``), no mask, a boolean or float ``attn_mask``, decode
(``n_q = 1``), GQA, and the largest ``n_k``. The issue that asked for calling paths measured
0% ``is_causal`` on the old distribution; docs/check.md gives today's figures.
"""

from __future__ import annotations

import argparse
from collections import Counter

from exactattn import targets
from exactattn.testing import session

CALLS: list[dict] = []


def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    CALLS.append(
        {
            "causal": bool(is_causal),
            "n_q": q.shape[-2],
            "n_k": k.shape[-2],
            "mask": None if attn_mask is None else str(attn_mask.dtype),
            "gqa": q.shape[-3] != k.shape[-3] if q.dim() >= 3 and k.dim() >= 3 else False,
        }
    )
    with sdpa_kernel(SDPBackend.MATH):  # the CPU flash kernel's negative-scale NaN would
        return F.scaled_dot_product_attention(  # fail a case, and its shrink's calls count
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            scale=scale, enable_gqa=enable_gqa,
        )  # fmt: skip


def shares(calls: list[dict]) -> dict[str, float]:
    n = len(calls)
    kinds = Counter(c["mask"] for c in calls)
    return {
        "calls": n,
        "is_causal": sum(c["causal"] for c in calls) / n,
        "is_causal, n_q != n_k": sum(c["causal"] and c["n_q"] != c["n_k"] for c in calls) / n,
        "no mask": sum(not c["causal"] and c["mask"] is None for c in calls) / n,
        "boolean attn_mask": kinds["torch.bool"] / n,
        "float attn_mask": sum(v for k, v in kinds.items() if k and k != "torch.bool") / n,
        "decode (n_q = 1)": sum(c["n_q"] == 1 for c in calls) / n,
        "GQA": sum(c["gqa"] for c in calls) / n,
        "largest n_k": max(c["n_k"] for c in calls),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    base = targets.user_capabilities("sdpa")
    target = targets.from_callable(
        spy, name="spy", supports=targets.Capabilities.parse("bias=yes", base)
    )
    settings = session.Settings(
        examples=args.examples, seed=args.seed, probes=False, baselines=False, determinism=False
    )
    session.run([target], settings)
    for name, value in shares(CALLS).items():
        print(f"{name:24} {value:.0%}" if isinstance(value, float) else f"{name:24} {value}")


if __name__ == "__main__":
    main()
