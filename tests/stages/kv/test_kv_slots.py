"""Keeping, gathering and stacking cache slots."""

from __future__ import annotations

import torch
from tiny_models import tiny_causal_lm
from transformers import DynamicCache

from stages.decoding.forward import cache_kwargs
from stages.decoding.state import forward_step
from stages.kv.slots import gather_slots, keep_slots, stack_rows


def _cache(model, ids: list[int]) -> DynamicCache:
    cache = DynamicCache()
    model(input_ids=torch.tensor([ids]), use_cache=True, **cache_kwargs(model, cache))
    return cache


def test_keep_slots_keeps_the_same_slots_in_every_layer():
    model = tiny_causal_lm(512, "llama", 0, torch.float32)
    full = _cache(model, list(range(5, 15)))
    kept = _cache(model, list(range(5, 15)))
    keep_slots(kept, torch.tensor([0, 3, 9]))
    for a, b in zip(full.layers, kept.layers, strict=True):
        torch.testing.assert_close(b.keys, a.keys[:, :, [0, 3, 9]])
        torch.testing.assert_close(b.values, a.values[:, :, [0, 3, 9]])


def test_gather_slots_shared_or_per_head():
    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(2, 3, 6, 4, generator=g), torch.randn(2, 3, 6, 4, generator=g)
    shared = torch.tensor([[[1, 4]], [[0, 5]]])  # [B, 1, K]
    k, v = gather_slots(keys, values, shared)
    assert k.shape == (2, 3, 2, 4)
    torch.testing.assert_close(k[1], keys[1][:, [0, 5]])
    torch.testing.assert_close(v[0], values[0][:, [1, 4]])
    per_head = torch.tensor([[[0, 1], [2, 3], [4, 5]]] * 2)  # [B, H_kv, K]
    k, _ = gather_slots(keys, values, per_head)
    torch.testing.assert_close(k[0, 2], keys[0, 2, [4, 5]])


def test_stacked_rows_decode_as_each_row_alone():
    """Rows of different lengths, right-aligned: one step on the batch = each row's own step."""
    model = tiny_causal_lm(512, "llama", 0, torch.float32)
    rows = [list(range(5, 12)), list(range(20, 24))]
    cache, valid = stack_rows([_cache(model, r) for r in rows], model.config)
    assert valid.tolist() == [[True] * 7, [False] * 3 + [True] * 4]
    nxt = torch.tensor([[40], [41]])
    pos = torch.tensor([[7], [4]])
    logits, _ = forward_step(model, cache, valid, nxt, pos, torch.ones(2, 1, dtype=torch.bool), logits_to_keep=1)
    for r, ids in enumerate(rows):
        alone = model(input_ids=torch.tensor([ids + [40 + r]])).logits[0, -1]
        torch.testing.assert_close(logits[r, -1], alone, atol=1e-5, rtol=1e-5)
