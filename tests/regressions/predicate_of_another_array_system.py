"""Fixed bug: a mask predicate returning NumPy booleans for torch inputs crashed inside torch.

With torch inputs the predicate receives torch index tensors ``i``, ``j``; one that
returned a NumPy boolean array (an easy slip: ``np.ones(...)``, ``np.asarray(...)``) ended
in torch's ``TypeError: where() received an invalid combination of arguments - got
(numpy.ndarray, Tensor, float)``, which did not name the mask. (Dense masks and key lengths
were adopted by the context since ``Mask.adopt``; a predicate's *result* was not.)

Expected, and checked by :func:`replay` so the bug cannot return: the result adopted like a
dense mask, or ``TypeError`` naming the mask predicate and both array systems.

Fixed in the core (``masks.Predicate.tile``): a result of another array system is refused
with a TypeError naming the mask predicate.
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
