"""Shared builders for the Finch tests: tiny random models of each supported family
and random prompts split into PromptParts."""

from __future__ import annotations

import torch

from stages.prompting import PromptParts

VOCAB = 512


def tiny(family: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float64, **overrides):
    """A 2-layer random model (4 query / 2 KV heads, head_dim 16) of ``family``."""
    import transformers as tf

    cfg = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    cfg.update(overrides)
    classes = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
    }
    config_cls, model_cls = classes[family]
    if family == "mistral":
        cfg.setdefault("sliding_window", None)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**cfg))
    model.config._attn_implementation = "sdpa"
    return model.to(dtype).eval()


def random_parts(lengths: list[tuple[int, int, int]], seed: int = 0) -> list[PromptParts]:
    """PromptParts with random token ids; lengths = (prefix, doc, query) per row."""
    g = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, VOCAB, (n,), generator=g).tolist()

    return [PromptParts(ids(a), ids(b), ids(c)) for a, b, c in lengths]
