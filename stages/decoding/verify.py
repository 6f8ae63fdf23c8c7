"""Verification of one row's draft against the target model's distributions.

Contract: a row fed ``[last, d_1, ..., d_n]`` gets ``n + 1`` target distributions;
distribution ``i`` predicts the token after ``d_i`` (``d_0`` = last). Both rules
return ``(accepted, emitted)``: ``emitted`` is the accepted drafts ``d_1..d_a``
followed by exactly one token chosen by the target (the bonus or the correction),
so a verify step always emits ``accepted + 1`` tokens.

Greedy: accept while ``d_i`` equals the target argmax; the argmax at the first
mismatch (or after the last draft) is the extra token. The result is exactly what
plain greedy decoding would emit.

Sampling (the draft is a point mass q = 1[x = d_i]): accept ``d_i`` with
probability ``min(1, p(d_i) / q(d_i)) = p(d_i)``; on rejection sample from
``max(p - q, 0)`` renormalised, which is p with ``d_i`` removed; if every draft is
accepted, sample the extra token from the next distribution. Each emitted token is
then distributed exactly as under plain sampling from ``p`` (the standard
speculative-sampling argument with a deterministic draft).
"""

from __future__ import annotations

import torch


def accept_greedy(drafts: list[int], best: list[int]) -> tuple[int, list[int]]:
    """drafts [n]; best [n + 1] target argmax per fed slot."""
    a = 0
    n = len(drafts)
    while a < n and drafts[a] == best[a]:
        a += 1
    return a, drafts[:a] + [best[a]]


def accept_sampled(
    drafts: list[int],
    probs: torch.Tensor,
    p_drafts: list[float],
    generator: torch.Generator,
) -> tuple[int, list[int]]:
    """drafts [n]; probs [n + 1, V] target distributions; p_drafts[i] = probs[i, drafts[i]]."""
    n = len(drafts)
    if n:
        uniforms = torch.rand(n, generator=generator, device=probs.device).tolist()
        for i in range(n):
            if uniforms[i] >= p_drafts[i]:
                residual = probs[i].clone()
                residual[drafts[i]] = 0.0  # max(p - q, 0); multinomial renormalises
                tok = int(torch.multinomial(residual, 1, generator=generator))
                return i, drafts[:i] + [tok]
    tok = int(torch.multinomial(probs[n], 1, generator=generator))
    return n, drafts + [tok]
