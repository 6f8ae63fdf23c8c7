"""A decoder-only transformer's size from its config, with no import beyond the standard
library: the model loader picks a dtype by its parameter count, and the checks before a
run (stages/context_budget.py, pipeline/memory_fit.py) weigh a model and its KV budget
against this machine's memory without torch.

Contract (``config``: any object with the config's attributes: a transformers config, a
``SimpleNamespace`` of config.json, a ``random:`` shape; a multimodal config's text
config is read):
- ``estimate_parameters(config)``: the approximate parameter count.
- ``kv_bytes_per_token(config, width)``: the bytes one token's keys and values take over
  every layer at ``width`` bytes an element (the engine's slots: stages/decoding/slots.py).
"""

from __future__ import annotations

# Below this many parameters "auto" keeps float32 on a GPU (stages/model_loading.py
# ``resolve_dtype``): a small model is bound by kernel launches, not by weight reads, so
# fp32 was faster than bf16 there, and exact (measured: jobs/results/code-choices.md,
# "stages/model_loading.py"). Large models are bound by weight reads, where bf16 halves
# the bytes: bf16 there. Here, beside the count, so the memory checks read it without torch.
SMALL_MODEL_PARAMS = 1_000_000_000


def _text(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _kv_heads(cfg) -> int:
    return getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads


def estimate_parameters(config) -> int:
    """Approximate parameter count of a decoder-only transformer from its config (an object
    with the config's attributes; a multimodal one's text config is read)."""
    cfg = _text(config)
    h, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    heads = cfg.num_attention_heads
    head_dim = _head_dim(cfg)
    kv = _kv_heads(cfg) * head_dim
    inter = getattr(cfg, "intermediate_size", None) or 4 * h
    per_layer = h * heads * head_dim * 2 + h * kv * 2 + 3 * h * inter
    embeddings = vocab * h * (1 if getattr(cfg, "tie_word_embeddings", False) else 2)
    return int(layers * per_layer + embeddings)


def kv_bytes_per_token(config, width: int) -> int:
    """Bytes of one token's keys and values over every layer, ``width`` bytes an element:
    layers x KV heads x head dim x 2 x width (a Llama-3-8B in bfloat16: 131,072)."""
    cfg = _text(config)
    return cfg.num_hidden_layers * _kv_heads(cfg) * _head_dim(cfg) * 2 * width
