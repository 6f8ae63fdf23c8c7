"""Keep the top-k document entries of one layer, in document order, re-rotated.

Cache layout while Finch runs (every layer, every row; slot order = causal order):

    [ prefix region (width Lp) | document region (width K) | block (width T) ]

The prefix region is the left-padded chat prefix, kept whole. The document region
holds the entries kept so far, left-padded per row (a row keeping fewer entries
than the widest row has invalid slots first). The block is the pass's
``[pad ; chunk ; P]``. Candidates for the next document region are the valid
document slots and the block's chunk tokens; the prompt's own entries and
padding never are. After selection the layer is ``[prefix | kept]`` again, each
kept entry rotated from its old position to ``prefix_len + rank`` (contiguous, in
document order), so the cache never stores positions beyond
prefix + target + chunk + |P|.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stages.kv.rope import rotate_by, rotation
from stages.kv.slots import gather_slots


@dataclass
class Plan:
    """The per-row part of a selection, shared by every layer.

    kept: [B] long, entries each row keeps; slot_valid: [B, K'] bool (K' = max kept,
    invalid slots first); new_pos: [B, K'] long, the positions they are rotated to
    (0 on invalid slots).
    """

    kept: torch.Tensor
    slot_valid: torch.Tensor
    new_pos: torch.Tensor


def make_plan(kept: torch.Tensor, prefix_len: torch.Tensor) -> Plan:
    """kept: [B] long; prefix_len: [B] long (real prefix tokens per row)."""
    width = int(kept.max()) if kept.numel() else 0
    slot = torch.arange(width, device=kept.device)[None]  # [1, K']
    pad = (width - kept)[:, None]  # [B, 1]
    slot_valid = slot >= pad
    new_pos = torch.where(slot_valid, prefix_len[:, None] + slot - pad, 0)
    return Plan(kept=kept, slot_valid=slot_valid, new_pos=new_pos)


def select_indices(scores: torch.Tensor, cand_valid: torch.Tensor, plan: Plan) -> torch.Tensor:
    """Candidate indices each row keeps, in document order, invalid slots first.

    scores: [B, G, C] float; cand_valid: [B, C] bool. Returns [B, G, K'] long
    (indices on invalid slots are 0: a harmless gather target, masked out by
    ``plan.slot_valid``).
    """
    width = plan.slot_valid.shape[1]
    b, g, _ = scores.shape
    if width == 0:
        return torch.zeros((b, g, 0), dtype=torch.long, device=scores.device)
    masked = scores.masked_fill(~cand_valid[:, None], float("-inf"))
    top = masked.topk(width, dim=-1).indices  # [B, G, K'], best first
    rank_ok = torch.arange(width, device=scores.device)[None, None] < plan.kept[:, None, None]
    # Sort kept indices ascending (document order) with the dropped ranks (-1) first.
    order = torch.where(rank_ok, top, -1).sort(dim=-1).values
    return order.clamp(min=0)


def entry_moves(idx: torch.Tensor, cand_pos: torch.Tensor, plan: Plan,
                inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotation (cos, sin) [B, G, K', D] moving the kept candidates ``idx`` [B, G, K']
    from their positions ``cand_pos`` [B, C] to ``plan.new_pos``. Layers sharing one
    selection share it (select_and_compact computes it once for them)."""
    old_pos = cand_pos[:, None].expand(idx.shape[0], idx.shape[1], cand_pos.shape[-1]).gather(2, idx)
    delta = torch.where(plan.slot_valid[:, None], plan.new_pos[:, None] - old_pos, 0)
    return rotation(delta, inv_freq)


def gather_layer(
    keys: torch.Tensor,
    values: torch.Tensor,
    prefix_width: int,
    idx: torch.Tensor,
    moves: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rebuild one layer as ``[prefix | kept]``.

    keys, values: [B, H_kv, Lp + C, D] (prefix region then candidates); idx: [B, G, K']
    from ``select_indices``; moves: ``entry_moves`` of that idx. Returns keys, values of
    shape [B, H_kv, Lp + K', D].
    """
    b, h_kv = keys.shape[:2]
    idx = idx.expand(b, h_kv, idx.shape[-1])  # G = 1 shares one selection across heads
    sel_k, sel_v = gather_slots(keys[:, :, prefix_width:], values[:, :, prefix_width:], idx)  # [B, Hkv, K', D]
    # Rotating by 0 is exact (cos 1, sin 0), and asking whether any delta is non-zero would
    # cost a host sync per layer: on a GPU the pass is launch-bound, so rotate always.
    sel_k = rotate_by(sel_k, *moves)
    new_k = torch.cat([keys[:, :, :prefix_width], sel_k], dim=2)
    new_v = torch.cat([values[:, :, :prefix_width], sel_v], dim=2)
    return new_k, new_v
