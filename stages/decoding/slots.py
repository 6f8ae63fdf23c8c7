"""Static KV slots, the engine's cache: ``SlotCache``.

Why static: a CUDA graph replays fixed kernels on fixed addresses, so every layer's
keys/values live in ONE preallocated tensor ``[B_slots, H_kv, S, D]`` for the actor's
whole decode batch, and what changes from step to step lives in device tensors
updated in place. The same layout serves the CPU: no per-step concatenation, and a
rejected draft needs no rollback.

- ``length``: ``[B_slots]`` long, slots filled per row. A row's real context is
  exactly its first ``length[b]`` slots: rows are loaded compacted (no left
  padding, no holes) and a verify step writes its T tokens at ``length + 0..T-1``
  but advances ``length`` only by accepted + 1, so rejected drafts and padding are
  simply overwritten by the next step (no holes, no compaction).
- ``pos``: ``[B_slots]`` long, the RoPE position of the row's next token. It is
  kept apart from ``length`` because a Finch-compressed cache keeps the original
  positions of its kept tokens (next position > slots used).

Contract:
- ``SlotCache(layer_shapes, slots, capacity, dtype, device, indexed_writes)`` is a transformers
  ``Cache`` the model writes through (``SlotLayer.update``). The batch of a step
  may be the first ``b <= B_slots`` slots (a batch bucket): layers then write and
  return the ``[:b]`` views, so a smaller bucket reads less.
- ``load(slot, state, row)`` copies row ``row`` of a ``PrefillState`` (any prefill
  strategy: full, Finch, AutoCompressor) into ``slot``, keeping its valid slots in
  order. ``row_writer(slot)`` is a one-row ``Cache`` that writes a prefill chunk
  straight into ``slot`` (the engine's own chunked prefill, no copy afterwards).
  ``move(src, dst)`` copies a row between slots (active rows stay packed at the
  front). ``free(slot)`` zeroes its length.
- ``reshape(slots, capacity, keep)``: reallocates to another layout keeping the
  first ``keep`` rows (a new shape: compiled steps specialise again, so the engine
  changes the layout rarely). ``bytes_per_token`` is what one slot of one row costs
  (every layer's key and value), the unit of the engine's memory budget.
- ``get_seq_length()`` is 0: positions and masks come from the engine
  (slot_step.py passes explicit ``position_ids`` and a 4D mask), never from the
  cache, so nothing the model derives from it varies between steps.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from stages.decoding.state import PrefillState
from stages.kv.model_parts import text_config


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
        if self.owner.indexed_writes:
            # Indexed assignment, the same bytes written, where the step backend asks for it
            # (CPU: scatter_ on a bfloat16 slot tensor rewrites the whole tensor; the figures
            # are in backends/torch_eager.py). Elsewhere scatter_, the form CUDA's compiled
            # steps and graphs were measured with.
            rows = torch.arange(b, device=key_states.device)[:, None]  # [b, 1]
            self.keys[rows, :, write] = key_states.to(self.keys.dtype).transpose(1, 2)  # [b, T, H, D]
            self.values[rows, :, write] = value_states.to(self.values.dtype).transpose(1, 2)
            return self.keys[:b], self.values[:b]
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
        indexed_writes: bool = False,
    ) -> None:
        """layer_shapes: per layer (H_kv, D_key, D_value); ``indexed_writes``: steps write their
        keys/values by indexed assignment instead of scatter_ (the step backend's choice)."""
        if slots < 1 or capacity < 1:
            raise ValueError(f"need slots >= 1 and capacity >= 1, got {slots} and {capacity}")
        self.layer_shapes = list(layer_shapes)
        self.slots, self.capacity = slots, capacity
        self.dtype, self.device = dtype, torch.device(device)
        self.indexed_writes = indexed_writes
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
        self.layout_version = 0  # +1 whenever the tensors are reallocated (reshape): captured graphs hold addresses
        self._mark_static()

    @classmethod
    def for_model(
        cls, model: torch.nn.Module, slots: int, capacity: int, dtype: torch.dtype | None = None
    ) -> SlotCache:
        """Slots shaped for ``model`` (one KV width for every layer)."""
        shapes = layer_shapes_of(model)
        param = next(model.parameters())
        return cls(shapes, slots, capacity, dtype or param.dtype, param.device)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one slot of one row takes over every layer (keys and values)."""
        return bytes_per_token(self.layer_shapes, self.dtype)

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

    def copy_out(self, slot: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of the first ``n`` slots of ``slot``: per layer (keys, values), each [H, n, D]."""
        return [(layer.keys[slot, :, :n].clone(), layer.values[slot, :, :n].clone()) for layer in self.layers]

    def copy_in(self, slot: int, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
        """Fill ``slot`` with ``kv`` (``copy_out``'s layout, positions 0..n-1); returns n.

        The row then holds n tokens and its next position is n, as after prefilling
        those tokens itself.
        """
        n = int(kv[0][0].shape[1])
        if n > self.capacity:
            raise ValueError(f"a prefix of {n} slots does not fit a capacity of {self.capacity}")
        for layer, (k, v) in zip(self.layers, kv, strict=True):
            layer.keys[slot, :, :n] = k
            layer.values[slot, :, :n] = v
        self.length[slot] = n
        self.pos[slot] = n
        return n

    def row_writer(self, slot: int) -> RowWriter:
        """A one-row Cache writing into ``slot`` at its length (see RowWriter)."""
        return RowWriter(self, slot)

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

    def reshape(self, slots: int, capacity: int, keep: int) -> None:
        """Reallocate to ``slots`` rows of ``capacity`` slots, keeping rows ``0..keep-1``.

        The kept rows must fit: ``keep <= slots`` and each row's length <= ``capacity``.
        The old tensors are released before the new ones are filled only where that is
        safe (rows are copied first), so peak memory is briefly old + new.
        """
        if keep > slots:
            raise ValueError(f"cannot keep {keep} rows in {slots} slots")
        if keep and int(self.length[:keep].max()) > capacity:
            raise ValueError(f"a kept row is longer than the new capacity {capacity}")
        used = int(self.length[:keep].max()) if keep else 0
        for layer in self.layers:
            for name in ("keys", "values"):
                old = getattr(layer, name)
                new = old.new_zeros((slots, old.shape[1], capacity, old.shape[3]))
                if keep:
                    new[:keep, :, :used] = old[:keep, :, :used]
                setattr(layer, name, new)
        length, pos = self.length, self.pos
        self.length = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.length[:keep] = length[:keep]
        self.pos[:keep] = pos[:keep]
        self.slots, self.capacity = slots, capacity
        self.layout_version += 1
        self._mark_static()

    def grow(self, capacity: int) -> None:
        """Reallocate every row to ``capacity`` slots (never shrinks), keeping every row."""
        if capacity > self.capacity:
            self.reshape(self.slots, capacity, keep=self.slots)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


class _RowLayer(CacheLayerMixin):
    """One layer of a RowWriter: writes ``[1, H, T, D]`` at the slot's length, returns
    the slot's filled part ``[1, H, length + T, D]`` (a view)."""

    is_compileable = False
    is_sliding = False

    def __init__(self, writer: RowWriter, layer: SlotLayer) -> None:
        super().__init__()
        self.writer, self.layer = writer, layer
        self.dtype, self.device = layer.dtype, layer.device
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate: the slot's tensors exist."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        start, t = self.writer.start, key_states.shape[2]
        s = self.writer.slot
        self.layer.keys[s, :, start : start + t] = key_states[0].to(self.layer.keys.dtype)
        self.layer.values[s, :, start : start + t] = value_states[0].to(self.layer.values.dtype)
        return self.layer.keys[s : s + 1, :, : start + t], self.layer.values[s : s + 1, :, : start + t]

    def get_seq_length(self) -> int:
        return self.writer.start

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.writer.start + query_length, 0

    def get_max_length(self) -> int:
        return self.layer.keys.shape[2]


class RowWriter(Cache):
    """A Cache over one slot of a SlotCache, for a prefill chunk of that row.

    Contract: the model sees a batch of one row whose past is the slot's first
    ``start`` slots (``start`` = the slot's length when the writer was made, then
    advanced by ``commit(tokens, next_pos)``); each layer writes the chunk's keys/values at
    ``start + 0..T-1`` and attends over ``start + T`` slots. The owner's
    ``length``/``pos`` change only on ``commit`` (the engine calls it after the
    chunk's forward), so a decode step of other rows in between sees nothing of it.
    """

    def __init__(self, owner: SlotCache, slot: int) -> None:
        self.owner, self.slot = owner, slot
        self.start = int(owner.length[slot])
        super().__init__(layers=[_RowLayer(self, layer) for layer in owner.layers])

    def commit(self, tokens: int, next_pos: int) -> None:
        """The chunk of ``tokens`` is written: the row now holds them; its next RoPE position."""
        self.start += tokens
        self.owner.length[self.slot] = self.start
        self.owner.pos[self.slot] = next_pos

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.start


def layer_shapes_of(model: torch.nn.Module) -> list[tuple[int, int, int]]:
    """Per layer (H_kv, D_key, D_value) of ``model``. Layers that attend within a sliding
    window get slots as long as full-attention ones (forward.py applies the window)."""
    cfg = text_config(model.config)
    h_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return [(h_kv, head_dim, head_dim)] * cfg.num_hidden_layers


def bytes_per_token(layer_shapes: list[tuple[int, int, int]], dtype: torch.dtype) -> int:
    """KV bytes of one token over every layer: sum of H_kv x (D_key + D_value) x element size."""
    size = torch.empty((), dtype=dtype).element_size()
    return sum(h * (dk + dv) * size for h, dk, dv in layer_shapes)
