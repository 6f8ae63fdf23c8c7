"""stages/finch/support.py: which models Finch runs on and which inputs it refuses, each
with a message that names the architecture, the numbers and what to change."""

from __future__ import annotations

import pytest
import torch
from finch_testlib import random_parts, tiny

from stages.compression.finch import FinchCompression
from stages.finch.support import (
    SUPPORTED_MODEL_TYPES,
    check_inputs,
    check_supported,
)


@pytest.mark.parametrize("family", SUPPORTED_MODEL_TYPES)
def test_supported_families_pass(family: str):
    check_supported(tiny(family, dtype=torch.float32))


def test_another_architecture_is_named_with_the_supported_ones():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(ValueError) as err:
        check_supported(gpt2)
    msg = str(err.value)
    assert "GPT2LMHeadModel" in msg and "model_type='gpt2'" in msg and "llama, mistral, qwen2" in msg


def test_rope_whose_frequencies_change_with_length_is_refused():
    model = tiny("llama", dtype=torch.float32, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ValueError, match="rope_type 'dynamic'"):
        check_supported(model)


def test_inputs_that_fit_pass():
    model = tiny("llama", max_position_embeddings=64)
    # A document longer than the window is fine: the cache holds prefix + target + chunk + query.
    check_inputs(model, random_parts([(4, 500, 4), (2, 10, 3)]), FinchCompression(target_tokens=24, chunk_tokens=32))
    # A short document needs only its own length, whatever the budget.
    check_inputs(model, random_parts([(4, 20, 4)]), FinchCompression(target_tokens=1000, chunk_tokens=512))


def test_bad_inputs_are_refused_with_what_to_change():
    model = tiny("llama", max_position_embeddings=64)
    cfg = FinchCompression(target_tokens=48, chunk_tokens=32)
    with pytest.raises(ValueError, match="at least one prompt"):
        check_inputs(model, [], cfg)
    with pytest.raises(ValueError, match="non-empty query_ids"):
        check_inputs(model, random_parts([(4, 10, 4), (4, 10, 0)]), cfg)
    # prefix 4 + min(48 + 32, 500) + query 4 = 88 positions > 64.
    with pytest.raises(ValueError, match=r"needs 88 positions .*target_tokens 48 \+ chunk_tokens 32.*"
                                         r"context window 64; lower target_tokens or chunk_tokens"):
        check_inputs(model, random_parts([(4, 500, 4)]), cfg)
    windowed = tiny("mistral", sliding_window=40)
    with pytest.raises(ValueError, match="needs 88 slots but the model attends within a sliding window of 40"):
        check_inputs(windowed, random_parts([(4, 500, 4)]), cfg)
