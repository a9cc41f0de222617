"""Fixed bug: float16 scores that overflowed to −∞ were taken for masked keys.

``s_ij = c·q_i·k_j`` is computed in the compute type; in float16 ``300·(−300) = −9e4``
overflows to ``−∞``, the value the algorithm reserves for ``j ∉ A_i``. A row whose every
score overflowed negatively then looked like an empty allowed set: the default policy
raised the misleading ``ValueError: query rows with no allowed key``, and with
``empty_rows='zero'`` the call silently returned ``y = 0`` where the exact answer is 2
(the softmax puts all weight on the larger score, key 1, whose value is 2). A scale that
itself overflowed the compute type (``scale=1e5`` in float16) did the same.

Found by ``exactattn difftest`` (numpy[float16], large logits; shrunk case in
``overflow_as_masked.json``). Expected, and checked by :func:`replay` so the bug cannot
return: the correct value, or a FloatingPointError naming the overflow — never "no allowed
key", never a silent 0.

Fixed in the core (``validation``): a row left at ⊥ although the mask allows keys in it
raises ``FloatingPointError`` naming the overflowed rows, and ``check_scale`` rejects a
scale that is not finite in the compute type.
"""

from __future__ import annotations

import numpy as np

import exactattn as ea

OPEN = None  # fixed in the core (see the closing note of the difftest issue)


def _inputs():
    q = np.array([[1.0]], np.float16)
    k = np.array([[-300.0], [-299.0]], np.float16)
    v = np.array([[1.0], [2.0]], np.float16)
    return q, k, v


def replay() -> None:
    q, k, v = _inputs()
    for policy in ("error", "zero"):
        try:
            y = ea.attention(q, k, v, scale=300.0, empty_rows=policy)
        except FloatingPointError:
            continue  # an honest overflow report is acceptable
        except ValueError as error:
            raise AssertionError(f"misleading error with empty_rows={policy!r}: {error}") from None
        assert np.allclose(y, 2.0), f"empty_rows={policy!r}: y = {y.ravel()}, exact 2"
