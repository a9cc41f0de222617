"""Fixed bug: NumPy scalars for ``dropout_p`` and ``seed`` were refused with a wrong message.

``attention(..., dropout_p=np.float32(0.25), seed=np.int64(3))`` raised
``ValueError: dropout_p must be a number in [0, 1); got np.float32(0.25)`` — although the
value is a number in [0, 1); ``seed=np.int64(3)`` likewise ("must be an integer").
``block_size`` accepted NumPy integers, and values read from arrays or configs are often
NumPy scalars.

Expected, and checked by :func:`replay` so the bug cannot return: the same result as with
``float(dropout_p)`` and ``int(seed)``.

Fixed in the core (``dropout.make_dropout`` and ``Dropout.__post_init__``): the checks use
``numbers.Real`` / ``numbers.Integral`` (still refusing ``bool``) and store
``float(dropout_p)``, ``int(seed)``.
"""

from __future__ import annotations

import numpy as np

import exactattn as ea

OPEN = None  # fixed in the core (see the closing note of the difftest issue)


def replay() -> None:
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 4, 2))
    expected = ea.attention(q, k, v, dropout_p=0.25, seed=3)
    got = ea.attention(q, k, v, dropout_p=np.float64(0.25), seed=np.int64(3))
    assert np.array_equal(got, expected)
