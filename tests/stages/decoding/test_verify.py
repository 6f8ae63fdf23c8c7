"""Verification rules on hand-made tensors: greedy acceptance and the keyed uniforms
(the distribution test of the sampling rule is test_engine_sampling.py)."""

from __future__ import annotations

import pytest
import torch

from stages.decoding.verify import greedy_accept, sample_accept, uniforms


def test_greedy_accepts_the_leading_run_of_matching_drafts():
    # Row 0 fed [last, 5, 6, 7]: the target's argmax after last is 5, after 5 is 6, after 6 is 9.
    feed = torch.tensor([[1, 5, 6, 7], [1, 4, 0, 0], [1, 2, 3, 0]])
    best = torch.tensor([[5, 6, 9, 8], [3, 4, 4, 4], [2, 3, 7, 7]])
    n_fed = torch.tensor([4, 2, 3])
    assert greedy_accept(feed, best, n_fed).tolist() == [2, 0, 2]
    # Padding never counts, even when it happens to equal the argmax.
    assert greedy_accept(torch.tensor([[1, 4, 4]]), torch.tensor([[4, 4, 4]]), torch.tensor([2])).tolist() == [1]


def test_sampling_with_certain_targets_is_greedy():
    """Point-mass targets: drafts equal to them are accepted, the first other one is corrected."""
    v = 6
    target = torch.tensor([2, 3, 4, 5])  # the one token each slot allows
    probs = torch.nn.functional.one_hot(target, v).double()[None]  # [1, 4, V]
    feed = torch.tensor([[1, 2, 3, 0]])  # drafts 2, 3 (right), then 0 (wrong)
    acc, tok = sample_accept(probs, feed, torch.tensor([4]), torch.tensor([7]), torch.tensor([0]))
    assert acc.tolist() == [2] and tok.tolist() == [4]


def test_uniforms_are_uniform_and_keyed():
    seeds = torch.tensor([0, 1, 2**62 + 5])
    pos = torch.arange(50_000).repeat(3, 1)
    u = uniforms(seeds, pos, 0)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert torch.allclose(u.mean(dim=1), torch.full((3,), 0.5, dtype=torch.float64), atol=0.01)
    hist = torch.histc(u[0].float(), bins=10, min=0.0, max=1.0)
    assert (hist - 5000).abs().max() < 300  # ~4 sigma
    assert not torch.equal(u, uniforms(seeds, pos, 1))  # lanes differ
    assert torch.equal(uniforms(seeds[1:2], pos[1:2, 100:200], 0), u[1:2, 100:200])  # keyed, no state
    with pytest.raises(AssertionError):
        torch.testing.assert_close(u[0], u[1])  # seeds differ


def test_a_draw_scales_by_the_row_mass_and_never_picks_a_zero_probability_token():
    """The inverse CDF is taken against the row's own total mass: float32 probabilities sum to a
    little under or over 1, and a uniform above the total would fall off the end, onto the last
    token whatever its probability. A row of mass 0.75 shows it plainly."""
    from stages.decoding.verify import sampled

    probs = torch.tensor([0.25, 0.25, 0.25, 0.0], dtype=torch.float64).expand(1, 4000, 4).contiguous()
    drawn = sampled(probs, torch.tensor([11]), torch.arange(4000)[None])
    counts = torch.bincount(drawn[0], minlength=4)
    assert counts[3] == 0
    assert (counts[:3] - 4000 / 3).abs().max() < 150  # ~5 sigma
