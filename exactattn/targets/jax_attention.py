"""JAX's ``jax.nn.dot_product_attention`` as targets ``jax-xla`` and ``jax-cudnn``.

The callables take the ``sdpa`` convention (:mod:`.conventions`): torch tensors
``(B, H, n, d)``, ``attn_mask`` (boolean, True = attend, or a float bias with ``−∞`` where
the mask excludes), ``is_causal`` (top-left), ``scale``, ``enable_gqa``, ``dropout_p``. They
transpose to JAX's ``(B, T, N, H)``, pass the boolean mask as ``mask`` and a float one as
``bias``, K and V with fewer heads for GQA as JAX takes them natively (query head ``n``
reads key/value head ``n // G``, as SDPA's ``enable_gqa``), and run under ``jax.jit``.
Gradients: a ``torch.autograd.Function`` whose forward runs ``jax.vjp`` and whose backward
calls the vjp function, so the convention's torch autograd reaches dQ, dK, dV.

float64 inputs run under ``jax.enable_x64(True)``, scoped to the call (forward and
backward): without it JAX would silently hold them in float32. x64 changes no arithmetic
of the other dtypes here: every dtype in the attention is explicit (the logits' via
``promote_types``, ``softmax`` on ``astype(float32)``, the scale and the mask's fill
``jnp.asarray(..., dtype=...)``), and float32 outputs are bit-identical with it on or off
(measured, jax 0.10.2).

The arithmetic, from ``jax/_src/nn/functions.py`` (jax-v0.10.2; the same at 0.11.1):

* ``dot_product_attention`` (l. 1186–1199) requires ``value`` of ``key``'s shape
  ("value shape should be [B, S, K, H]"): v ≠ d is a refusal (skipped with that message);
  the default scale is ``1/np.sqrt(H)``.
* ``_dot_product_attention_xla`` (l. 985–1029) vmaps the core over the G query heads of a
  group with ``key, value`` unbatched: a group's dK, dV are one sum over its heads before any
  rounding (``group=None``).
* ``_dot_product_attention_core`` (l. 925–983): ``logits_dtype =
  promote_types(query.dtype, float32)``; ``QKᵀ`` by ``einsum(...,
  preferred_element_type=logits_dtype)`` with ``precision=DotAlgorithmPreset.BF16_BF16_F32``
  (bfloat16) or ``F16_F16_F32`` (float16): products accumulated and returned in float32
  (float64 for float64 inputs); ``logits *= scale`` and ``logits + bias`` in that dtype;
  masked logits replaced by ``-0.7·finfo.max``, capped at float32's (``_apply_masks``,
  l. 897–923; ``_get_large_negative``, l. 859–866);
  "Softmax and it is always carried out in fp32": ``padded_logits.astype(np.float32)``
  (l. 970), ``probs = softmax(...).astype(key.dtype)`` (l. 971): ``p`` cast to the input
  dtype after the normalisation (exact for float64, whose probabilities are float32 values);
  ``P·V`` by a plain ``einsum`` (l. 973) in the input dtype (XLA's CPU dot upcasts
  bfloat16/float16 operands to float32 and rounds the result once: measured in the
  compiled HLO).

The reverse is JAX's autodiff of that program (δ a row sum of ``p·dP``, ``m, ℓ`` frozen).
Two of its roundings are beyond FlashAttention-2's: the ``P·V`` einsum (l. 973) has no
``preferred_element_type``, so its transpose returns ``dP = G·Vᵀ`` in the input dtype
(bfloat16/float16: rounded; found by the default check as dQ 1.1× past the FA-2 bound at
n_k = 1428, dK up to 1.9× at n_k = 64), and the ``QKᵀ`` einsum's ``BF16_BF16_F32``
transpose casts the float32 ``c·γ`` to bfloat16 before the dQ, dK products (the claim's
``p`` cast covers γ too). And XLA's CPU runtime flushes subnormals to zero in every
operation (``tsl::port::ScopedFlushDenormal`` around each execution,
``xla/pjrt/cpu/cpu_client.cc``, "to match the default TF ThreadPool behavior"; found as a
bfloat16 dK = 0 where the exact value is 4.86e-38): ``ftz=bfloat16`` charges each bfloat16
cast and each float32 accumulation (bfloat16's exponent range) the smallest normal number.

So the claim, for every dtype: scores, statistics and accumulators float32, ``p`` and
``dP`` in the input dtype (a cast for bfloat16/float16), one block over all keys (naive
attention), bfloat16-range flushes (claimed on every device, as this wrapper runs JAX on
its default device: looser than needed where that is a GPU). For float64 the compute
format is float32: the float64 logits are rounded to float32 before the softmax, and a
float32 compute bounds the float64 ``P·V`` too (:meth:`Claim.arith` never accumulates
finer than it computes).
What the claim cannot say is a ``KNOWN-UPSTREAM`` finding (:mod:`exactattn.testing.known`):
float16 under ``jax.jit`` raises on the CPU (``jax-cpu-fp16-jit``), and bfloat16 dots of
degenerate shapes do not compile there (``jax-cpu-bf16-elemental-dot``).

What the sdpa convention cannot express: JAX's own ``local_window_size``,
``query_seq_lengths`` and ``key_value_seq_lengths``. The convention sends a sliding window
or key lengths as a boolean ``attn_mask``, which the xla implementation ANDs exactly as it
does its own (``_apply_masks``); the native arguments (which the cudnn implementation
lowers differently, and ``query_seq_lengths`` zeroes padded rows) wait for a convention
that carries them. A row with no allowed key averages every value (the fill is finite), and
with a ``−∞`` bias it is NaN: not exactattn's empty-row semantics, so such cases are
skipped.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from ..infra.optional import needs
from .target import FLOAT_DTYPES, REVERSES, Capabilities, Claim, Options, Target

CLAIM = Claim(
    scores="float32", stats="float32", acc="float32", block=0, dp="input", ftz="bfloat16"
)  # see the module docstring
KNOWN = ("jax-cpu-fp16-jit", "jax-cpu-bf16-elemental-dot")  # exactattn.testing.known
REFUSALS = (("ValueError", r"value shape should be"),)  # dot_product_attention, l. 1187
NO_DROPOUT = "jax.nn.dot_product_attention has no dropout"
EMPTY_ROWS = (
    "a row with no allowed key averages every value (masked logits are -0.7·finfo.max, "
    "jax/_src/nn/functions.py _apply_masks), or is NaN under a -inf bias"
)


def xla_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """``jax.nn.dot_product_attention(..., implementation="xla")`` in SDPA's signature."""
    return _attention("xla", query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def cudnn_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """``jax.nn.dot_product_attention(..., implementation="cudnn")`` in SDPA's signature."""
    return _attention(
        "cudnn", query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
    )


def _attention(
    implementation, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
):
    if dropout_p:
        raise NotImplementedError(NO_DROPOUT)
    if not enable_gqa and key.shape[-3] != query.shape[-3]:
        raise ValueError(
            f"query has {query.shape[-3]} heads and key {key.shape[-3]}: "
            "pass enable_gqa=True for grouped-query attention"
        )
    settings = (implementation, bool(is_causal), None if scale is None else float(scale))
    return _function().apply(query, key, value, attn_mask, settings)


@functools.cache
def _function() -> Any:
    """The ``torch.autograd.Function`` around ``jax.vjp`` (made on first use: torch is
    optional)."""
    import torch

    class JaxAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, query, key, value, attn_mask, settings):
            jax = _jax()
            dtype = query.dtype
            with _x64(dtype):
                q, k, v = (_to_jax(t, dtype) for t in (query, key, value))
                bias, mask = _bias_and_mask(attn_mask, dtype)
                attend = _jitted(*settings)
                if any(ctx.needs_input_grad[:3]):
                    y, ctx.vjp = jax.vjp(lambda q, k, v: attend(q, k, v, bias, mask), q, k, v)
                else:
                    y = attend(q, k, v, bias, mask)
            return _to_torch(y, dtype, query.device)

        @staticmethod
        def backward(ctx, g):
            dtype = g.dtype
            with _x64(dtype):
                grads = ctx.vjp(_to_jax(g.contiguous(), dtype))
            return (*(_to_torch(x, dtype, g.device) for x in grads), None, None)

    return JaxAttention


@functools.cache
def _jitted(implementation: str, is_causal: bool, scale: float | None) -> Any:
    """The jitted ``(q, k, v, bias, mask) → y`` for these static settings (JAX compiles it
    once per shape and dtype)."""
    jax = _jax()

    def attend(q, k, v, bias, mask):
        return jax.nn.dot_product_attention(
            q, k, v, bias, mask, scale=scale, is_causal=is_causal, implementation=implementation
        )

    return jax.jit(attend)


def _jax() -> Any:
    with needs("the jax-xla / jax-cudnn targets"):
        import jax
    return jax


def _x64(dtype: Any) -> Any:
    """float64 inputs need JAX's 64-bit mode, scoped to the call (module docstring)."""
    import torch

    return _jax().enable_x64(True) if dtype == torch.float64 else contextlib.nullcontext()


def _to_jax(t: Any, dtype: Any) -> Any:
    """A torch ``(B, H, n, ·)`` tensor as a JAX ``(B, n, H, ·)`` array of the same dtype,
    exactly (through float32, or float64 for float64: NumPy has no bfloat16)."""
    import torch

    jnp = _jax().numpy
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    x = t.detach().to("cpu", wide).numpy().transpose(0, 2, 1, 3)
    return jnp.asarray(x, dtype=_jax_dtype(dtype))


def _to_torch(x: Any, dtype: Any, device: Any) -> Any:
    """A JAX ``(B, n, H, ·)`` array as a torch ``(B, H, n, ·)`` tensor of ``dtype``."""
    import numpy as np
    import torch

    wide = np.float64 if dtype == torch.float64 else np.float32
    y = np.asarray(x).astype(wide).transpose(0, 2, 1, 3).copy()  # NumPy casts bfloat16 too
    return torch.from_numpy(y).to(device=device, dtype=dtype)


def _bias_and_mask(attn_mask: Any, dtype: Any) -> tuple[Any, Any]:
    """SDPA's ``attn_mask`` as JAX's ``(bias, mask)``: a boolean one is the mask, a float one
    the bias in the input dtype (both ``(B, H, n_q, n_k)``, JAX's ``BNTS``)."""
    import torch

    if attn_mask is None:
        return None, None
    jnp = _jax().numpy
    if attn_mask.dtype == torch.bool:
        return None, jnp.asarray(attn_mask.detach().cpu().numpy())
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    bias = attn_mask.detach().to("cpu", wide).numpy()
    return jnp.asarray(bias, dtype=_jax_dtype(attn_mask.dtype)), None


def _jax_dtype(dtype: Any) -> Any:
    return getattr(_jax().numpy, str(dtype).removeprefix("torch."))


def _jax_gpu() -> str | None:
    """Why JAX cannot run cuDNN here (None when it has a GPU backend)."""
    try:
        _jax().devices("gpu")
    except RuntimeError as error:
        return f"jax has no GPU backend ({str(error).splitlines()[0][:120]})"
    return None


def _target(name: str, implementation: str, description: str) -> Target:
    cudnn = implementation == "cudnn"
    caps = Capabilities(
        dtypes=("float16", "bfloat16") if cudnn else FLOAT_DTYPES,
        devices=("cuda",) if cudnn else ("cpu", "cuda"),
        dropout=NO_DROPOUT,
        empty_rows=EMPTY_ROWS,
        bias=True,
        softcap="the sdpa convention has no soft-cap",
    )
    options = Options(
        refusals=REFUSALS,
        policy="fa2" if cudnn else None,  # cuDNN flash attention: its blocks are not stated
        reverses=REVERSES if cudnn else (("ml", "rowsum"),),  # xla: autodiff of naive
        check=_jax_gpu if cudnn else None,
        known=() if cudnn else KNOWN,
    )
    loader = (lambda: cudnn_attention) if cudnn else (lambda: xla_attention)
    return Target(
        name=name,
        convention="sdpa",
        loader=loader,
        caps=caps,
        claim=Claim() if cudnn else CLAIM,
        description=description,
        requires=("torch", "jax"),
        needs_cuda=cudnn,
        options=options,
    )


def entries() -> list[Target]:
    """The JAX targets."""
    return [
        _target("jax-xla", "xla", 'jax.nn.dot_product_attention(implementation="xla")'),
        _target("jax-cudnn", "cudnn", 'jax.nn.dot_product_attention(implementation="cudnn")'),
    ]
