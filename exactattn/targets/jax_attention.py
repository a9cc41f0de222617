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

What the sdpa convention cannot express — JAX's own ``local_window_size``,
``query_seq_lengths`` and ``key_value_seq_lengths`` — the ``jax`` convention
(:mod:`.jax_convention`) carries: ``jax-xla-native`` and ``jax-cudnn-native`` are the same
calls with the case's masks lowered to JAX's own arguments (a window as
``local_window_size``, top-left aligned as JAX aligns it; key lengths; query lengths, whose
padded rows JAX returns as exactly 0; the rest as ``mask``). The xla implementation ANDs
them all into one mask (``_apply_masks``), so the arithmetic, and the claim, is
``jax-xla``'s. The cudnn twin lowers them to cuDNN's mask types and sliding window (l.
1210–1243: a window only with ``right = 0`` or plain causal, else a ValueError, a refusal);
its alignment for ``n_q ≠ n_k`` is not checked here (no GPU).
A row with no allowed key (other than a padded query row of the jax convention) averages
every value (the fill is finite), and with a ``−∞`` bias it is NaN: not exactattn's
empty-row semantics, so such cases are skipped.
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
# cuDNN takes a window only as a left size with right = 0 or plain causal (l. 1231-1237)
CUDNN_REFUSALS = (("ValueError", r"cuDNN doesn't support right window"),)
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


def xla_native(query, key, value, bias=None, mask=None, **arguments):
    """``jax.nn.dot_product_attention(..., implementation="xla")`` with JAX's own mask
    arguments (the ``jax`` convention, :mod:`.jax_convention`)."""
    return _native("xla", query, key, value, bias, mask, **arguments)


def cudnn_native(query, key, value, bias=None, mask=None, **arguments):
    """``jax.nn.dot_product_attention(..., implementation="cudnn")`` with JAX's own mask
    arguments (the ``jax`` convention, :mod:`.jax_convention`)."""
    return _native("cudnn", query, key, value, bias, mask, **arguments)


def _attention(
    implementation, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
):
    import torch

    if dropout_p:
        raise NotImplementedError(NO_DROPOUT)
    if not enable_gqa and key.shape[-3] != query.shape[-3]:
        raise ValueError(
            f"query has {query.shape[-3]} heads and key {key.shape[-3]}: "
            "pass enable_gqa=True for grouped-query attention"
        )
    boolean = attn_mask is None or attn_mask.dtype == torch.bool  # SDPA's float mask: a bias
    bias, mask = (None, attn_mask) if boolean else (attn_mask, None)
    return _native(implementation, query, key, value, bias, mask, is_causal=is_causal, scale=scale)


def _native(
    implementation, query, key, value, bias, mask, *, scale=None, is_causal=False,
    query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
):  # fmt: skip
    """JAX's call on torch tensors ``(B, H, n, ·)``: ``bias`` (float) and ``mask`` (boolean,
    True = attend) ``(B, H, n_q, n_k)``, the lengths int32 ``(B,)``, the window ``(left,
    right)`` as JAX takes them (JAX checks their shapes and dtypes, naming the argument)."""
    if local_window_size is not None:
        local_window_size = tuple(int(x) for x in local_window_size)
    settings = (implementation, bool(is_causal), None if scale is None else float(scale))
    extras = (bias, mask, query_seq_lengths, key_value_seq_lengths)
    return _function().apply(query, key, value, extras, (*settings, local_window_size))


@functools.cache
def _function() -> Any:
    """The ``torch.autograd.Function`` around ``jax.vjp`` (made on first use: torch is
    optional): ``(query, key, value, extras, settings)``, ``extras`` the tensors JAX takes
    beside them (``bias, mask, query_seq_lengths, key_value_seq_lengths``; None: absent),
    ``settings`` the static ``(implementation, is_causal, scale, local_window_size)``."""
    import torch

    class JaxAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, query, key, value, extras, settings):
            jax = _jax()
            dtype = query.dtype
            with _x64(dtype):
                q, k, v = (_to_jax(t, dtype) for t in (query, key, value))
                arrays = _extras(extras, dtype)
                attend = _jitted(*settings)
                if any(ctx.needs_input_grad[:3]):
                    y, ctx.vjp = jax.vjp(lambda q, k, v: attend(q, k, v, *arrays), q, k, v)
                else:
                    y = attend(q, k, v, *arrays)
            return _to_torch(y, dtype, query.device)

        @staticmethod
        def backward(ctx, g):
            dtype = g.dtype
            with _x64(dtype):
                grads = ctx.vjp(_to_jax(g.contiguous(), dtype))
            return (*(_to_torch(x, dtype, g.device) for x in grads), None, None)

    return JaxAttention


@functools.cache
def _jitted(
    implementation: str, is_causal: bool, scale: float | None,
    local_window_size: tuple[int, int] | None = None,
) -> Any:  # fmt: skip
    """The jitted ``(q, k, v, bias, mask, q_lengths, kv_lengths) → y`` for these static
    settings (JAX compiles it once per shape and dtype)."""
    jax = _jax()

    def attend(q, k, v, bias, mask, q_lengths, kv_lengths):
        return jax.nn.dot_product_attention(
            q, k, v, bias, mask, scale=scale, is_causal=is_causal,
            query_seq_lengths=q_lengths, key_value_seq_lengths=kv_lengths,
            local_window_size=local_window_size, implementation=implementation,
        )  # fmt: skip

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


def _extras(extras: tuple, dtype: Any) -> tuple:
    """The tensors beside ``q, k, v`` as JAX arrays: the bias in its own float dtype (held
    through float32, or float64 for float64 inputs), the boolean mask and the integer
    lengths as they are (JAX's ``BNTS`` for the first two, ``(B,)`` for the lengths)."""
    import torch

    jnp = _jax().numpy
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    out = []
    for t in extras:
        if t is None or not t.dtype.is_floating_point:
            out.append(None if t is None else jnp.asarray(t.detach().cpu().numpy()))
        else:
            out.append(jnp.asarray(t.detach().to("cpu", wide).numpy(), dtype=_jax_dtype(t.dtype)))
    return tuple(out)


def _jax_dtype(dtype: Any) -> Any:
    return getattr(_jax().numpy, str(dtype).removeprefix("torch."))


def _jax_gpu() -> str | None:
    """Why JAX cannot run cuDNN here (None when it has a GPU backend)."""
    try:
        _jax().devices("gpu")
    except RuntimeError as error:
        return f"jax has no GPU backend ({str(error).splitlines()[0][:120]})"
    return None


def _target(name: str, implementation: str, description: str, native: bool = False) -> Target:
    """A JAX target: the sdpa convention's wrappers, or with ``native`` the ``jax``
    convention's (JAX's own mask arguments; its rows with no allowed key are the padded
    query rows, :mod:`.jax_convention`)."""
    cudnn = implementation == "cudnn"
    caps = Capabilities(
        dtypes=("float16", "bfloat16") if cudnn else FLOAT_DTYPES,
        devices=("cuda",) if cudnn else ("cpu", "cuda"),
        dropout=NO_DROPOUT,
        empty_rows=True if native else EMPTY_ROWS,
        bias=True,
        softcap=f"the {'jax' if native else 'sdpa'} convention has no soft-cap",
    )
    options = Options(
        refusals=REFUSALS + CUDNN_REFUSALS if cudnn else REFUSALS,
        policy="fa2" if cudnn else None,  # cuDNN flash attention: its blocks are not stated
        reverses=REVERSES if cudnn else (("ml", "rowsum"),),  # xla: autodiff of naive
        check=_jax_gpu if cudnn else None,
        known=() if cudnn else KNOWN,
    )
    wrappers = {
        (False, False): xla_attention, (True, False): cudnn_attention,
        (False, True): xla_native, (True, True): cudnn_native,
    }  # fmt: skip
    fn = wrappers[cudnn, native]
    return Target(
        name=name,
        convention="jax" if native else "sdpa",
        loader=lambda: fn,
        caps=caps,
        claim=Claim() if cudnn else CLAIM,
        description=description,
        requires=("torch", "jax"),
        needs_cuda=cudnn,
        options=options,
    )


def entries() -> list[Target]:
    """The JAX targets."""
    own = "bias, mask, is_causal, local_window_size, query/key_value_seq_lengths"
    return [
        _target("jax-xla", "xla", 'jax.nn.dot_product_attention(implementation="xla")'),
        _target("jax-cudnn", "cudnn", 'jax.nn.dot_product_attention(implementation="cudnn")'),
        _target(
            "jax-xla-native", "xla",
            f'jax.nn.dot_product_attention(implementation="xla") with {own}', native=True,
        ),
        _target(
            "jax-cudnn-native", "cudnn",
            f'jax.nn.dot_product_attention(implementation="cudnn") with {own}', native=True,
        ),
    ]  # fmt: skip
