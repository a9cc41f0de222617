"""Fixed bug: a NumPy mask with torch inputs (or a torch mask with NumPy inputs) crashed inside.

``exactattn.attention(q, k, v, mask=allowed)`` with torch tensors and a NumPy boolean
``allowed`` ended in torch's own ``TypeError: where() received an invalid combination of
arguments``; NumPy inputs with a torch mask in ``any() received an invalid combination``;
a NumPy ``key_padding`` with torch inputs in ``'<' not supported between ... Tensor and
numpy.ndarray``. None named the mask. (``exactattn.torch.attention`` already converted the
mask.)

Expected, and checked by :func:`replay` so the bug cannot return: the mask is moved to the
inputs' array system, or a TypeError names ``mask`` and both systems.

Fixed by the lead (``Mask.adopt``): a mask's caller-owned arrays adopt the context's array
system and device.
"""

from __future__ import annotations

import numpy as np

import exactattn as ea
from tests.optional import requires

OPEN = None  # fixed by the lead (Mask.adopt) while this work was under way; replay stays


def replay() -> None:
    torch = requires("torch")

    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 4, 2))
    allowed = np.tril(np.ones((4, 4), dtype=bool))
    expected = ea.attention(q, k, v, mask=allowed)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    try:
        got = ea.attention(tq, tk, tv, mask=allowed)
    except TypeError as error:
        assert "mask" in str(error), f"unclear error: {str(error)[:120]}"
        return
    assert np.allclose(got.numpy(), expected, rtol=0, atol=1e-14)
