"""The prefill/decode hand-off (stages/decoding/state.py): masks, left padding, positions,
and the batched full prefill every text method and the reference decoder start from, also
for models that attend within sliding windows."""

from __future__ import annotations

import pytest
import torch
from tiny_models import WINDOWED

from stages.decoding.config import DecodeConfig
from stages.decoding.reference import decode_plain
from stages.decoding.state import (
    forward_step,
    left_pad,
    length_buckets,
    positions_from_real,
    prefill_buckets,
    prefill_full,
    step_mask,
)


def test_step_mask_attends_valid_past_and_earlier_new_tokens():
    past = torch.tensor([[True, False, True], [False, False, False]])  # row 1: no past at all
    new = torch.tensor([[True, True, True], [False, True, True]])  # row 1: left padding
    m = step_mask(past, new)
    assert m.shape == (2, 1, 3, 6) and m.dtype == torch.bool
    want0 = torch.tensor([
        [1, 0, 1, 1, 0, 0],
        [1, 0, 1, 1, 1, 0],
        [1, 0, 1, 1, 1, 1],
    ], dtype=torch.bool)
    want1 = torch.tensor([
        [0, 0, 0, 1, 0, 0],  # the padding token sees only itself (no fully masked row)
        [0, 0, 0, 0, 1, 0],  # real tokens never see the padding
        [0, 0, 0, 0, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(m[0, 0], want0) and torch.equal(m[1, 0], want1)
    assert bool(m.any(dim=-1).all())


def test_left_pad_and_positions():
    ids, real = left_pad([[5, 6, 7], [9], []], pad_id=0, device=torch.device("cpu"))
    assert ids.tolist() == [[5, 6, 7], [0, 0, 9], [0, 0, 0]]
    assert real.tolist() == [[True] * 3, [False, False, True], [False] * 3]
    assert positions_from_real(real).tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 0]]
    start = torch.tensor([10, 4, 0])
    assert positions_from_real(real, start).tolist() == [[10, 11, 12], [4, 4, 4], [0, 0, 0]]


def test_prefill_full_of_a_padded_batch_equals_each_prompt_alone(tiny_llama_factory):
    model = tiny_llama_factory(300, seed=4, initializer_range=0.1)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    state = prefill_full(model, prompts, pad_id=0)
    assert state.valid.tolist() == left_pad(prompts, 0, torch.device("cpu"))[1].tolist()
    assert state.next_pos.tolist() == [7, 2, 4] and state.batch_size == 3
    assert state.last_logits.shape == (3, 300) and state.last_logits.dtype == torch.float32
    with torch.inference_mode():
        for row, p in enumerate(prompts):
            alone = model(torch.tensor([p])).logits[0, -1]  # transformers' forward, no padding
            torch.testing.assert_close(state.last_logits[row], alone, rtol=1e-4, atol=1e-5)
    # A decode step on the padded cache continues each row as its own forward would.
    feed = torch.tensor([[20], [21], [22]])
    logits, valid = forward_step(model, state.cache, state.valid, feed, state.next_pos[:, None],
                                 torch.ones(3, 1, dtype=torch.bool))
    assert valid.shape == (3, 8) and bool(valid[:, -1].all())
    with torch.inference_mode():
        for row, p in enumerate(prompts):
            alone = model(torch.tensor([p + [20 + row]])).logits[0, -1]
            torch.testing.assert_close(logits[row, -1], alone, rtol=1e-4, atol=1e-5)


def test_prefill_full_rejects_an_empty_prompt(tiny_llama_factory):
    with pytest.raises(ValueError, match="non-empty"):
        prefill_full(tiny_llama_factory(300), [[1, 2], []], pad_id=0)


def test_length_buckets_hold_every_row_once_with_at_most_the_allowed_padding():
    lengths = [40, 300, 45, 290, 12, 310, 41]
    buckets = length_buckets(lengths, max_padding=1.25)
    assert sorted(r for b in buckets for r in b) == list(range(len(lengths)))
    for b in buckets:
        widest = max(lengths[r] for r in b)
        assert len(b) * widest <= 1.25 * sum(lengths[r] for r in b)
    assert {frozenset(b) for b in buckets} == {frozenset({5, 1, 3}), frozenset({2, 6, 0}), frozenset({4})}
    assert length_buckets([7, 7, 7]) == [[0, 1, 2]]  # equal lengths: one batch, as before


def test_prefill_buckets_equals_each_prompt_alone_and_decodes_on(tiny_llama_factory):
    """Rows of very different lengths go in separate buckets; the joined state is in input
    order, left-padded with invalid slots, and each row continues as its own forward would."""
    model = tiny_llama_factory(300, seed=4, initializer_range=0.1)
    prompts = [[5, 6], [7 + i for i in range(40)], [50, 51, 52], [60 + i for i in range(38)]]
    assert len(length_buckets([len(p) for p in prompts])) == 2
    state = prefill_buckets(model, prompts, pad_id=0)
    assert state.valid.tolist() == left_pad(prompts, 0, torch.device("cpu"))[1].tolist()
    assert state.next_pos.tolist() == [2, 40, 3, 38]
    feed = torch.tensor([[20], [21], [22], [23]])
    logits, _ = forward_step(model, state.cache, state.valid, feed, state.next_pos[:, None],
                             torch.ones(4, 1, dtype=torch.bool))
    with torch.inference_mode():
        for row, p in enumerate(prompts):
            torch.testing.assert_close(state.last_logits[row], model(torch.tensor([p])).logits[0, -1],
                                       rtol=1e-4, atol=1e-5)
            alone = model(torch.tensor([p + [20 + row]])).logits[0, -1]
            torch.testing.assert_close(logits[row, -1], alone, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", sorted(WINDOWED))
def test_a_padded_batch_of_a_sliding_window_model_decodes_as_each_prompt_alone(family):
    """Rows of 3 to 30 tokens left-padded together: each windowed layer keeps a query to the
    keys less than the window away in the row's own tokens, so the reference decoder's greedy
    text equals the model's own (and differs from the same weights without windows)."""
    from tiny_models import own_greedy, windowed_lm

    model = windowed_lm(300, family)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (30, 3, 17, 9)]
    own = [own_greedy(model, p, 10) for p in prompts]
    assert own != [own_greedy(windowed_lm(300, family, widen=True), p, 10) for p in prompts]
    cfg = DecodeConfig(max_new_tokens=10, eos_ids=frozenset({-1}))
    assert [r.tokens for r in decode_plain(model, prefill_full(model, prompts, 0), cfg)] == own
