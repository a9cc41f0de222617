"""jax.jit(jax.nn.dot_product_attention) raises for float16 on the CPU (jax 0.10.2).

_dot_product_attention_core asks for DotAlgorithmPreset.F16_F16_F32, which dot_general's
CPU lowering refuses (jax/_src/lax/lax.py l. 6124-6131); its try/except fallback
(jax/_src/nn/functions.py l. 941-959) sees errors while tracing, not at lowering.
"""

import jax
import numpy as np

q = np.random.default_rng(0).standard_normal((1, 4, 1, 8)).astype(np.float16)
print("op by op:", jax.nn.dot_product_attention(q, q, q).dtype)  # the fallback works
try:
    jax.jit(jax.nn.dot_product_attention)(q, q, q)
    raise SystemExit("not reproduced: jitted float16 attention ran")
except ValueError as error:
    assert "F16_F16_F32" in str(error), error
    print("under jit:", error)
