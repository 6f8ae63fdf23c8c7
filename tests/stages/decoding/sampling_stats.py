"""Shared pieces of the sampling-distribution tests (dynamic and static engines).

A tiny Llama with a 16-token vocabulary makes the exact distribution of the first
generated tokens computable by enumeration; ``chi2_excess`` compares counts with it.
The fixtures (small_vocab_model, prompt, exact_marginals) live in conftest.py.
"""

from __future__ import annotations

import math

import torch

from stages.decoding.sampling import target_probs

# Top-k 10 of 16 before top-p 0.95: the engines' exactness is checked with both filters on.
V, ROWS, TEMP, TOP_P, TOP_K = 16, 3000, 1.0, 0.95, 10


def probs_after(model, seqs: list[list[int]]) -> torch.Tensor:
    """Target distributions [N, V] of the token after each sequence."""
    with torch.inference_mode():
        logits = model(torch.tensor(seqs)).logits[:, -1]
    return target_probs(logits, TEMP, TOP_P, TOP_K)


def chi2_excess(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square statistic over its p = 1e-4 critical value (> 1: reject)."""
    expected = probs * counts.sum()
    big = expected >= 5  # pool rare cells into one
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    z = 3.719  # one-sided normal quantile for 1e-4; Wilson-Hilferty approximation
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat / crit


def second_third_counts(results) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Counts [V] of the 2nd and 3rd generated tokens over ``results`` (RowResults), and
    the drafts fed; checks that drafts were both accepted and rejected often enough
    for the test to see the acceptance rule at work."""
    t2 = torch.bincount(torch.tensor([r.tokens[1] for r in results]), minlength=V).double()
    t3 = torch.bincount(torch.tensor([r.tokens[2] for r in results]), minlength=V).double()
    drafted = sum(r.draft_tokens for r in results)
    accepted = sum(r.accepted_tokens for r in results)
    assert accepted > len(results) // 10 and drafted - accepted > len(results) // 10
    return t2, t3, drafted
