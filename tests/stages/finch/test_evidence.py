"""Evidence scoring parts: per-head normalisation, KV grouping, pooling over valid slots."""

from __future__ import annotations

import torch

from stages.finch.evidence import (
    fill_empty_groups,
    group_heads,
    normalise,
    pool_sentences,
    pool_valid,
)


def test_normalise_sums_to_one_over_valid_slots() -> None:
    mass = torch.tensor([[[1.0, 3.0, 100.0, 4.0], [0.0, 0.0, 5.0, 0.0]]])  # [1, 2, 4]
    valid = torch.tensor([[True, True, False, True]])
    e = normalise(mass, valid)
    torch.testing.assert_close(e[0, 0], torch.tensor([0.125, 0.375, 0.0, 0.5]))
    assert torch.equal(e[0, 1], torch.zeros(4))  # no mass on valid slots: zeros, no NaN


def test_group_heads_and_empty_groups() -> None:
    per_head = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [4.0, 4.0]]])  # heads 0, 1, 5 of 6; 3 KV groups
    assert torch.equal(group_heads(per_head, [0, 1, 5], 6, 3, 1), torch.tensor([[[5.0, 6.0]]]))
    g = group_heads(per_head, [0, 1, 5], 6, 3, 3)
    assert torch.equal(g, torch.tensor([[[1.0, 2.0], [0.0, 0.0], [4.0, 4.0]]]))
    filled = fill_empty_groups(g, torch.tensor([True, False, True]))
    assert torch.equal(filled[0, 1], torch.tensor([5.0, 6.0]))  # the empty group takes the sum


def test_a_spike_lifts_its_whole_window() -> None:
    scores = torch.zeros(1, 1, 20)
    scores[0, 0, 10] = 7.0
    pooled = pool_valid(scores, torch.ones(1, 20, dtype=torch.bool), 7)
    assert torch.equal(pooled[0, 0].nonzero().flatten(), torch.arange(7, 14))
    torch.testing.assert_close(pooled[0, 0, 7:14], torch.ones(7) + 0.007 * (torch.arange(7, 14) == 10))
    top = pooled[0, 0].topk(7).indices.sort().values
    assert torch.equal(top, torch.arange(7, 14))  # top-k keeps the span, not one token
    assert int(pooled[0, 0].argmax()) == 10  # a budget of one keeps the peak itself


def test_pooling_skips_padding_and_matches_the_compact_row() -> None:
    g = torch.Generator().manual_seed(0)
    real = torch.rand(1, 2, 12, generator=g)
    valid = torch.zeros(1, 20, dtype=torch.bool)
    slots = torch.tensor([0, 1, 2, 6, 7, 8, 9, 10, 15, 16, 17, 19])  # padding in between
    valid[0, slots] = True
    padded = torch.full((1, 2, 20), 99.0)  # junk on padding must not leak
    padded[:, :, slots] = real
    got = pool_valid(padded, valid, 5)
    want = pool_valid(real, torch.ones(1, 12, dtype=torch.bool), 5)
    torch.testing.assert_close(got[:, :, slots], want)
    assert torch.equal(got[:, :, ~valid[0]], torch.zeros(1, 2, 8))
    assert torch.equal(pool_valid(padded, valid, 1), padded * valid[:, None])


def test_sentences_rank_by_their_best_token_and_ignore_padding() -> None:
    # Candidates: sentence 0 = slots 0-2, sentence 1 = slots 3-5 (slot 4 padding), sentence 2 = 6-7.
    scores = torch.tensor([[[0.1, 0.5, 0.2, 0.3, 99.0, 0.1, 0.0, 0.05]]])
    sentence = torch.tensor([[0, 0, 0, 1, 1, 1, 2, 2]])
    valid = torch.tensor([[True, True, True, True, False, True, True, True]])
    out = pool_sentences(scores, sentence, valid)[0, 0]
    torch.testing.assert_close(out[:3], 0.5 + 1e-3 * scores[0, 0, :3])  # the padding's 99 lifts nothing
    torch.testing.assert_close(out[[3, 5]], 0.3 + 1e-3 * scores[0, 0, [3, 5]])
    assert out[4] == 0
    # A budget of 4 keeps sentence 0 whole, then sentence 1's best token.
    top = out.masked_fill(~valid[0], float("-inf")).topk(4).indices.sort().values
    assert top.tolist() == [0, 1, 2, 3]

