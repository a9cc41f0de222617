"""exactattn on torch tensors: the tiled algorithm as a differentiable torch operator.

* :func:`attention` — the library's strict API (checks inputs and, by default, values;
  masks of every kind, bias tensors or functions, softcap, dropout with an explicit seed,
  ``is_causal`` in either alignment);
* :func:`scaled_dot_product_attention` — ``torch.nn.functional.scaled_dot_product_attention``'s
  signature and contract, exactly;
* :func:`exact_sdpa` — a context manager routing every SDPA call in its block here;
* :func:`flex_attention` — ``torch.nn.attention.flex_attention.flex_attention``'s signature
  and semantics (mask_mods, BlockMasks, score_mods), exact, with a backward on the CPU.

Which path runs: a call whose mask and bias lower to tensors and integers (no mask, a boolean
mask tensor, causal or sliding windows in either alignment, per-batch key lengths, a bias
tensor, softcap; that is every SDPA call) runs the custom operator ``exactattn::attention``
(:mod:`.op`: fake implementation, autograd formula, vmap rule), so ``torch.compile(
fullgraph=True)``, ``torch.export`` and ``torch.func`` see one opaque op. A call with a Python
predicate, ``mask_mod(b, h, i, j)``, another :class:`~exactattn.core.masks.Mask`, or a bias
function runs :class:`.function.TiledAttention` (an ``autograd.Function``) instead: those
cannot cross an operator schema. Both run the same two passes (:mod:`.passes`): the generic
:mod:`exactattn.core.algorithm`, or on CUDA the Triton kernels when they express the call
(:mod:`.dispatch`).
"""

from ..infra.optional import needs

with needs("exactattn.torch"):  # the package's modules import torch freely after this
    import torch  # noqa: F401

from .flex import flex_attention
from .mode import ExactSDPA, exact_sdpa
from .partials import attention_with_lse, merge_partials
from .passes import DEFAULT_BLOCK_SIZE
from .sdpa import SDPAInputError, scaled_dot_product_attention
from .tensor_api import attention

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "ExactSDPA",
    "SDPAInputError",
    "attention",
    "attention_with_lse",
    "exact_sdpa",
    "flex_attention",
    "merge_partials",
    "scaled_dot_product_attention",
]
