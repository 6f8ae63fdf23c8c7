"""Tiny random causal LMs for fast tests, and a one-thread guard for tiny matmuls.

Import as ``from tiny_models import ...`` (pytest puts tests/ on sys.path through
the root conftest).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def tiny_causal_lm(
    vocab_size: int,
    family: str = "llama",
    seed: int = 0,
    dtype: torch.dtype | None = None,
    **overrides,
):
    """A 2-layer random model of ``family`` (llama | mistral | qwen2): hidden 64, GQA with
    4 query / 2 KV heads (head_dim 16), RoPE, tied embeddings, sdpa attention, eval mode."""
    import transformers as tf

    cfg = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
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
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def one_torch_thread() -> Iterator[None]:
    """Generator body for an autouse fixture: one intra-op thread while a test runs.

    Tiny models run many small ops; on a shared 2-core machine two OpenMP threads spin
    against each other (and other processes) and make them many times slower.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
