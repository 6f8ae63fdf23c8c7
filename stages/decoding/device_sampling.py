"""Speculative sampling decided on the device, with randomness keyed by (seed, position).

Why: the host rule (verify.accept_sampled) draws from one torch.Generator per row,
a few host syncs per row per step. The static engine wants one sync per step, so
its rows are sampled here, batched, with uniforms that need no generator state:
``uniform(seed, i, lane)`` is a splitmix64 hash of the request's seed, the output
position ``i`` and a lane (0: accepting the draft at ``i``; 1: sampling the token at
``i``). A request's sample then depends on its seed alone, never on its batch
mates, its slot, the batch size or when it was admitted, and every uniform is used
for one decision only (a position's draft is judged once; its token is sampled
once), so Leviathan et al.'s argument applies as with fresh random numbers.

Contract: ``sample_step(probs, feed, n_fed, seeds, start) -> (accepted [b], token [b])``.
``probs`` ``[b, T, V]`` are target distributions (sampling.target_probs) for a step
that fed ``feed`` ``[b, T]`` (row i: last token, then ``n_fed[i] - 1`` drafts,
then padding); distribution ``j`` predicts output position ``start[i] + j``.
Draft ``j`` (``feed[i, j + 1]``) is accepted while ``uniform(seed, start + j, 0) <
p_j(draft)``; at the first rejection the token is drawn from ``p`` with the rejected
draft removed (``max(p - q, 0)`` for a point-mass draft q), else (all accepted) from
the next distribution, by inverse CDF with ``uniform(seed, start + a, 1)``. The
emitted tokens are ``feed[i, 1 : 1 + a]`` then ``token[i]``, as verify.py's rule.
"""

from __future__ import annotations

import torch

# splitmix64 constants as signed int64 (torch has no uint64 arithmetic).
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


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


def sample_step(
    probs: torch.Tensor,
    feed: torch.Tensor,
    n_fed: torch.Tensor,
    seeds: torch.Tensor,
    start: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(accepted [b] long, token [b] long) by the rule in the module docstring."""
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
