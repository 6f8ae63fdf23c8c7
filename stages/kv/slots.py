"""Reshape a KV cache by slots: keep some, gather per KV head, stack rows into a batch.

Slots are the sequence axis of every layer's keys and values, ``[B, H_kv, S, D]``.

Contract:
- ``keep_slots(cache, keep)``: every layer of ``cache`` keeps only the slots ``keep``
  ([S'] long, ascending), the same ones in every layer and row (in place).
- ``gather_slots(keys, values, idx)``: per row and KV head, the slots ``idx``
  ([B, G, K] long, G = 1 shared by every head or G = H_kv) of one layer:
  (keys, values) [B, H_kv, K, D].
- ``stack_caches(parts, config=None)``: batches of caches with their valid masks
  (``[(cache [b_i, H_kv, S_i, D], valid [b_i, S_i] bool)]``) as one batch, each part
  right-aligned (left padding with invalid zero slots): (cache, valid [sum b_i, S]),
  S = max S_i; ``config`` (the model's) gives the cache its per-layer kinds.
- ``stack_rows(caches, config=None)``: ``stack_caches`` of per-row caches (batch 1 each,
  any lengths, every slot valid).
  The rows' positions are theirs to track: slots keep the RoPE positions they hold.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache


def keep_slots(cache: DynamicCache, keep: torch.Tensor) -> None:
    """Keep only the slots ``keep`` ([S'] long, ascending) of every layer, in place."""
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(2, keep)
        layer.values = layer.values.index_select(2, keep)


def gather_slots(
    keys: torch.Tensor, values: torch.Tensor, idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """keys, values [B, H_kv, S, D]; idx [B, G, K] (G = 1 or H_kv) -> [B, H_kv, K, D] each."""
    b, h_kv, _, d = keys.shape
    idx = idx.expand(b, h_kv, idx.shape[-1])  # G = 1 shares one selection across heads
    gidx = idx[..., None].expand(b, h_kv, idx.shape[-1], d)
    return keys.gather(2, gidx), values.gather(2, gidx)


def stack_caches(
    parts: list[tuple[DynamicCache, torch.Tensor]], config=None
) -> tuple[DynamicCache, torch.Tensor]:
    """Concatenate ``(cache, valid)`` batches along the batch axis, each left-padded with
    invalid slots to the widest: (cache, valid [B, S] bool). See the module contract."""
    if not parts:
        raise ValueError("stack_caches needs at least one cache")
    width = max(valid.shape[1] for _, valid in parts)
    valid = torch.cat([F.pad(v, (width - v.shape[1], 0)) for _, v in parts])
    out = DynamicCache(config=config) if config is not None else DynamicCache()
    for i in range(len(parts[0][0].layers)):
        # keys/values [b, H_kv, S_i, D] -> [b, H_kv, width, D]: zeros on the left
        keys = [F.pad(c.layers[i].keys, (0, 0, width - c.layers[i].keys.shape[2], 0)) for c, _ in parts]
        values = [F.pad(c.layers[i].values, (0, 0, width - c.layers[i].values.shape[2], 0)) for c, _ in parts]
        out.update(torch.cat(keys), torch.cat(values), i)
    return out, valid


def stack_rows(caches: list[DynamicCache], config=None) -> tuple[DynamicCache, torch.Tensor]:
    """Right-align per-row caches (batch 1 each) into one batch: (cache, valid [B, S])."""
    if not caches:
        raise ValueError("stack_rows needs at least one cache")
    dev = caches[0].layers[0].keys.device
    return stack_caches(
        [(c, torch.ones((1, c.get_seq_length()), dtype=torch.bool, device=dev)) for c in caches], config
    )
