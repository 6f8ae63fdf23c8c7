"""A KV cache that grows in place, and the two whole-cache edits the engine needs.

Why: transformers' ``DynamicLayer`` concatenates every step (``torch.cat`` of the
whole cache, O(S) bytes copied per layer per step). On a long document that copy
costs as much as a good part of the forward pass. ``BufferLayer`` keeps each
layer's keys/values in a preallocated ``[B, H_kv, capacity, D]`` buffer, writes new
slots in place and hands attention a view of the filled part. Capacity doubles
when full (amortised O(1) per token).

Contract:
- ``adopt(cache, reserve)`` swaps every layer of a ``DynamicCache`` for a
  ``BufferLayer`` holding the same slots (one copy, at decode start), with room for
  ``reserve`` more slots. The object stays a ``DynamicCache``, so the model and
  ``forward_step`` use it unchanged.
- ``keep_rows(cache, rows)`` keeps only the batch rows ``rows`` (finished rows leave).
- ``compact(cache, valid)`` squeezes out invalid slots (holes left by rejected
  drafts and padding), keeping each row's valid slots in order, right-aligned; it
  returns the new ``valid`` ``[B, S']`` with ``S'`` = the most valid slots of any row.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class BufferLayer(DynamicLayer):
    """A DynamicLayer whose slots live in a growable buffer (see module docstring)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, reserve: int) -> None:
        super().__init__()
        b, h, s, d = keys.shape  # [B, H_kv, S, D]
        self.dtype, self.device = keys.dtype, keys.device
        self.length = s
        cap = s + max(reserve, 16)
        self._k = keys.new_empty((b, h, cap, d))
        self._v = values.new_empty((b, values.shape[1], cap, values.shape[3]))
        self._k[:, :, :s] = keys
        self._v[:, :, :s] = values
        self.is_initialized = True
        self._sync()

    def _sync(self) -> None:
        # `keys`/`values` stay views of the filled part, so code reading them sees the cache.
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]

    def _grow(self, need: int) -> None:
        cap = max(need, self._k.shape[2] * 3 // 2)
        k = self._k.new_empty((*self._k.shape[:2], cap, self._k.shape[3]))
        v = self._v.new_empty((*self._v.shape[:2], cap, self._v.shape[3]))
        k[:, :, : self.length] = self._k[:, :, : self.length]
        v[:, :, : self.length] = self._v[:, :, : self.length]
        self._k, self._v = k, v

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        t = key_states.shape[2]  # [B, H_kv, T, D]
        end = self.length + t
        if end > self._k.shape[2]:
            self._grow(end)
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        self._sync()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of slots to drop, got {tokens_to_remove}")
        self.length = max(0, self.length + tokens_to_remove)
        self._sync()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k = self._k[indices]
        self._v = self._v[indices]
        self._sync()

    def gather_slots(self, index: torch.Tensor, new_length: int) -> None:
        """Keep slots ``index`` [B, new_length] (per row, in order) at the buffer's start."""
        b, h, _, d = self._k.shape
        idx = index[:, None, :, None].expand(b, h, new_length, d)
        self._k[:, :, :new_length] = torch.gather(self._k[:, :, : self.length], 2, idx)
        self._v[:, :, :new_length] = torch.gather(self._v[:, :, : self.length], 2, idx)
        self.length = new_length
        self._sync()


def adopt(cache: DynamicCache, reserve: int) -> None:
    """Move every layer of ``cache`` into a BufferLayer with room for ``reserve`` more slots."""
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, BufferLayer):
            continue
        if type(layer) is not DynamicLayer or not layer.is_initialized:
            raise ValueError(
                f"the engine needs a full-attention DynamicCache; layer {i} is {type(layer).__name__}"
            )
        cache.layers[i] = BufferLayer(layer.keys, layer.values, reserve)


def keep_rows(cache: DynamicCache, rows: torch.Tensor) -> None:
    """Keep batch rows ``rows`` ([B'] long) in every layer."""
    for layer in cache.layers:
        layer.batch_select_indices(rows)


def compact(cache: DynamicCache, valid: torch.Tensor) -> torch.Tensor:
    """Drop invalid slots; valid [B, S] -> new valid [B, S'] (right-aligned per row).

    Slot order is kept, so causality (slot order) is unchanged; RoPE positions were
    baked into the keys when they were written, so moving slots does not change them.
    """
    counts = valid.sum(dim=1)  # [B]
    width = int(counts.max())
    s = valid.shape[1]
    # Stable sort puts invalid slots first, valid ones after in their original order.
    order = torch.sort(valid.to(torch.int8), dim=1, stable=True).indices  # [B, S]
    index = order[:, s - width :]  # [B, S'] the last `width` entries: all valid slots (+ pad)
    new_valid = torch.gather(valid, 1, index)
    for layer in cache.layers:
        layer.gather_slots(index, width)
    return new_valid
