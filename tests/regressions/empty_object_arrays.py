"""Bug: empty object arrays crash with an unrelated AttributeError.

``exactattn.attention(np.empty((0, 3), object), ...)`` — an object array with no element
to tell its number system — ends in ``AttributeError: 'NoneType' object has no attribute
'name'`` (``backend_of`` takes the "empty" kind for NumPy and builds
``NumpyContext(None)``).

Expected: a result (an empty ``y`` of shape (0, v)) or a TypeError naming ``q`` and asking
for ``backend=``.

Fix (core, ``backends.backend_of``): when every argument is an empty object array, use
``NumpyContext(np.float64)`` (``dtype = ... or np.float64``), or raise TypeError("q is an
empty object array: pass backend=... to choose its number system").
"""

from __future__ import annotations

import numpy as np

import exactattn as ea

OPEN = None  # fixed in the core (see the closing note of the difftest issue)


def replay() -> None:
    q, k, v = np.empty((0, 3), object), np.empty((0, 3), object), np.empty((0, 2), object)
    try:
        y = ea.attention(q, k, v)
    except TypeError as error:
        assert "q" in str(error) and "backend" in str(error), str(error)
        return
    assert np.shape(y) == (0, 2)
