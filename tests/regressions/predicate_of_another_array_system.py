"""Bug: a mask predicate returning NumPy booleans for torch inputs crashes inside torch.

With torch inputs the predicate receives torch index tensors ``i``, ``j``; one that returns
a NumPy boolean array (an easy slip: ``np.ones(...)``, ``np.asarray(...)``) ends in torch's
``TypeError: where() received an invalid combination of arguments - got (numpy.ndarray,
Tensor, float)``, which does not name the mask. (Dense masks and key lengths are adopted by
the context since ``Mask.adopt``; a predicate's *result* is not.)

Expected: the result adopted like a dense mask, or ``TypeError`` naming the mask predicate
and both array systems.

Fix (core, ``masks.Predicate.tile``): after the dtype/shape checks, convert the result with
the same adoption ``Mask.adopt`` uses (or raise ``TypeError("mask predicate returned a
numpy.ndarray for torch index tensors; return a tensor")``).
"""

from __future__ import annotations

import numpy as np

import exactattn as ea
from tests.optional import requires

OPEN = None  # fixed in the core (see the closing note of the difftest issue)


def replay() -> None:
    torch = requires("torch")

    rng = np.random.default_rng(0)
    q, k, v = (torch.from_numpy(x) for x in rng.standard_normal((3, 4, 2)))
    try:
        y = ea.attention(q, k, v, mask=lambda i, j: np.ones((4, 4), dtype=bool))
    except TypeError as error:
        assert "mask" in str(error) and "predicate" in str(error), str(error)[:120]
        return
    assert torch.allclose(y, ea.attention(q, k, v), rtol=0, atol=1e-15)
