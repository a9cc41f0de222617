"""XLA's CPU runtime flushes subnormals to zero (modelled: ftz=float32+bfloat16).

xla/pjrt/cpu/cpu_client.cc wraps each execution in tsl::port::ScopedFlushDenormal "to match
the default TF ThreadPool behavior": float32 subnormals (below 2^-126, bfloat16's range too)
become 0. Found as a bfloat16 dK = 0 where the exact value is 4.86e-38.
"""

import jax
import jax.numpy as jnp
import numpy as np

x = np.float32(2.0**-70)
print("x·x:", jax.jit(lambda a: a * a)(x), "NumPy:", x * x)  # 0.0 vs 7.2e-43
n, e0 = 64, np.eye(8)[0]  # keys 0: p = 1/64, γ_ij = ±1/64, dK_j = ±c·2^-128, subnormal
q, g = np.tile(2.0**-128 * e0, (1, n, 1, 1)), np.tile(e0, (1, n, 1, 1))
v = g * np.where(np.arange(n) % 2, -1.0, 1.0)[None, :, None, None]
q, k, v, g = (jnp.asarray(a, jnp.bfloat16) for a in (q, 0 * q, v, g))
dk = jax.vjp(jax.jit(jax.nn.dot_product_attention), q, k, v)[1](g)[1]
print("dK[0, 0]:", dk[0, 0, 0, 0], "exact:", 2.0**-128 / 8**0.5)  # 0 vs 1.04e-39
assert float(dk[0, 0, 0, 0]) == 0.0 and float(jax.jit(lambda a: a * a)(x)) == 0.0
