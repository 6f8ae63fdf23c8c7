"""Token distributions for greedy and nucleus sampling, shared by every decoder.

Contract: ``target_probs(logits, temperature, top_p)`` is THE distribution the model
samples from; the speculative acceptance rule uses the same function, which is what
makes speculative sampling follow it exactly.
"""

from __future__ import annotations

import torch


def target_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] after temperature and top-p filtering.

    Top-p keeps the smallest set of most likely tokens whose mass reaches top_p (the
    most likely token always survives), then renormalises.
    """
    probs = torch.softmax(logits.float() / max(temperature, 1e-6), dim=-1)
    if top_p >= 1.0:
        return probs
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly before each token
    sorted_p = torch.where(before < top_p, sorted_p, torch.zeros_like(sorted_p))
    filtered = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
    return filtered / filtered.sum(dim=-1, keepdim=True)


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from probs [V]."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def make_generators(seeds: list[int], device: torch.device) -> list[torch.Generator]:
    """One generator per row, so a request's sample does not depend on its batch mates."""
    gens = []
    for s in seeds:
        g = torch.Generator(device=device)
        g.manual_seed(int(s) % (2**63))
        gens.append(g)
    return gens
