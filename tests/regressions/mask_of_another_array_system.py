"""Fixed bug: a NumPy mask with torch inputs (or a torch mask with NumPy inputs) crashes inside.

``exactattn.attention(q, k, v, mask=allowed)`` with torch tensors and a NumPy boolean
``allowed`` ends in torch's own ``TypeError: where() received an invalid combination of
arguments``; NumPy inputs with a torch mask end in ``any() received an invalid combination``;
a NumPy ``key_padding`` with torch inputs in ``'<' not supported between ... Tensor and
numpy.ndarray``. None names the mask. (``exactattn.torch.attention`` converts the mask.)

Expected: the mask is moved to the inputs' array system (as ``exactattn.torch`` does with
``_on_device``), or a TypeError naming ``mask`` and both systems.

Fix (core, ``api._prepare``): after ``as_mask``, convert a ``Dense`` / ``KeyPadding`` mask's
array with the context (``torch.as_tensor(x, device=ctx.device)`` for torch, ``np.asarray``
for NumPy/object contexts) — e.g. a ``Mask.to(ctx)`` hook reused by ``exactattn.torch``.
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
