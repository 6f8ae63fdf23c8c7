"""KV entries of prompt prefixes that later requests share: ``PrefixCache``.

Why: in a question-answering night every question on a document becomes its own
request, and with a context that depends on the document alone (none, truncate) they
share every prompt token before the question: the chat template, the document and
its separator. Prefilling that part once per document instead of once per question
saves (N - 1) / N of the prefill for N questions, and prefill is most of a job whose
answers are short (vLLM's automatic prefix caching does the same at block level).

Contract: entries are keyed by the exact prefix token ids (a tuple: no hash
collisions) and hold each layer's keys and values for those positions, ``[H_kv, P,
D]`` per layer, as copies the cache owns. ``get(ids)`` returns the entry (and makes
it the most recently used) or None; ``put(ids, kv)`` stores one, evicting the least
recently used entries until the byte budget holds it; an entry larger than the whole
budget is not stored. ``bytes_used`` never exceeds ``budget_bytes``. The cache knows
nothing of slots, models or requests (the engine decides what to store and where the
prefix ends).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

#: Per layer (keys, values), each [H_kv, P, D].
LayerKV = tuple[torch.Tensor, torch.Tensor]


def kv_bytes(kv: list[LayerKV]) -> int:
    """Bytes held by one entry's tensors."""
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


@dataclass
class PrefixCache:
    """Least-recently-used prefix entries within ``budget_bytes`` (see the module contract)."""

    budget_bytes: int
    bytes_used: int = 0
    hits: int = 0
    misses: int = 0
    tokens_reused: int = 0  # prompt tokens not prefilled thanks to hits
    _entries: OrderedDict[tuple[int, ...], list[LayerKV]] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, ids: tuple[int, ...]) -> list[LayerKV] | None:
        """The entry for exactly these prefix ids, or None (counted as a hit or a miss)."""
        kv = self._entries.get(ids)
        if kv is None:
            self.misses += 1
            return None
        self._entries.move_to_end(ids)
        self.hits += 1
        self.tokens_reused += len(ids)
        return kv

    def put(self, ids: tuple[int, ...], kv: list[LayerKV]) -> bool:
        """Store ``kv`` (owned by the cache from now on) for ``ids``; False when it is larger
        than the whole budget (nothing is evicted then)."""
        size = kv_bytes(kv)
        if size > self.budget_bytes:
            return False
        old = self._entries.pop(ids, None)
        if old is not None:
            self.bytes_used -= kv_bytes(old)
        while self._entries and self.bytes_used + size > self.budget_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes_used -= kv_bytes(evicted)
        self._entries[ids] = kv
        self.bytes_used += size
        return True

    def describe(self) -> str:
        return (
            f"prefix cache {self.budget_bytes / 2**20:.0f} MiB: {self.hits} hits, {self.misses} misses, "
            f"{self.tokens_reused} prompt tokens reused"
        )
