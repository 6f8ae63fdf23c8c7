"""Decoder, attention and rotary access, also through a PEFT wrapper."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_causal_lm

from stages.kv.model_parts import attention_modules, decoder, rotary_module, sliding_window


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_parts_of_each_family(family):
    model = tiny_causal_lm(512, family, 0, torch.float32)
    base = decoder(model)
    assert base is model.model
    assert attention_modules(model) == [layer.self_attn for layer in model.model.layers]
    assert rotary_module(model) is model.model.rotary_emb


def test_decoder_sees_through_a_peft_wrapper():
    from peft import LoraConfig, get_peft_model

    model = tiny_causal_lm(512, "llama", 0, torch.float32)
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    # The prefix attribute of the wrapper is the whole causal LM, not its decoder.
    assert getattr(wrapped, wrapped.base_model_prefix) is not model.model
    assert decoder(wrapped) is model.model
    assert len(attention_modules(wrapped)) == 2


def test_no_rotary_is_an_error():
    model = tiny_causal_lm(512, "llama", 0, torch.float32)
    del model.model.rotary_emb
    with pytest.raises(ValueError, match="no rotary embedding"):
        rotary_module(model)


def test_sliding_window_is_read_only_where_the_model_applies_it():
    assert sliding_window(tiny_causal_lm(64, "llama").config) is None
    assert sliding_window(tiny_causal_lm(64, "mistral", sliding_window=48).config) == 48
    assert sliding_window(tiny_causal_lm(64, "mistral").config) is None  # tiny_causal_lm sets None
    qwen2 = tiny_causal_lm(64, "qwen2", sliding_window=48, use_sliding_window=False)
    assert sliding_window(qwen2.config) is None
    gemma = tiny_causal_lm(64, "gemma3", sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    assert sliding_window(gemma.config) == 8
    every_layer_full = tiny_causal_lm(64, "gemma3", sliding_window=8, layer_types=["full_attention"] * 2)
    assert sliding_window(every_layer_full.config) is None
