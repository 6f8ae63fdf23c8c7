"""SlotCache: rows loaded compacted from any prefill state, moved, freed, grown."""

from __future__ import annotations

import pytest
import torch

from stages.decoding.slots import SlotCache
from stages.decoding.state import prefill_full


@pytest.fixture
def state(tiny_model):
    # Left-padded batch: row 0 has 4 pad slots in front, row 1 none.
    return prefill_full(tiny_model, [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14]], 0)


def test_load_keeps_valid_slots_in_order(tiny_model, state):
    cache = SlotCache.for_model(tiny_model, slots=3, capacity=16)
    with torch.inference_mode():
        state.valid[1, 2] = False  # a hole (Finch drops tokens)
        assert cache.load(2, state, 0) == 3
        assert cache.load(0, state, 1) == 6
    assert cache.length.tolist() == [6, 0, 3] and cache.pos.tolist() == [7, 0, 3]
    for mine, theirs in zip(cache.layers, state.cache.layers, strict=True):
        assert torch.equal(mine.keys[2, :, :3], theirs.keys[0, :, 4:])
        kept = [0, 1, 3, 4, 5, 6]
        assert torch.equal(mine.values[0, :, :6], theirs.values[1][:, kept])


def test_move_free_and_grow_keep_rows(tiny_model, state):
    cache = SlotCache.for_model(tiny_model, slots=2, capacity=8)
    with torch.inference_mode():
        cache.load(1, state, 1)
        before = cache.layers[0].keys[1, :, :7].clone()
        cache.move(1, 0, used=7)
        cache.free(1)
        cache.grow(32)
    assert cache.capacity == 32 and cache.layers[0].keys.shape[2] == 32
    assert cache.length.tolist() == [7, 0]
    assert torch.equal(cache.layers[0].keys[0, :, :7], before)


def test_a_row_longer_than_the_capacity_is_refused(tiny_model, state):
    cache = SlotCache.for_model(tiny_model, slots=1, capacity=4)
    with pytest.raises(ValueError, match="capacity of 4"):
        cache.load(0, state, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_writes_at_each_rows_length(tiny_model, dtype):
    """update() writes new keys and values at length + t per row, exactly, in any slot
    dtype (bfloat16 slots on CPU take the indexed write), and returns the slot views."""
    cache = SlotCache.for_model(tiny_model, slots=3, capacity=8, dtype=dtype)
    cache.length[:] = torch.tensor([1, 3, 0])
    layer = cache.layers[0]
    h, d = layer.keys.shape[1], layer.keys.shape[3]
    new_k = torch.randn((2, h, 2, d)).to(dtype)
    new_v = torch.randn((2, h, 2, d)).to(dtype)
    keys, values = cache.update(new_k, new_v, 0)
    assert keys.shape == values.shape == (2, h, 8, d)
    written = (keys != 0).any(dim=(1, 3))  # [2, 8]
    assert written.tolist() == [[False, True, True] + [False] * 5, [False] * 3 + [True, True] + [False] * 3]
    for row, start in ((0, 1), (1, 3)):
        assert torch.equal(keys[row, :, start : start + 2], new_k[row])
        assert torch.equal(values[row, :, start : start + 2], new_v[row])
    assert not layer.keys[2].any() and not layer.values[2].any()  # a slot past the batch: untouched


def test_reshape_keeps_the_first_rows_and_refuses_what_does_not_fit(tiny_model, state):
    cache = SlotCache.for_model(tiny_model, slots=3, capacity=16)
    with torch.inference_mode():
        cache.load(0, state, 1)
        cache.load(1, state, 0)
        before = cache.layers[1].values[:2, :, :7].clone()
        assert cache.layout_version == 0
        cache.reshape(slots=5, capacity=8, keep=2)
    # New tensors: captured CUDA graphs (backends/cuda_graphs.py) key on this to drop old addresses.
    assert cache.layout_version == 1
    assert (cache.slots, cache.capacity) == (5, 8) and cache.layers[0].keys.shape[:3] == (5, 2, 8)
    assert cache.length.tolist() == [7, 3, 0, 0, 0] and cache.pos.tolist() == [7, 3, 0, 0, 0]
    assert torch.equal(cache.layers[1].values[0, :, :7], before[0])
    assert torch.equal(cache.layers[1].values[1, :, :3], before[1, :, :3])
    with pytest.raises(ValueError, match="longer than the new capacity 4"):
        cache.reshape(slots=5, capacity=4, keep=1)
    with pytest.raises(ValueError, match="cannot keep 3 rows in 2 slots"):
        cache.reshape(slots=2, capacity=8, keep=3)
    assert cache.bytes_per_token == 2 * 2 * (16 + 16) * 4  # 2 layers x 2 KV heads x (K + V) x fp32


def test_a_row_writer_commits_only_when_told(tiny_model):
    cache = SlotCache.for_model(tiny_model, slots=2, capacity=16)
    writer = cache.row_writer(1)
    assert writer.get_seq_length() == 0
    writer.commit(5, next_pos=9)
    assert cache.length.tolist() == [0, 5] and cache.pos.tolist() == [0, 9] and writer.start == 5
