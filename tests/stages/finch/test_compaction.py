"""stages/finch/compaction.py: the per-row plan, top-k in document order, and one layer
rebuilt as ``[prefix | kept]`` with each kept key moved to its new position.

The RoPE oracle here is written out from the Llama convention (``emb = cat(freqs,
freqs)``, ``x * cos + rotate_half(x) * sin``), not taken from stages/kv/rope.py.
"""

from __future__ import annotations

import pytest
import torch

from stages.finch.compaction import entry_moves, gather_layer, make_plan, select_indices

T, F = True, False


def _rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x: [..., D] at positions pos [...]: the key RoPE makes of x at that position."""
    angles = pos[..., None].double() * inv_freq.double()  # [..., D/2]
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def test_plan_left_pads_rows_that_keep_fewer_and_numbers_kept_slots_after_the_prefix():
    plan = make_plan(torch.tensor([3, 1, 0]), torch.tensor([2, 4, 1]))
    assert plan.slot_valid.tolist() == [[T, T, T], [F, F, T], [F, F, F]]
    assert plan.new_pos.tolist() == [[2, 3, 4], [0, 0, 4], [0, 0, 0]]
    assert plan.kept.tolist() == [3, 1, 0]


def test_select_keeps_the_best_valid_candidates_in_document_order():
    scores = torch.tensor([
        [[0.1, 0.9, 0.3, 0.8, 0.2, 5.0]],  # slot 5 scores best but is not a candidate
        [[9.0, 9.0, 0.5, 0.1, 0.7, 0.4]],  # slots 0, 1 invalid (padding); keeps one
    ])  # fmt: skip
    valid = torch.tensor([[T, T, T, T, T, F], [F, F, T, T, T, T]])
    plan = make_plan(torch.tensor([3, 1]), torch.tensor([0, 0]))
    idx = select_indices(scores, valid, plan)
    assert idx.shape == (2, 1, 3)
    assert idx[0, 0].tolist() == [1, 2, 3]  # top 3 of {1: .9, 3: .8, 2: .3}, ascending
    assert idx[1, 0].tolist() == [0, 0, 4]  # invalid slots first, index 0 (masked by the plan)


def test_select_per_kv_group_ranks_each_group_by_its_own_scores():
    scores = torch.tensor([[[5.0, 4.0, 0.0, 0.0], [0.0, 0.0, 4.0, 5.0]]])  # [1, G=2, 4]
    plan = make_plan(torch.tensor([2]), torch.tensor([3]))
    idx = select_indices(scores, torch.ones(1, 4, dtype=torch.bool), plan)
    assert idx.tolist() == [[[0, 1], [2, 3]]]


def test_select_with_nothing_kept_is_empty():
    plan = make_plan(torch.tensor([0, 0]), torch.tensor([2, 2]))
    idx = select_indices(torch.rand(2, 1, 5), torch.ones(2, 5, dtype=torch.bool), plan)
    assert idx.shape == (2, 1, 0) and idx.dtype == torch.long


@pytest.mark.parametrize("groups", [1, 2])
def test_gather_keeps_the_chosen_slots_and_moves_their_keys_to_the_new_positions(groups: int):
    g = torch.Generator().manual_seed(0)
    b, h_kv, lp, c, d = 2, 2, 3, 7, 8
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    raw = torch.randn(b, h_kv, c, d, generator=g, dtype=torch.float64)  # un-rotated candidate keys
    cand_pos = torch.tensor([[3, 4, 5, 9, 10, 11, 12], [0, 0, 3, 7, 8, 9, 10]])  # [B, C]
    cand_valid = torch.tensor([[T] * 7, [F, F, T, T, T, T, T]])
    prefix_k = torch.randn(b, h_kv, lp, d, generator=g, dtype=torch.float64)
    keys = torch.cat([prefix_k, _rope(raw, cand_pos[:, None].expand(b, h_kv, c), inv_freq)], dim=2)
    values = torch.randn(b, h_kv, lp + c, d, generator=g, dtype=torch.float64)
    prefix_len = torch.tensor([3, 2])  # row 1's prefix is left-padded by one slot
    plan = make_plan(torch.tensor([4, 2]), prefix_len)
    scores = torch.rand(b, groups, c, generator=g, dtype=torch.float64)
    idx = select_indices(scores, cand_valid, plan)  # [B, G, K']

    new_k, new_v = gather_layer(keys, values, lp, idx, entry_moves(idx, cand_pos, plan, inv_freq))

    assert new_k.shape == new_v.shape == (b, h_kv, lp + 4, d)
    torch.testing.assert_close(new_k[:, :, :lp], prefix_k, rtol=0, atol=0)  # the prefix stays whole
    torch.testing.assert_close(new_v[:, :, :lp], values[:, :, :lp], rtol=0, atol=0)
    for row in range(b):
        for head in range(h_kv):
            chosen = idx[row, head if groups > 1 else 0]
            for slot in range(4):
                if not plan.slot_valid[row, slot]:
                    continue
                cand = int(chosen[slot])
                assert cand_valid[row, cand]
                torch.testing.assert_close(new_v[row, head, lp + slot], values[row, head, lp + cand], rtol=0, atol=0)
                want = _rope(raw[row, head, cand], plan.new_pos[row, slot], inv_freq)
                torch.testing.assert_close(new_k[row, head, lp + slot], want, rtol=1e-10, atol=1e-10)
    # Row 1 keeps 2 entries, at positions prefix_len + 0 and + 1.
    assert plan.new_pos[1].tolist() == [0, 0, 2, 3]


def test_gather_with_entries_already_in_place_copies_keys_unchanged():
    """Kept entries whose position does not change are copied bit for bit (no rotation)."""
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(1, 2, 2 + 3, 4, generator=g)
    values = torch.randn(1, 2, 2 + 3, 4, generator=g)
    plan = make_plan(torch.tensor([2]), torch.tensor([2]))
    idx = torch.tensor([[[0, 1]]])
    cand_pos = torch.tensor([[2, 3, 4]])  # candidates 0, 1 already sit at 2, 3
    new_k, new_v = gather_layer(keys, values, 2, idx, entry_moves(idx, cand_pos, plan, torch.ones(2)))
    assert torch.equal(new_k, keys[:, :, :4]) and torch.equal(new_v, values[:, :, :4])
