"""Decoding settings and per-row results shared by every decoder.

Contract: a decoder takes a ``PrefillState`` (see state.py), per-row lookup token
lists and a ``DecodeConfig``, and returns one ``RowResult`` per row, in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int
    eos_ids: frozenset[int]
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    stop_strings: tuple[str, ...] = ()
    # Prompt-lookup speculation (ignored when speculative == "none").
    speculative: str = "none"  # "none" | "prompt_lookup"
    num_draft_tokens: int = 8
    max_ngram: int = 3
    min_ngram: int = 1
    adaptive: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class RowResult:
    tokens: list[int] = field(default_factory=list)  # generated ids, cut after the stop
    finish_reason: str = "length"  # "eos" | "stop" | "length"
    draft_tokens: int = 0
    accepted_tokens: int = 0
    decode_steps: int = 0  # forward passes after prefill this row took part in
    ttft_s: float = 0.0  # from decode start (prefill included) to first token
    decode_s: float = 0.0  # from first token to last token
