"""``attn_implementation="exactattn"`` for Hugging Face transformers.

    import exactattn.integrations.transformers as hf_exact
    hf_exact.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="exactattn")

:func:`register` adds two entries under one name: the attention function
(:func:`attention_forward`, to ``transformers.AttentionInterface``) and the mask function
(to ``transformers.AttentionMaskInterface``: transformers' own ``sdpa_mask``, whose
boolean ``(B, 1, q, kv)`` masks — True = attend — carry padding, sliding windows and
caches, and which returns None where SDPA's top-left ``is_causal`` says the same thing).
The attention function makes the decisions transformers' ``sdpa`` integration makes (causal
only when there is no mask and more than one query; grouped key/value heads) and runs
:func:`exactattn.torch.sdpa.sdpa_call`, so a model computes what it computes with
``attn_implementation="sdpa"``, exactly, with logit soft-capping (Gemma 2's ``softcap``)
and attention sinks (gpt-oss's ``s_aux``, one logit per query head) as well.
"""

from __future__ import annotations

from typing import Any

from ..infra.optional import needs

with needs("exactattn.integrations.transformers"):
    import torch
    import transformers  # noqa: F401  (registration needs it; fail here, with the extra)

from ..torch.sdpa import sdpa_call

NAME = "exactattn"
UNSUPPORTED = ("position_bias",)  # T5-style bias: not wired yet


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function protocol: ``query (B, H, q, d)``, ``key, value
    (B, H_kv, kv, ·)`` -> ``(output (B, q, H, v), None)`` (no attention weights)."""
    given = [name for name in UNSUPPORTED if kwargs.get(name) is not None]
    if given:
        raise NotImplementedError(f"attn_implementation='exactattn' does not take {given} yet")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    # transformers passes no mask exactly where SDPA's top-left is_causal is the mask
    is_causal = query.shape[2] > 1 and attention_mask is None and is_causal
    y = sdpa_call(
        query, key, value, attention_mask, dropout, is_causal,
        scale=scaling, enable_gqa=query.shape[1] != key.shape[1], softcap=softcap,
        sinks=kwargs.get("s_aux"),
    )  # fmt: skip
    return y.transpose(1, 2).contiguous(), None


def register(name: str = NAME) -> None:
    """Make ``attn_implementation=name`` run exactattn in every transformers model."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
