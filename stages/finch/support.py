"""Which models Finch can compress, and the checks that say so up front.

Finch needs (1) RoPE whose angle is linear in the position (keys are moved by a
fixed rotation, see stages/kv/rope.py), (2) attention modules with ``q_proj`` and
``head_dim`` that receive ``hidden_states`` and ``position_embeddings`` (the
query capture, stages/kv/queries.py) and (3) a plain key/value cache per layer. The
Llama family (Llama 2/3, SmolLM, TinyLlama, ...), Mistral and Qwen2 in
transformers satisfy all three; others raise a ValueError naming the architecture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stages.finch.config import FINCH_MODEL_TYPES
from stages.kv.model_parts import attention_modules, sliding_window
from stages.kv.rope import check_rope
from stages.prompting import PromptParts

if TYPE_CHECKING:  # the spec model lives with its method; imported for types only
    from stages.finch.config import FinchCompression

SUPPORTED_MODEL_TYPES = FINCH_MODEL_TYPES


def check_supported(model) -> None:
    """Raise ValueError naming the architecture when Finch cannot run on ``model``."""
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        arch = ", ".join(getattr(config, "architectures", None) or [type(model).__name__])
        raise ValueError(
            f"Finch does not support the {arch} architecture (model_type={model_type!r}); "
            f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    check_rope(model)
    for attn in attention_modules(model):
        if not (hasattr(attn, "q_proj") and hasattr(attn, "head_dim") and hasattr(attn, "scaling")):
            raise ValueError(
                f"Finch cannot capture queries of {type(attn).__name__} in {type(model).__name__}"
            )


def check_inputs(model, parts: list[PromptParts], config: FinchCompression) -> None:
    """Raise ValueError for prompts Finch cannot score or budgets the model cannot hold."""
    if not parts:
        raise ValueError("finch_prefill needs at least one prompt")
    if any(not p.query_ids for p in parts):
        raise ValueError("Finch needs non-empty query_ids (the prompt that scores the cache)")
    text = model.config.get_text_config()
    needed = max(
        len(p.prefix_ids)
        + min(config.target_tokens + config.chunk_tokens, len(p.context_ids))
        + len(p.query_ids)
        for p in parts
    )
    limit = getattr(text, "max_position_embeddings", None)
    if limit is not None and needed > limit:
        raise ValueError(
            f"Finch cache needs {needed} positions (prefix + target_tokens "
            f"{config.target_tokens} + chunk_tokens {config.chunk_tokens} + query), more than "
            f"the model's context window {limit}; lower target_tokens or chunk_tokens"
        )
    window = sliding_window(text)
    if window is not None and needed > window:
        raise ValueError(
            f"Finch cache needs {needed} slots but the model attends within a sliding window "
            f"of {window}; lower target_tokens or chunk_tokens"
        )
