"""Fixed bug: the backward did not check ``stats``; tampered statistics gave silent wrong numbers.

``attention_backward(q, k, v, y, stats, g)`` recomputes ``p_ij = e^{s_ij − m_i}/ℓ_i`` from
the given ``stats.m``, ``stats.l``. With ``stats.m = +∞`` every ``p`` was 0 and the call
returned all-zero gradients without a word; with ``stats.l`` NaN or 0 it raised
``FloatingPointError: dq is not finite although the inputs are ... overflowed``, which
blamed the arithmetic for a bad argument.

Expected, and checked by :func:`replay` so the bug cannot return: ``ValueError`` naming
``stats.m`` / ``stats.l`` when ``m`` is NaN or +∞, or ``ℓ`` is not finite and positive on a
row with finite ``m``. (Statistics of another call with the same shapes cannot be told
apart without recomputation.)

Fixed in the core: the backward's input checks call ``validation.check_stats`` (numeric
contexts, ``check_finite=True``).
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
