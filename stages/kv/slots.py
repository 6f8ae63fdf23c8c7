"""Reshape a KV cache by slots: keep some, gather per KV head, stack rows into a batch.

Slots are the sequence axis of every layer's keys and values, ``[B, H_kv, S, D]``.

Contract:
- ``keep_slots(cache, keep)``: every layer of ``cache`` keeps only the slots ``keep``
  ([S'] long, ascending), the same ones in every layer and row (in place).
- ``gather_slots(keys, values, idx)``: per row and KV head, the slots ``idx``
  ([B, G, K] long, G = 1 shared by every head or G = H_kv) of one layer:
  (keys, values) [B, H_kv, K, D].
- ``stack_rows(caches, config=None)``: per-row caches (batch 1 each, any lengths) as one
  batch, each row right-aligned (left padding): (cache, valid [B, S] bool), S = the
  longest row; ``config`` (the model's) gives the cache its per-layer kinds.
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


def stack_rows(caches: list[DynamicCache], config=None) -> tuple[DynamicCache, torch.Tensor]:
    """Right-align per-row caches (batch 1 each) into one batch: (cache, valid [B, S])."""
    if not caches:
        raise ValueError("stack_rows needs at least one cache")
    lengths = [c.get_seq_length() for c in caches]
    width = max(lengths)
    dev = caches[0].layers[0].keys.device
    valid = torch.zeros((len(caches), width), dtype=torch.bool, device=dev)
    for r, n in enumerate(lengths):
        valid[r, width - n :] = True
    out = DynamicCache(config=config) if config is not None else DynamicCache()
    for i in range(len(caches[0].layers)):
        keys, values = [], []
        for c, n in zip(caches, lengths, strict=True):
            k, v = c.layers[i].keys, c.layers[i].values  # [1, H_kv, n, D]
            keys.append(F.pad(k, (0, 0, width - n, 0)))
            values.append(F.pad(v, (0, 0, width - n, 0)))
        out.update(torch.cat(keys), torch.cat(values), i)
    return out, valid
