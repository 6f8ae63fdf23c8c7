"""Static KV slots for the graph-friendly decode path (issue 12): ``SlotCache``.

Why: a CUDA graph replays fixed kernels on fixed addresses. The growable buffer of
kvbuffer.py changes shape every step (a view of the filled part), so every step is
a new graph. Here every layer's keys/values live in ONE preallocated tensor
``[B_slots, H_kv, S, D]`` for the actor's whole decode batch, and what changes
from step to step lives in device tensors updated in place:

- ``length``: ``[B_slots]`` long, slots filled per row. A row's real context is
  exactly its first ``length[b]`` slots: rows are loaded compacted (no left
  padding, no holes) and a verify step writes its T tokens at ``length + 0..T-1``
  but advances ``length`` only by accepted + 1, so rejected drafts and padding are
  simply overwritten by the next step (no holes, no compaction).
- ``pos``: ``[B_slots]`` long, the RoPE position of the row's next token. It is
  kept apart from ``length`` because a Finch-compressed cache keeps the original
  positions of its kept tokens (next position > slots used).

Contract:
- ``SlotCache(config_of_layers, slots, capacity, dtype, device)``; a transformers
  ``Cache`` the model writes through (``SlotLayer.update``). The batch of a step
  may be the first ``b <= B_slots`` slots (a batch bucket): layers then write and
  return the ``[:b]`` views, so a smaller bucket reads less.
- ``load(slot, state, row)`` copies row ``row`` of a ``PrefillState`` (any prefill
  strategy: full, Finch, AutoCompressor) into ``slot``, keeping its valid slots in
  order. ``move(src, dst)`` copies a row between slots (to keep active rows packed
  at the front). ``free(slot)`` zeroes its length.
- ``grow(capacity)``: reallocates to a larger ``S`` keeping every row (a new shape,
  so compiled steps specialise again; the engine grows in powers of two).
- ``get_seq_length()`` is 0: positions and masks come from the engine
  (slot_step.py passes explicit ``position_ids`` and a 4D mask), never from the
  cache, so nothing the model derives from it varies between steps.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from stages.decoding.state import PrefillState


class SlotLayer(CacheLayerMixin):
    """One layer's slots: keys/values ``[B_slots, H_kv, S, D]``; writes at ``length + t``."""

    is_compileable = True
    is_sliding = False

    def __init__(self, owner: SlotCache, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.owner = owner
        self.keys, self.values = keys, values
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Slots are allocated up front (see SlotCache); nothing is lazy."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """key/value_states ``[b, H_kv, T, D]`` -> the ``[b, H_kv, S, D]`` slot views, written in place."""
        b, h, t, d = key_states.shape
        write = self.owner.length[:b, None] + torch.arange(t, device=key_states.device)  # [b, T]
        idx_k = write[:, None, :, None].expand(b, h, t, d)
        idx_v = write[:, None, :, None].expand(b, value_states.shape[1], t, value_states.shape[3])
        keys, values = self.keys[:b], self.values[:b]
        keys.scatter_(2, idx_k, key_states.to(keys.dtype))
        values.scatter_(2, idx_v, value_states.to(values.dtype))
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        return 0  # see the module docstring: the engine owns positions and masks

    def get_max_length(self) -> int:
        return self.keys.shape[2]


class SlotCache(Cache):
    """Preallocated per-layer KV slots plus per-row ``length``/``pos`` (see module docstring)."""

    def __init__(
        self,
        layer_shapes: list[tuple[int, int, int]],
        slots: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        """layer_shapes: per layer (H_kv, D_key, D_value)."""
        if slots < 1 or capacity < 1:
            raise ValueError(f"need slots >= 1 and capacity >= 1, got {slots} and {capacity}")
        self.slots, self.capacity = slots, capacity
        self.length = torch.zeros(slots, dtype=torch.long, device=device)  # [B_slots]
        self.pos = torch.zeros(slots, dtype=torch.long, device=device)  # [B_slots]
        layers = [
            SlotLayer(
                self,
                torch.zeros((slots, h, capacity, dk), dtype=dtype, device=device),
                torch.zeros((slots, h, capacity, dv), dtype=dtype, device=device),
            )
            for h, dk, dv in layer_shapes
        ]
        super().__init__(layers=layers)
        self._mark_static()

    @classmethod
    def for_model(
        cls, model: torch.nn.Module, slots: int, capacity: int, dtype: torch.dtype | None = None
    ) -> SlotCache:
        """Slots shaped for ``model`` (every layer full attention, one KV width)."""
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        if getattr(cfg, "sliding_window", None) or getattr(cfg, "layer_types", None) and any(
            t != "full_attention" for t in cfg.layer_types
        ):
            raise ValueError("static KV slots need full attention in every layer (no sliding windows)")
        h_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        param = next(model.parameters())
        return cls(
            [(h_kv, head_dim, head_dim)] * cfg.num_hidden_layers,
            slots, capacity, dtype or param.dtype, param.device,
        )

    def _mark_static(self) -> None:
        # Fixed addresses: compiled steps (and CUDA graphs) may mutate them in place.
        for t in (self.length, self.pos, *(x for layer in self.layers for x in (layer.keys, layer.values))):
            torch._dynamo.mark_static_address(t)

    # ------------------------------------------------------------------ rows
    def load(self, slot: int, state: PrefillState, row: int) -> int:
        """Copy row ``row`` of ``state`` (its valid slots, in order) into ``slot``; returns its length."""
        keep = state.valid[row].nonzero().squeeze(1)  # [n]
        n = int(keep.numel())
        if n > self.capacity:
            raise ValueError(f"a prefilled row of {n} slots does not fit a capacity of {self.capacity}")
        for mine, theirs in zip(self.layers, state.cache.layers, strict=True):
            mine.keys[slot, :, :n] = theirs.keys[row][:, keep].to(mine.keys.dtype)
            mine.values[slot, :, :n] = theirs.values[row][:, keep].to(mine.values.dtype)
        self.length[slot] = n
        self.pos[slot] = state.next_pos[row]
        return n

    def move(self, src: int, dst: int, used: int) -> None:
        """Copy slot ``src``'s first ``used`` slots, length and position into slot ``dst``."""
        for layer in self.layers:
            layer.keys[dst, :, :used] = layer.keys[src, :, :used]
            layer.values[dst, :, :used] = layer.values[src, :, :used]
        self.length[dst] = self.length[src]
        self.pos[dst] = self.pos[src]

    def free(self, slot: int) -> None:
        """Forget the row in ``slot`` (its stale keys are never attended: length 0)."""
        self.length[slot] = 0
        self.pos[slot] = 0

    def advance(self, accepted: torch.Tensor) -> None:
        """After a verify step of the first ``b`` rows: ``length``/``pos`` += accepted + 1 ([b] long)."""
        b = accepted.shape[0]
        self.length[:b] += accepted + 1
        self.pos[:b] += accepted + 1

    def grow(self, capacity: int) -> None:
        """Reallocate every layer to ``capacity`` slots per row, keeping the filled ones."""
        if capacity <= self.capacity:
            return
        for layer in self.layers:
            for name in ("keys", "values"):
                old = getattr(layer, name)
                new = old.new_zeros((*old.shape[:2], capacity, old.shape[3]))
                new[:, :, : self.capacity] = old
                setattr(layer, name, new)
        self.capacity = capacity
        self._mark_static()

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0
