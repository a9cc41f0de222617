"""Fixed bug: ``exactattn.torch.attention(check_finite=False)`` refused non-finite output.

With an inf in ``q`` and ``check_finite=False`` (the documented opt-out, honoured by
``exactattn.attention``), the torch path raised ``FloatingPointError: y is not finite
although the inputs are: ... overflowed`` — the opt-out was ignored and the message was
false (the inputs are not finite).

Expected, and checked by :func:`replay` so the bug cannot return: the call computes (NaN/inf
where the input had them), as the NumPy API does.

Fixed in ``exactattn/torch.py``: ``check_finite`` travels with the call's plan and the
output and gradient checks run only when it is True.
"""

from __future__ import annotations

import numpy as np

from tests.optional import requires

OPEN = None  # fixed in exactattn/torch.py while this work was under way; the replay stays


def replay() -> None:
    torch = requires("torch")
    import exactattn.torch as et

    q = torch.from_numpy(np.random.default_rng(0).standard_normal((4, 3)))
    bad = q.clone()
    bad[0, 0] = float("inf")
    y = et.attention(bad, q, q, check_finite=False)
    assert not torch.isfinite(y).all()
