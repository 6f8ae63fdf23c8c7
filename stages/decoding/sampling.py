"""Token distributions for greedy and nucleus sampling, shared by every decoder.

Contract: ``target_probs(logits, temperature, top_p, top_k)`` is THE distribution the
model samples from; the speculative acceptance rule uses the same function, which is what
makes speculative sampling follow it exactly.
"""

from __future__ import annotations

import torch


def target_probs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 0) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] after temperature, top-k and top-p
    filtering (the order transformers' sampling uses).

    Top-k (``top_k`` > 0) keeps the k most likely tokens (ties at the k-th all kept); top-p
    then keeps the smallest set of the most likely left whose mass reaches top_p (the most
    likely token always survives); the result is renormalised.
    """
    scaled = logits.float() / max(temperature, 1e-6)
    if 0 < top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]  # [..., 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
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
