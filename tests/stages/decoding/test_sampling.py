"""Token distributions (stages/decoding/sampling.py): temperature, top-p, per-row generators."""

from __future__ import annotations

import pytest
import torch

from stages.decoding.sampling import make_generators, sample_from, target_probs

# Probabilities 0.5, 0.25, 0.15, 0.1 (as logits), in a shuffled vocabulary order.
P = torch.tensor([0.15, 0.5, 0.1, 0.25])
LOGITS = P.log()


def test_temperature_one_and_top_p_one_is_the_softmax():
    torch.testing.assert_close(target_probs(LOGITS, 1.0, 1.0), P)


def test_temperature_sharpens_and_flattens():
    cold, hot = target_probs(LOGITS, 0.5, 1.0), target_probs(LOGITS, 2.0, 1.0)
    torch.testing.assert_close(cold, P**2 / (P**2).sum())
    torch.testing.assert_close(hot, P**0.5 / (P**0.5).sum())
    # Temperature 0 (greedy configs) does not divide by zero: all mass on the argmax.
    torch.testing.assert_close(target_probs(LOGITS, 0.0, 1.0), torch.tensor([0.0, 1.0, 0.0, 0.0]))


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [
        (0.5, [1]),  # 0.5 alone reaches 0.5
        (0.6, [1, 3]),  # 0.5 < 0.6: the next most likely joins
        (0.74, [1, 3]),
        (0.76, [0, 1, 3]),  # 0.5 + 0.25 falls short
        (0.95, [0, 1, 2, 3]),
        (0.01, [1]),  # the most likely token always survives
    ],
)
def test_top_p_keeps_the_smallest_most_likely_set_and_renormalises(top_p, kept):
    probs = target_probs(LOGITS, 1.0, top_p)
    want = torch.zeros(4)
    want[kept] = P[kept] / P[kept].sum()
    torch.testing.assert_close(probs, want)


def test_top_k_keeps_the_k_most_likely_before_top_p():
    torch.testing.assert_close(target_probs(LOGITS, 1.0, 1.0, 2), torch.tensor([0.0, 2 / 3, 0.0, 1 / 3]))
    torch.testing.assert_close(target_probs(LOGITS, 1.0, 0.6, 3), target_probs(LOGITS, 1.0, 0.6))  # 0.6 of 0.9
    torch.testing.assert_close(target_probs(LOGITS, 1.0, 1.0, 0), P)  # 0: off
    torch.testing.assert_close(target_probs(LOGITS, 1.0, 1.0, 99), P)  # more than the vocabulary: off


def test_temperature_top_k_top_p_give_what_transformers_warpers_give():
    """The same filters, in the same order, as transformers' sampling (a library users know)."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(3)) * 3
    scores = logits.clone()
    for warper in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(12), TopPLogitsWarper(0.8)):
        scores = warper(None, scores)
    torch.testing.assert_close(target_probs(logits, 0.7, 0.8, 12), torch.softmax(scores, dim=-1))


def test_batched_rows_are_filtered_independently():
    logits = torch.stack([LOGITS, LOGITS.flip(0), torch.zeros(4)])[:, None]  # [3, 1, V]
    probs = target_probs(logits, 1.0, 0.6)
    assert probs.shape == (3, 1, 4)
    torch.testing.assert_close(probs[0, 0], target_probs(LOGITS, 1.0, 0.6))
    torch.testing.assert_close(probs[1, 0], target_probs(LOGITS, 1.0, 0.6).flip(0))
    assert (probs[2, 0] > 0).sum() == 3  # uniform: 0.25 x 3 reaches 0.6 (ties keep their sort order)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 1))


def test_generators_are_per_row_and_reproducible():
    probs = torch.full((50,), 1 / 50)
    a = make_generators([3, 4], torch.device("cpu"))
    first = [[sample_from(probs, g) for _ in range(20)] for g in a]
    assert first[0] != first[1]  # different seeds, different draws
    # Row 0's draws do not depend on how often row 1 drew in between.
    b = make_generators([3, 2**70 + 9], torch.device("cpu"))
    again = []
    for _ in range(20):
        again.append(sample_from(probs, b[0]))
        sample_from(probs, b[1])
    assert again == first[0]
    # sample_from never returns a token of probability 0.
    assert {sample_from(torch.tensor([0.0, 0.0, 1.0]), b[0]) for _ in range(10)} == {2}


def test_top_p_one_keeps_every_token_even_past_the_float_sum_of_one():
    """top_p >= 1 is no filter: a token whose mass comes after the float32 running sum has
    reached 1.0 (here p = 1e-13, summed after p ~ 1) keeps its probability."""
    logits = torch.tensor([0.0, -30.0, -30.0])
    probs = target_probs(logits, 1.0, 1.0)
    assert (probs > 0).all()
    torch.testing.assert_close(probs, torch.softmax(logits, dim=-1))
