"""The exponent's argument on the torch path: ``e^{s − m}`` taken as ``2^{(s − m)·log₂e}``.

Against exp evaluated by mpmath at the float32 arguments, the relative error of torch's
``exp_shifted`` exceeds one rounding of the argument (``u|s − m|``) plus the functions'
``funcs·u``, and stays within the three roundings ``exactattn.error.bounds`` charges
(``EXP_ARG_ROUNDINGS``: the subtraction, ``log₂e`` and the product).
"""

from __future__ import annotations

import mpmath
import numpy as np

from exactattn.error import bounds
from tests.optional import requires

torch = requires("torch")

U = 2.0**-24  # float32's unit roundoff


def test_exp_shifted_needs_three_roundings_of_its_argument():
    from exactattn.backends.torch_backend import TorchContext

    ctx = TorchContext("float32")
    funcs = bounds.Arith.of_context(ctx).funcs
    generator = torch.Generator().manual_seed(0)
    s = -40 - 40 * torch.rand(1, 20000, generator=generator, dtype=torch.float32)
    t = s.double().numpy()[0]  # the shift is 0: s − m is exact here
    got = ctx.exp_shifted(s.clone(), torch.zeros(1)).double().numpy()[0]
    exact = np.array([float(mpmath.exp(x)) for x in t])
    relative = np.abs(got / exact - 1)
    one = relative / (U * np.abs(t) + funcs * U)
    charged = relative / (bounds.EXP_ARG_ROUNDINGS * U * np.abs(t) + funcs * U)
    assert one.max() > 1, "exp2's extra roundings no longer show: the charge may be lowered"
    assert charged.max() <= 1
