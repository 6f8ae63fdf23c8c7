"""stages/model_size.py: parameter counts from configs, as the memory check and the dtype
choice read them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stages.model_size import estimate_parameters
from stages.random_models import shape_of


def test_known_shapes_count_their_parameters():
    # Llama-3-8B: 8.03B parameters (untied embeddings); SmolLM2-135M's config: 135M (tied).
    assert estimate_parameters(shape_of("random:llama-8b")) == pytest.approx(8.03e9, rel=0.01)
    smol = SimpleNamespace(hidden_size=576, num_hidden_layers=30, vocab_size=49152, num_attention_heads=9,
                           num_key_value_heads=3, intermediate_size=1536, tie_word_embeddings=True)
    assert estimate_parameters(smol) == pytest.approx(134.5e6, rel=0.01)
    wrapped = SimpleNamespace(get_text_config=lambda: smol)  # a multimodal config's text part
    assert estimate_parameters(wrapped) == estimate_parameters(smol)
