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
    """A 2-layer random model of ``family`` (llama | mistral | qwen2 | gemma3): hidden 64,
    GQA with 4 query / 2 KV heads (head_dim 16), RoPE, tied embeddings, sdpa attention,
    eval mode. gemma3 is Gemma 3's text model with its own defaults (sliding-window layers
    of 512 tokens, one full-attention layer in six; pass ``layer_types``/``sliding_window``
    to see windows in a short test)."""
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
    if family == "gemma3":  # its config takes RoPE settings per layer type, and a head scale
        del cfg["rope_theta"]
        cfg.update(head_dim=16, query_pre_attn_scalar=16)
    cfg.update(overrides)
    classes = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM),
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


#: family -> tiny_causal_lm overrides for a model that attends within 6 tokens in some layers
#: (prompts of a few dozen tokens then see the window change the output).
WINDOWED = {
    "gemma3": dict(num_hidden_layers=3, sliding_window=6, initializer_range=0.05,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    "mistral": dict(sliding_window=6, initializer_range=0.05),
    "qwen2": dict(num_hidden_layers=3, sliding_window=6, use_sliding_window=True, max_window_layers=1,
                  initializer_range=0.05),
}


def windowed_lm(vocab_size: int, family: str, widen: bool = False):
    """tiny_causal_lm of ``family`` with ``WINDOWED``'s sliding windows (fp32); ``widen``:
    the same weights with every window wider than any test prompt (full attention)."""
    model = tiny_causal_lm(vocab_size, family, 0, torch.float32, **WINDOWED[family])
    if widen:
        model.config.sliding_window = 4096
        for layer in model.model.layers:
            if getattr(layer.self_attn, "sliding_window", None):
                layer.self_attn.sliding_window = 4096
    return model


def own_greedy(model, prompt: list[int], n: int) -> list[int]:
    """The model's own greedy continuation of ``prompt``: whole-sequence forwards, no cache
    and no mask, so transformers builds every layer's mask itself (sliding windows too)."""
    seq = torch.tensor([prompt])
    with torch.inference_mode():
        for _ in range(n):
            seq = torch.cat([seq, model(seq, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq[0, len(prompt):].tolist()


def one_torch_thread() -> Iterator[None]:
    """Generator body for an autouse fixture: one intra-op thread while a test runs.

    Tiny models run many small ops; on a shared 2-core machine two OpenMP threads spin
    against each other (and other processes) and make them many times slower.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
