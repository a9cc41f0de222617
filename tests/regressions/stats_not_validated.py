"""Bug: the backward does not check ``stats``; tampered statistics give silent wrong numbers.

``attention_backward(q, k, v, y, stats, g)`` recomputes ``p_ij = e^{s_ij − m_i}/ℓ_i`` from
the given ``stats.m``, ``stats.l``. With ``stats.m = +∞`` every ``p`` is 0 and the call
returns all-zero gradients without a word; with ``stats.l`` NaN or 0 it raises
``FloatingPointError: dq is not finite although the inputs are ... overflowed``, which
blames the arithmetic for a bad argument.

Expected: ``ValueError`` naming ``stats.m`` / ``stats.l`` when ``m`` is NaN or +∞, or ``ℓ``
is not finite and positive on a row with finite ``m``.

Fix (core, ``api._check_backward_inputs``): after the shape checks, when ``check_finite``:
``bad_m = ctx.nonfinite(m) & ~ctx.is_neg_inf(m)`` → ValueError("stats.m contains NaN or
+inf ..."); ``bad_l = ~ctx.is_neg_inf(m) & (ctx.nonfinite(l) | (l <= 0))`` →
ValueError("stats.l must be finite and > 0 on rows with an allowed key ..."). (Statistics
of another call with the same shapes cannot be told apart without recomputation.)
"""

from __future__ import annotations

import dataclasses

import numpy as np

import exactattn as ea

OPEN = None  # fixed in the core (see the closing note of the difftest issue)


def replay() -> None:
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 4, 2))
    y, stats = ea.attention(q, k, v, return_stats=True)
    g = np.ones_like(y)
    for field, value in (("m", np.inf), ("l", np.nan), ("l", 0.0)):
        spoiled = dataclasses.replace(stats, **{field: np.full_like(getattr(stats, field), value)})
        try:
            ea.attention_backward(q, k, v, y, spoiled, g)
        except ValueError as error:
            assert f"stats.{field}" in str(error), str(error)
            continue
        except FloatingPointError as error:
            raise AssertionError(f"stats.{field}={value}: misleading {error}") from None
        raise AssertionError(f"stats.{field}={value} accepted silently")
