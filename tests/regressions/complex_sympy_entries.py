"""Bug: a non-real sympy entry fails deep inside with sympy's own message.

``exactattn.attention`` over sympy object arrays holding ``sympy.I`` ends in
``ValueError: The argument 'I' is not comparable.`` (raised by ``sympy.Max`` in the running
max), which names neither the argument nor the rule. NumPy complex arrays are refused up
front ("q has dtype complex128").

Expected: ``TypeError`` naming ``q`` and saying entries must be real.

Fix (core, ``backends.sympy_backend``): a ``SympyContext.asarray`` (or ``_convert``) that
raises ``TypeError(f"... entries must be real; got {x}")`` when ``expr.is_real is False``
(``is_real is None`` — an unconstrained symbol — stays allowed, as the proofs need).
"""

from __future__ import annotations

import numpy as np

import exactattn as ea

OPEN = None  # fixed in the core (see the closing note of the difftest issue)


def replay() -> None:
    import sympy

    one = np.array([[sympy.Integer(1)]], dtype=object)
    try:
        ea.attention(np.array([[sympy.I]], dtype=object), one, one.copy())
    except TypeError as error:
        assert "q" in str(error) and "real" in str(error), str(error)
        return
    raise AssertionError("a complex sympy entry was accepted")
