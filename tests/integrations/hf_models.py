"""Tiny random-weight transformers models and their parity measurements against ``sdpa``.

``python -m tests.integrations.hf_models`` prints the parity table (docs/torch.md): per model and
dtype, the largest logit and parameter-gradient difference between
``attn_implementation="exactattn"`` and ``"sdpa"``, and whether greedy generation with a
dynamic and a static cache gives identical tokens.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

VOCAB, LENGTH, NEW_TOKENS = 64, 12, 10


def _configs() -> dict:
    from transformers import GPT2Config, LlamaConfig, MistralConfig

    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    return {
        "llama-gqa": (LlamaConfig(**small, num_attention_heads=4, num_key_value_heads=2), "left"),
        "gpt2-padding": (
            GPT2Config(
                vocab_size=VOCAB,
                n_positions=64,
                n_embd=32,
                n_layer=2,
                n_head=4,
                attn_pdrop=0.0,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
            ),
            "left",
        ),
        "mistral-window": (
            MistralConfig(**small, num_attention_heads=4, num_key_value_heads=2, sliding_window=4),
            None,
        ),
    }


MODELS = ("llama-gqa", "gpt2-padding", "mistral-window")


def build(name: str, dtype: torch.dtype, seed: int = 0):
    """``(model, input_ids, attention_mask)``: the same weights for every dtype and seed."""
    from transformers import AutoModelForCausalLM

    config, padding = _configs()[name]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model = model.to(torch.float64).eval().to(dtype)  # float64 init, then rounded
    generator = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(1, VOCAB, (2, LENGTH), generator=generator)
    mask = None
    if padding:
        mask = torch.ones(2, LENGTH, dtype=torch.long)
        mask[1, :4] = 0  # the second sequence is left-padded by 4 tokens
    return model, ids, mask


def outputs(model, ids, mask, impl: str) -> dict[str, torch.Tensor]:
    """Logits, loss and every parameter's gradient of the LM loss under ``impl``."""
    model.set_attn_implementation(impl)
    model.zero_grad()
    labels = ids if mask is None else ids.masked_fill(mask == 0, -100)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    result = {"logits": out.logits.detach(), "loss": out.loss.detach()}
    result.update({f"grad {n}": p.grad.clone() for n, p in model.named_parameters()})
    return result


def generated(model, ids, mask, impl: str, cache: str) -> torch.Tensor:
    model.set_attn_implementation(impl)
    keywords = {"cache_implementation": "static"} if cache == "static" else {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(
            ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
            pad_token_id=0, **keywords,
        )  # fmt: skip


@dataclass
class Parity:
    model: str
    dtype: str
    logits: float  # max |exactattn − sdpa|
    grads: float
    generate_equal: bool | None


def parity(name: str, dtype: torch.dtype) -> Parity:
    import exactattn.integrations.transformers as hf_exact

    hf_exact.register()
    model, ids, mask = build(name, dtype)
    ours, theirs = outputs(model, ids, mask, "exactattn"), outputs(model, ids, mask, "sdpa")
    grads = max((ours[n] - theirs[n]).abs().max().item() for n in ours if n.startswith("grad"))
    equal = None
    if dtype == torch.float64:
        equal = all(
            torch.equal(
                generated(model, ids, mask, "exactattn", c), generated(model, ids, mask, "sdpa", c)
            )
            for c in ("dynamic", "static")
        )
    logits = (ours["logits"] - theirs["logits"]).abs().max().item()
    return Parity(name, str(dtype).removeprefix("torch."), logits, grads, equal)


def main() -> None:
    print("| model | dtype | max logit diff | max grad diff | generate equal (dynamic, static) |")
    print("| --- | --- | ---: | ---: | --- |")
    for name in MODELS:
        for dtype in (torch.float64, torch.float32):
            r = parity(name, dtype)
            equal = "n/a" if r.generate_equal is None else ("yes" if r.generate_equal else "NO")
            print(f"| {r.model} | {r.dtype} | {r.logits:.1e} | {r.grads:.1e} | {equal} |")


if __name__ == "__main__":
    main()
