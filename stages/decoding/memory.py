"""The KV memory budget of an engine, and the slot layouts it allows: ``KvBudget``.

Why: rows are admitted by the KV tokens they will hold, not by a row count, so a job
whose context was compressed to 1k tokens keeps about 8x more rows in flight than one
decoding 8k-token documents in the same memory, which is where KV compression pays
in a batch job (vLLM sizes its KV cache the same way, from the memory left after the
weights: its ``gpu_memory_utilization``).

Contract:
- ``KvBudget(bytes_per_token, budget_bytes, fixed_slots)``; ``tokens`` = the budget in
  KV tokens (every layer's key and value of one token is ``bytes_per_token``).
- ``layout(need)`` -> ``(slots, capacity)``: slots of ``capacity`` >= ``need`` tokens
  (rounded up to ``CAPACITY_STEP``), as many as the budget holds, at most
  ``MAX_SLOTS``; None when not even one such slot fits (the row can never run).
  With ``fixed_slots`` (``resources.decode_slots`` as a number) the slot count is the
  user's, ``capacity`` is the need rounded up, and the budget plays no part (never None).
- ``budget_bytes_for(free_bytes, fraction, explicit_gb, reserve)``: the auto budget,
  ``fraction`` of ``free_bytes`` minus ``reserve``. The step backend says what is free
  (backends/: the device memory free after the weights on CUDA, the available RAM on
  CPU), its default fraction, and whether the largest step's activations are reserved
  (``step_reserve_bytes``). ``explicit_gb`` overrides all of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stages.kv.model_parts import text_config

CAPACITY_STEP = 256  # slot capacities are multiples of this many tokens
MAX_SLOTS = 256  # the largest batch bucket


def round_up(n: int, step: int = CAPACITY_STEP) -> int:
    return -(-int(n) // step) * step


@dataclass(frozen=True)
class KvBudget:
    bytes_per_token: int
    budget_bytes: int
    fixed_slots: int | None = None
    max_slots: int = MAX_SLOTS

    def __post_init__(self) -> None:
        if self.bytes_per_token < 1:
            raise ValueError(f"bytes_per_token must be >= 1, got {self.bytes_per_token}")
        if self.fixed_slots is not None and self.fixed_slots < 1:
            raise ValueError(f"decode slots must be >= 1, got {self.fixed_slots}")

    @property
    def tokens(self) -> int:
        """The budget in KV tokens."""
        return max(0, self.budget_bytes) // self.bytes_per_token

    def layout(self, need: int) -> tuple[int, int] | None:
        """(slots, capacity) for rows of up to ``need`` tokens; None if one row exceeds the budget."""
        capacity = round_up(max(1, need))
        if self.fixed_slots is not None:
            return self.fixed_slots, capacity
        slots = min(self.max_slots, self.tokens // capacity)
        return (slots, capacity) if slots >= 1 else None

    def describe(self) -> str:
        if self.fixed_slots is not None:
            return f"{self.fixed_slots} fixed slots"
        return f"{self.budget_bytes / 2**30:.2f} GiB = {self.tokens} KV tokens ({self.bytes_per_token} B each)"


def available_ram_bytes() -> int:
    """RAM available to new allocations now (psutil where installed, else /proc/meminfo)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    raise RuntimeError("cannot tell the available RAM (no psutil, no /proc/meminfo)")


def budget_bytes_for(
    free_bytes: int, fraction: float, explicit_gb: float | None = None, reserve: int = 0
) -> int:
    """The engine's KV budget in bytes (see the module contract)."""
    if explicit_gb is not None:
        return int(explicit_gb * 2**30)
    return int(fraction * free_bytes) - reserve


def step_reserve_bytes(model_config, max_batch: int, max_width: int, chunk_tokens: int, dtype: torch.dtype) -> int:
    """Activation memory the largest decode step or prefill chunk needs beside the KV slots.

    Decode: float32 logits of every fed token and their softmax ([b x T, V] x 2) plus the
    hidden states; prefill: a chunk's MLP activations (~6 x intermediate per token, in the
    model's dtype) and attention scores are streamed by SDPA. An estimate with 25% slack.
    """
    cfg = text_config(model_config)
    vocab = int(getattr(cfg, "vocab_size", 32000))
    hidden = int(getattr(cfg, "hidden_size", 4096))
    inter = int(getattr(cfg, "intermediate_size", 4 * hidden))
    size = torch.empty((), dtype=dtype).element_size()
    decode = max_batch * max_width * (2 * vocab * 4 + 8 * hidden * size)
    prefill = chunk_tokens * (6 * inter + 8 * hidden) * size
    return int(1.25 * max(decode, prefill))
