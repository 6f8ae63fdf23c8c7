"""A decoder-only transformer's parameter count from its config, with no import beyond
the standard library: the model loader picks a dtype by it, and the checks before a run
(stages/context_budget.py) weigh a model against this machine's memory without torch.

Contract: ``estimate_parameters(config)``: the approximate count for any object with the
config's attributes (a transformers config, a ``SimpleNamespace`` of config.json, a
``random:`` shape); a multimodal config's text config is read.
"""

from __future__ import annotations


def estimate_parameters(config) -> int:
    """Approximate parameter count of a decoder-only transformer from its config (an object
    with the config's attributes; a multimodal one's text config is read)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    h, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or h // heads
    kv = (getattr(cfg, "num_key_value_heads", None) or heads) * head_dim
    inter = getattr(cfg, "intermediate_size", None) or 4 * h
    per_layer = h * heads * head_dim * 2 + h * kv * 2 + 3 * h * inter
    embeddings = vocab * h * (1 if getattr(cfg, "tie_word_embeddings", False) else 2)
    return int(layers * per_layer + embeddings)
