"""Jitted bfloat16 jax.nn.dot_product_attention does not compile on the CPU for degenerate
dot shapes: two of n_q·G, n_k, d equal to 1 (jaxlib 0.10.2). XLA:CPU emits such a dot
elementally, and its elemental emitter rejects the ALG_DOT_BF16_BF16_F32 algorithm the
attention's QKᵀ einsum asks for (xla/service/algorithm_util.cc IsSupportedByElementalIrEmitter).
"""

import jax
import jax.numpy as jnp
import numpy as np

rng = np.random.default_rng(0)
q, k = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for s in ((1, 1, 1, 1), (1, 15, 1, 1)))
print("op by op:", jax.nn.dot_product_attention(q, k, k).dtype)  # the fallback works
print("n_q = 2:", jax.jit(jax.nn.dot_product_attention)(jnp.tile(q, (1, 2, 1, 1)), k, k).shape)
try:
    jax.jit(jax.nn.dot_product_attention)(q, k, k)
    raise SystemExit("not reproduced: jitted bfloat16 attention with n_q = d = 1 compiled")
except Exception as error:  # jax.errors.JaxRuntimeError: INVALID_ARGUMENT
    assert "ALG_DOT_BF16_BF16_F32" in str(error), error
    print("n_q = d = 1 under jit:", str(error).splitlines()[0])
