"""random:<shape> models: known shapes, seeded weights, built on the target device/dtype."""

from __future__ import annotations

import pytest
import torch

from schemas.spec import RANDOM_MODEL_SHAPES, GenerationSpec
from stages.model_loading import load_causal_lm, load_tokenizer
from stages.random_models import SHAPES, random_config, shape_of


def test_shapes_match_the_spec_list():
    assert tuple(SHAPES) == RANDOM_MODEL_SHAPES


def test_unknown_shape_names_the_allowed_ones():
    with pytest.raises(ValueError, match="random:llama-8b"):
        shape_of("random:llama-70b")
    with pytest.raises(ValueError, match="unknown random model shape 'nope'"):
        load_tokenizer("random:nope")


def test_spec_accepts_known_random_models_only():
    assert GenerationSpec(model="random:llama-8b").model == "random:llama-8b"
    with pytest.raises(ValueError, match="random:tiny"):
        GenerationSpec(model="random:huge")


def test_llama_8b_config_is_llama_3_8b():
    cfg = random_config("random:llama-8b")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        4096, 32, 32, 8)
    assert (cfg.intermediate_size, cfg.vocab_size, cfg.max_position_embeddings) == (14336, 128256, 8192)
    assert cfg.rope_parameters["rope_theta"] == 500000.0
    assert not cfg.tie_word_embeddings


def test_8b_is_built_directly_on_the_target_device_in_bf16():
    # The meta device allocates nothing: every parameter must be created there, in bf16
    # (a build that materialised fp32 weights first and cast/moved them would show here).
    model, tok = load_causal_lm("random:llama-8b", "bfloat16", torch.device("meta"))
    params = list(model.parameters())
    assert {p.device.type for p in params} == {"meta"}
    assert {p.dtype for p in params} == {torch.bfloat16}
    assert sum(p.numel() for p in params) == 8_030_261_248
    assert model.config.vocab_size >= len(tok)


def test_tiny_is_seeded_and_loads_through_load_causal_lm(tokenizer):
    model, tok = load_causal_lm("random:tiny")
    again, _ = load_causal_lm("random:tiny", "float32", torch.device("cpu"), seed=0)
    other, _ = load_causal_lm("random:tiny", "float32", torch.device("cpu"), seed=1)
    w = model.model.layers[0].mlp.up_proj.weight
    assert torch.equal(w, again.model.layers[0].mlp.up_proj.weight)
    assert not torch.equal(w, other.model.layers[0].mlp.up_proj.weight)
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    assert model.config._attn_implementation == "sdpa" and not model.training
    assert len(tok) == len(tokenizer) and tok.pad_token_id is not None
    with torch.inference_mode():
        logits = model(torch.tensor([tok("Hello there")["input_ids"]])).logits
    assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits).all()
