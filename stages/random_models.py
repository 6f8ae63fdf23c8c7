"""``random:<shape>`` models: real architectures with seeded random weights, no download.

Contract (load them with ``stages.model_loading.load_causal_lm("random:<shape>")``,
the one place model names are resolved; this module knows no tokenizer):
- ``is_random_model(name)`` is True for names that start with ``random:``.
- ``random_config(name, eos_token_id, pad_token_id)`` is the shape's ``LlamaConfig``;
  unknown shapes raise ValueError naming the shape and the known ones.
- ``build_random_model(config, dtype, device, seed)`` returns a ``LlamaForCausalLM`` in
  eval mode, built directly on ``device`` in ``dtype`` (no fp32 copy on the host
  first: an 8B bf16 model needs 16 GB on the GPU and nothing on the host). Weights
  are the architecture's own init (normal, std = initializer_range) after
  ``torch.manual_seed(seed)``: the same seed gives the same weights on the same device
  type; CPU and CUDA draw different numbers.

Tokenizer: every shape uses the embedded SmolLM2 tokenizer (49,152 ids). Its ids are
valid ids of every shape's vocabulary, so no mapping is needed: ``tiny`` and
``smollm2-135m`` use the tokenizer's vocabulary size; the Llama shapes keep Llama-3's
128,256 ids, because the output projection is ~7% of an 8B model's weight bytes per
decode step and shrinking it would understate the cost. Generated ids >= 49,152 have
no text; benchmarks compare token ids, so that does not matter there. Outputs are
meaningless text either way: these models are for cost, not quality (prompt-lookup
acceptance on random weights is not representative of a trained model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

PREFIX = "random:"
#: The embedded tokenizer's vocabulary size (SmolLM2).
TOKENIZER_VOCAB = 49152


@dataclass(frozen=True)
class Shape:
    """A Llama-family architecture; fields are LlamaConfig keyword arguments."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    extra: dict = field(default_factory=dict)


SHAPES: dict[str, Shape] = {
    # A few M parameters (3.1M of them the tied embedding): fast on one CPU core.
    "tiny": Shape(64, 2, 4, 2, 128, TOKENIZER_VOCAB, 10000.0, 8192, True),
    # The embedded model's config (SmolLM2-135M-Instruct).
    "smollm2-135m": Shape(576, 30, 9, 3, 1536, TOKENIZER_VOCAB, 100000.0, 8192, True),
    # Llama-3.2-1B (max positions cut to 8192 and no llama3 rope scaling: same cost).
    "llama-1b": Shape(2048, 16, 32, 8, 8192, 128256, 500000.0, 8192, True),
    # Llama-3-8B.
    "llama-8b": Shape(4096, 32, 32, 8, 14336, 128256, 500000.0, 8192, False),
}


def is_random_model(name: str) -> bool:
    return name.startswith(PREFIX)


def shape_of(name: str) -> Shape:
    """The Shape named by ``random:<shape>``; ValueError for anything else."""
    key = name[len(PREFIX) :] if is_random_model(name) else name
    if key not in SHAPES:
        raise ValueError(
            f"unknown random model shape {key!r} in model name {name!r}; "
            f"allowed: {', '.join(PREFIX + k for k in SHAPES)}"
        )
    return SHAPES[key]


def random_config(name: str, eos_token_id: int = 2, pad_token_id: int = 2):
    """The LlamaConfig of a ``random:<shape>`` name (head_dim = hidden / heads)."""
    from transformers import LlamaConfig

    s = shape_of(name)
    cfg = LlamaConfig(
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads,
        max_position_embeddings=s.max_position_embeddings,
        rope_theta=s.rope_theta,
        tie_word_embeddings=s.tie_word_embeddings,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        **s.extra,
    )
    # transformers 5 reads RoPE settings from rope_parameters; older ones from rope_theta.
    if getattr(cfg, "rope_parameters", None) is not None:
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": s.rope_theta}
    cfg._name_or_path = name  # the engine keys what it learns per model by this name
    return cfg


def build_random_model(config, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """A ``LlamaForCausalLM`` of ``config`` (``random_config``) with seeded random weights; see the module docstring."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    # Allocate every parameter on the target device in the target dtype (_from_config
    # sets the default dtype while it builds): no fp32 copy, no host copy.
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=dtype)
    model.generation_config.pad_token_id = config.pad_token_id
    return model.eval()
