"""The KV memory budget: layouts within it, fixed slots, the auto budget on CPU."""

from __future__ import annotations

import pytest
import torch

from stages.decoding.memory import (
    MAX_SLOTS,
    KvBudget,
    budget_bytes_for,
    round_up,
    step_reserve_bytes,
)


def test_layouts_fill_the_budget_with_slots_of_the_needed_capacity():
    budget = KvBudget(bytes_per_token=1000, budget_bytes=1000 * 8192)  # 8192 KV tokens
    assert budget.tokens == 8192
    assert budget.layout(1000) == (8, 1024)  # 1k-token rows: 8 slots
    assert budget.layout(100) == (32, 256)  # compressed rows: 4x more
    assert budget.layout(8192) == (1, 8192) and budget.layout(8193) is None  # never past the budget
    assert KvBudget(1, 10**9).layout(10)[0] == MAX_SLOTS  # the largest batch bucket caps it
    fixed = KvBudget(1000, 1000 * 512, fixed_slots=4)
    assert fixed.layout(1000) == (4, 1024)  # the user's slot count; capacity still fits the row
    assert round_up(1) == 256 and round_up(256) == 256 and round_up(257) == 512
    with pytest.raises(ValueError, match="decode slots"):
        KvBudget(1000, 10, fixed_slots=0)


def test_the_auto_budget_is_a_fraction_of_what_is_free_less_the_reserve():
    free = 8 * 2**30  # what the step backend measured (backends/: RAM on CPU, device memory on CUDA)
    assert budget_bytes_for(free, 0.25) == 2 * 2**30
    assert budget_bytes_for(free, 0.5, reserve=2**30) == 3 * 2**30
    assert budget_bytes_for(free, 0.25, explicit_gb=1.5) == int(1.5 * 2**30)  # the user's figure wins


def test_step_reserve_grows_with_batch_width_and_vocabulary(tiny_model):
    small = step_reserve_bytes(tiny_model.config, 2, 1, 64, torch.float32)
    big = step_reserve_bytes(tiny_model.config, 256, 17, 64, torch.float32)
    assert 0 < small < big
    # 256 rows x 17 tokens of float32 logits and their softmax dominate the decode side.
    assert big >= 256 * 17 * tiny_model.config.vocab_size * 8
