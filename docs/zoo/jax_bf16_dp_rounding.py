"""JAX's attention backward rounds dP = G·Vᵀ to bfloat16 (modelled: the claim's dp=input).

The P·V einsum (jax/_src/nn/functions.py l. 973) has no preferred_element_type, so its
transpose returns the cotangent of the probabilities in bfloat16, before the float32
softmax backward; FlashAttention-2 keeps dP in float32.
"""

import jax
import jax.numpy as jnp
import numpy as np

q = jnp.asarray(np.random.default_rng(0).standard_normal((1, 4, 1, 8)), jnp.bfloat16)
grads = lambda q, g: jax.vjp(jax.nn.dot_product_attention, q, q, q)[1](g)  # noqa: E731
jaxpr = jax.make_jaxpr(grads)(q, q).jaxpr
dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
out = [str(e.outvars[0].aval) for e in dots]
print("\n".join(out))  # the forward's QKᵀ (f32), P·V (bf16), then dP = G·Vᵀ: bf16[1,1,1,4,4]
assert "bfloat16[1,1,1,4,4]" in out, out
