"""Verification of drafts against the model, decided on the device: greedy and Leviathan.

A step feeds row i ``[last, d_1, ..., d_n, pad...]`` (``n_fed[i] = 1 + n``) and gets
one target distribution per fed slot; slot ``j`` predicts the token after ``d_j``
(``d_0`` = last). Both rules return ``accepted`` ``[b]`` (a leading run of drafts
kept) and one more token per row chosen by the target (the bonus or the correction),
so a verify step always emits ``accepted + 1`` tokens: ``feed[i, 1 : 1 + a]`` then
that token. Everything stays on the device; the engine reads the result back in ONE
transfer per step.

Greedy (``greedy_accept``): accept while ``d_j`` equals the target argmax of slot
``j - 1``; the extra token is the argmax at the first mismatch (or after the last
draft). The result is exactly what plain greedy decoding emits.

Sampling (``sample_accept``; Leviathan et al., 2023, with a point-mass draft q): each
slot's token is drawn from its target distribution p by inverse CDF with a keyed uniform,
``x_j``; a draft is accepted while it equals the token drawn for its position, and the
token emitted after the accepted run is that position's draw. For a point-mass draft
this is Leviathan's rule itself: ``d`` is accepted with probability ``p(d) = min(1,
p(d) / q(d))``, and a rejected position emits a draw from p conditioned on ``x != d``,
which is ``max(p - q, 0)`` renormalised. Each emitted token is therefore distributed
exactly as under plain sampling from p; more, it IS plain sampling's token, since plain
sampling draws position ``i`` with the same uniform. Randomness is keyed, not drawn from
a generator: ``uniforms(seed, i, lane)`` is a splitmix64 hash of the request's seed, the
output position ``i`` and a lane (1: sampling the token at ``i``). A request's text then
depends on its seed alone: never on its batch mates, its slot, when it was admitted, nor
on drafting (speculation on or off, the adaptive width chosen from timings), up to
floating-point differences between a verify step's and a plain step's logits that move
a draw across a token's edge (as a near tie can flip greedy's argmax). Every emitted
position's uniform is used once.
"""

from __future__ import annotations

import torch

# splitmix64 constants as signed int64 (torch has no uint64 arithmetic).
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def greedy_accept(feed: torch.Tensor, best: torch.Tensor, n_fed: torch.Tensor) -> torch.Tensor:
    """feed [b, T] long, best [b, T] target argmax per slot, n_fed [b] -> accepted [b] long."""
    t = feed.shape[1]
    is_draft = torch.arange(1, t, device=feed.device)[None] < n_fed[:, None]  # [b, T-1]
    match = (feed[:, 1:] == best[:, :-1]) & is_draft
    return match.long().cumprod(dim=1).sum(dim=1)  # leading run of matches


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (>> is arithmetic on signed tensors)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser; int64 products wrap modulo 2**64."""
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, lane: int) -> torch.Tensor:
    """seeds [b] long, positions [b, T] long -> [b, T] float64 uniforms in [0, 1)."""
    key = _mix(seeds * 2 + lane)  # [b]
    z = _mix(key[:, None] + positions * _GOLDEN)
    return _shr(z, 11).double() * (2.0**-53)


def sampled(probs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """probs [b, T, V], seeds [b], positions [b, T] -> [b, T] long: each slot's inverse-CDF
    draw with its position's keyed uniform (one [b, V] float64 sum at a time: the slots'
    sums together would double the probabilities' memory)."""
    u = uniforms(seeds, positions, 1)  # [b, T]
    out = []
    for j in range(probs.shape[1]):
        cdf = probs[:, j].double().cumsum(dim=1)  # [b, V]
        out.append(torch.searchsorted(cdf, (u[:, j] * cdf[:, -1])[:, None], right=True).squeeze(1))
    return torch.stack(out, dim=1).clamp(max=probs.shape[2] - 1)


def sample_accept(
    probs: torch.Tensor,
    feed: torch.Tensor,
    n_fed: torch.Tensor,
    seeds: torch.Tensor,
    start: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(accepted [b] long, token [b] long) by the sampling rule of the module docstring.

    probs [b, T, V] target distributions (sampling.target_probs); slot j predicts
    output position ``start[i] + j``; seeds [b] long; start [b] long.
    """
    t = probs.shape[1]
    positions = start[:, None] + torch.arange(t, device=probs.device)  # [b, T] output position per slot
    drawn = sampled(probs, seeds, positions)  # [b, T]
    accepted = greedy_accept(feed, drawn, n_fed)  # a draft is kept while it equals its position's draw
    return accepted, drawn.gather(1, accepted[:, None]).squeeze(1)
