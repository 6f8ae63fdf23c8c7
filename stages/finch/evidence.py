"""Evidence scores: prompt attention from chosen heads, normalised per head, pooled.

Why not the paper's sum over every head of every layer: most heads attend by
position (the attention sink, the most recent tokens), so the sum favours the last
chunk and keeps scattered single tokens. Measured on SmolLM2-135M (6 needle facts): 1/6
needles kept with the plain sum, 3/6 with pooling, 4/6 with the calibrated
retrieval heads and one shared selection.

Score of document candidate c for one batch row (candidates: the document slots of
the cache, kept entries and the block's chunk, in document order):

    m[h, s]  = sum_{j in P} n_j * a[h, j, s]     (paper_scores.py's per-head mass, before
                                                  the sum over heads)
    e[h, c]  = m[h, c] / sum_{c' valid} m[h, c'] (each head's mass over the document
                                                  candidates only, so a head that
                                                  parks its attention on the prefix
                                                  sink counts as much as one that
                                                  does not)
    E[g, c]  = sum_{h in heads(g)} e[h, c]
    pooled   = mean of E over a window of ``pool`` valid candidates centred on c,
               + 1e-3 E[g, c] (within a window's plateau the peak ranks first)

``heads(g)``: the selecting heads (G = 1), or per KV group the selecting heads of
that group (G = H_kv; a group with none of them uses all of them). Pooling runs on
the valid candidates compacted in document order, so padding never splits a window
and a row scores the same alone or in any batch. A single strong token lifts its
whole window, so the selection keeps runs of text, not scattered tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_TIE_BREAK = 1e-3  # weight of a slot's own score next to its window's mean


def head_mass(
    queries: torch.Tensor,
    keys: torch.Tensor,
    row_mask: torch.Tensor,
    p_real: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    """Per query head, the n_j-weighted prompt attention each slot receives.

    queries: [B, H, P, D] post-RoPE; keys: [B, H_kv, S, D] post-RoPE (H query heads
    share KV heads in groups of H / H_kv, in order); row_mask: [B, P, S] bool;
    p_real: [B, P] bool. Returns [B, H, S] float32 (float64 for float64 keys).
    """
    b, h, p, d = queries.shape
    h_kv = keys.shape[1]
    work = torch.float64 if keys.dtype == torch.float64 else torch.float32
    k = keys.to(work).repeat_interleave(h // h_kv, dim=1)  # [B, H, S, D]
    logits = (queries.to(work) @ k.transpose(-1, -2)) * scaling  # [B, H, P, S]
    probs = logits.masked_fill(~row_mask[:, None], float("-inf")).softmax(dim=-1)
    weight = row_mask.sum(dim=-1).to(work) * p_real  # [B, P]: n_j, 0 for non-prompt rows
    return torch.einsum("bhps,bp->bhs", probs.nan_to_num(0.0), weight)


def normalise(mass: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """mass: [B, H, C]; valid: [B, C] bool. Each head's mass over valid slots, summing to 1
    (0 where a row has no valid slot)."""
    m = mass * valid[:, None]
    return m / m.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(m.dtype).tiny)


def group_heads(per_head: torch.Tensor, heads: list[int], n_query: int, n_kv: int, groups: int) -> torch.Tensor:
    """Sum per-head scores into G groups.

    per_head: [B, len(heads), C], scores of query heads ``heads`` of one layer.
    groups = 1: their sum, [B, 1, C]. groups = n_kv: [B, n_kv, C], per KV group the
    heads of that group (zeros for a group without any: ``fill_empty_groups`` fills it).
    """
    if groups == 1:
        return per_head.sum(dim=1, keepdim=True)
    size = n_query // n_kv
    out = per_head.new_zeros(per_head.shape[0], n_kv, per_head.shape[-1])
    for i, h in enumerate(heads):
        out[:, h // size] += per_head[:, i]
    return out


def fill_empty_groups(scores: torch.Tensor, has_head: torch.Tensor) -> torch.Tensor:
    """scores: [B, G, C]; has_head: [G] bool. Groups without a selecting head take the
    sum over all groups (every selecting head)."""
    if bool(has_head.all()):
        return scores
    total = scores.sum(dim=1, keepdim=True)
    return torch.where(has_head[None, :, None], scores, total)


def pool_valid(scores: torch.Tensor, valid: torch.Tensor, window: int) -> torch.Tensor:
    """Mean over a centred window of ``window`` valid slots (see module docstring).

    scores: [B, G, C]; valid: [B, C] bool. Returns [B, G, C]; invalid slots get 0.
    window 1 returns the scores unchanged (masked).
    """
    if window < 1:
        raise ValueError(f"pool_window must be >= 1, got {window}")
    masked = scores * valid[:, None]
    if window == 1:
        return masked
    b, g, c = scores.shape
    # Compact valid slots to the front, in order: argsort of ~valid is stable.
    order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)  # [B, C]
    compact = masked.gather(2, order[:, None].expand(b, g, c))  # [B, G, C], zeros after the valid ones
    # count_include_pad: the zero slots past the document edges count as zeros, so an
    # edge token is not favoured by a shorter window.
    pooled = F.avg_pool1d(
        compact.reshape(b * g, 1, c), window, stride=1, padding=window // 2, count_include_pad=True
    ).reshape(b, g, -1)[..., :c]
    out = torch.zeros_like(pooled).scatter(2, order[:, None].expand(b, g, c), pooled)
    # Ties inside a plateau go to the strongest tokens themselves: when the schedule
    # lets a chunk keep fewer tokens than a window, the peak survives, not a neighbour.
    return (out + masked * _TIE_BREAK) * valid[:, None]


def sentence_best(scores: torch.Tensor, sentence: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The best valid score of each candidate's sentence: scores [B, G, C], sentence [B, C]
    long (each candidate's sentence index in its row's document, any value on invalid
    slots), valid [B, C] bool. Returns [B, G, C] (invalid slots: their sentence's best, or
    -inf where it has no valid candidate)."""
    b, g, c = scores.shape
    idx = sentence.clamp(min=0)[:, None].expand(b, g, c)
    masked = scores.masked_fill(~valid[:, None], float("-inf"))
    best = torch.full((b, g, int(idx.max()) + 1), float("-inf"), dtype=scores.dtype, device=scores.device)
    best = best.scatter_reduce(2, idx, masked, reduce="amax", include_self=True)
    return best.gather(2, idx)


def pool_sentences(scores: torch.Tensor, sentence: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Each candidate ranked by the best score of its sentence (``keep: sentences`` in mode
    kv), plus ``_TIE_BREAK`` x its own, so a budget keeps whole sentences, best first, and
    a sentence cut by the budget keeps its strongest tokens.

    scores: [B, G, C] (pooled evidence); sentence, valid: as ``sentence_best`` takes them.
    Returns [B, G, C]; invalid slots get 0.
    """
    if scores.shape[2] == 0:
        return scores
    out = sentence_best(scores, sentence, valid) + scores * _TIE_BREAK
    return torch.where(valid[:, None], out, torch.zeros_like(out))
