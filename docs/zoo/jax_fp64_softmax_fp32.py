"""float64 inputs come back float32-accurate (modelled: the claim's compute format float32).

_dot_product_attention_core computes the logits in float64 but "Softmax and it is always
carried out in fp32": padded_logits.astype(np.float32) (jax/_src/nn/functions.py l. 970),
probs = softmax(...).astype(key.dtype) (l. 971): error ~1e-7, not ~1e-16.
"""

import jax
import numpy as np

q, k, v = np.random.default_rng(0).standard_normal((3, 1, 16, 1, 8))
s = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(8)
p = np.exp(s - s.max(-1, keepdims=True))
y = np.einsum("bnts,bsnh->btnh", p / p.sum(-1, keepdims=True), v)
with jax.enable_x64(True):  # scoped: a global jax_enable_x64 changes every later caller
    out = np.asarray(jax.jit(jax.nn.dot_product_attention)(q, k, v))
print(out.dtype, "max error:", np.abs(out - y).max())  # float64, ~1e-7
assert out.dtype == np.float64 and 1e-9 < np.abs(out - y).max() < 1e-5
