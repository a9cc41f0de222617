"""Fixed bug: a non-real sympy entry failed deep inside with sympy's own message.

``exactattn.attention`` over sympy object arrays holding ``sympy.I`` ended in
``ValueError: The argument 'I' is not comparable.`` (raised by ``sympy.Max`` in the running
max), which named neither the argument nor the rule. NumPy complex arrays were already
refused up front ("q has dtype complex128").

Expected, and checked by :func:`replay` so the bug cannot return: ``TypeError`` naming
``q`` and saying entries must be real.

Fixed in the core (``backends.sympy_backend``): an entry whose ``is_extended_real`` is
``False`` is refused ("entries must be real"); free symbols (``None``) and ±oo (the ``m``
of ⊥ in retained statistics) stay allowed, as the proofs need.
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
