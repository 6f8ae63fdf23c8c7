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

Sampling (``sample_accept``; Leviathan et al., 2023, with a point-mass draft q):
accept ``d_j`` with probability ``min(1, p(d_j) / q(d_j)) = p(d_j)``; at the first
rejection draw from ``max(p - q, 0)`` renormalised (p with ``d_j`` removed); if every
draft is accepted, draw from the next distribution. Each emitted token is then
distributed exactly as under plain sampling from p. Randomness is keyed, not drawn
from a generator: ``uniforms(seed, i, lane)`` is a splitmix64 hash of the request's
seed, the output position ``i`` and a lane (0: judging the draft at ``i``; 1:
sampling the token at ``i``). A request's sample then depends on its seed alone,
never on its batch mates, its slot or when it was admitted, and every uniform is used
for one decision only (a position's draft is judged once; its token is sampled
once), so the argument holds as with fresh random numbers.
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


def _residual(dist: torch.Tensor, rejected: torch.Tensor, was_rejected: torch.Tensor) -> torch.Tensor:
    """dist [b, V]; where ``was_rejected`` ([b] bool), remove token ``rejected`` ([b] long)."""
    removed = dist.scatter(1, rejected[:, None], 0.0)
    return torch.where(was_rejected[:, None], removed, dist)


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
    b, t, _ = probs.shape
    cols = torch.arange(t, device=probs.device)
    positions = start[:, None] + cols  # [b, T] output position each distribution predicts
    if t > 1:
        drafts = feed[:, 1:]  # [b, T-1]
        p_draft = probs[:, :-1].gather(2, drafts[:, :, None]).squeeze(2).double()  # [b, T-1]
        is_draft = cols[None, 1:] < n_fed[:, None]
        ok = (uniforms(seeds, positions[:, :-1], 0) < p_draft) & is_draft
        accepted = ok.long().cumprod(dim=1).sum(dim=1)  # [b]
    else:
        accepted = torch.zeros(b, dtype=torch.long, device=probs.device)
    rows = torch.arange(b, device=probs.device)
    dist = probs[rows, accepted].double()  # [b, V] the distribution of position start + a
    was_rejected = accepted < n_fed - 1
    rejected = feed[rows, (accepted + 1).clamp(max=t - 1)]
    dist = _residual(dist, rejected, was_rejected)
    cdf = dist.cumsum(dim=1)  # [b, V]
    u = uniforms(seeds, (start + accepted)[:, None], 1)  # [b, 1]
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1)
    return accepted, token.clamp(max=probs.shape[2] - 1)
