"""The Finch paper's score of cache entries: the attention the prompt's queries give them.

The prompt's queries come from stages.kv.queries.QueryCapture during the chunk pass.

Score (one layer, one batch row), after the pass has appended the block's keys:

    a[h, j, s] = softmax_s(q[h, j] . k[s] / sqrt(D))   over the slots s that prompt
                 row j may attend to (the pass's own causal/padding mask, so the
                 prompt's own entries are in the denominator, as in the paper)
    n_j        = number of slots prompt row j attends to
    score[g, s] = sum_{j in P} sum_{h in heads(g)} n_j * a[h, j, s]

``n_j * a`` is the attention relative to the uniform weight ``1/n_j``: later rows
of a causal mask spread their unit mass over more slots, and this puts every
prompt row on the same scale before the sum (the paper's "normalisation by the
number of non-zero entries"; its code multiplies by ``n_j / S``, the same ranking).
Dividing per key column instead would be a no-op: every document slot is seen by
all |P| prompt rows. ``heads(g)`` is all query heads (head_mode="sum", G = 1) or
the query heads sharing KV head g (head_mode="kv_group", G = H_kv).
"""

from __future__ import annotations

import torch


def prompt_scores(
    queries: torch.Tensor,
    keys: torch.Tensor,
    row_mask: torch.Tensor,
    p_real: torch.Tensor,
    scaling: float,
    head_mode: str,
) -> torch.Tensor:
    """Finch scores of every cache slot for one layer (see the module docstring).

    queries: [B, H, P, D] post-RoPE prompt queries; keys: [B, H_kv, S, D] post-RoPE
    cache keys (block included); row_mask: [B, P, S] bool, the pass's attention mask
    at the prompt rows; p_real: [B, P] bool, which of the P rows are real prompt
    tokens of that batch row. Returns [B, G, S] float32 (float64 for float64 keys), G = 1 (sum) or H_kv (kv_group).
    """
    b, h, p, d = queries.shape
    h_kv = keys.shape[1]
    work = torch.float64 if keys.dtype == torch.float64 else torch.float32
    q = queries.to(work).view(b, h_kv, h // h_kv, p, d)  # [B, Hkv, g, P, D]
    logits = (q @ keys.to(work)[:, :, None].transpose(-1, -2)) * scaling  # [B, Hkv, g, P, S]
    mask = row_mask[:, None, None]  # [B, 1, 1, P, S]
    probs = logits.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    weight = row_mask.sum(dim=-1).to(work) * p_real  # [B, P]: n_j, 0 for non-prompt rows
    per_group = torch.einsum("bkgps,bp->bks", probs, weight)  # [B, Hkv, S]
    if head_mode == "sum":
        return per_group.sum(dim=1, keepdim=True)
    if head_mode == "kv_group":
        return per_group
    raise ValueError(f"head_mode must be 'sum' or 'kv_group', got {head_mode!r}")
