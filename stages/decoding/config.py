"""Decoding settings and per-row results shared by every decoder.

Contract: the engine (engine.py) and the reference decoder take a ``DecodeConfig``
and return one ``RowResult`` per request.
``decode_config_for`` is the one place a spec's generation settings become a
DecodeConfig (the generate stage and the bench both use it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stages.prompting import prompt_stops

if TYPE_CHECKING:
    from schemas.spec import GenerationSpec


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int
    eos_ids: frozenset[int]
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    stop_strings: tuple[str, ...] = ()
    repeat_ngram: int = 0  # stops.StopChecker's repeat guard (0: off)
    # Speculation: "none" or a drafter's name (stages/decoding/drafters/).
    speculative: str = "none"
    num_draft_tokens: int = 8
    max_ngram: int = 3
    min_ngram: int = 1
    adaptive: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def eos_ids_of(tokenizer: Any, generation_config: Any = None) -> frozenset[int]:
    """Every token that ends generation: the tokenizer's EOS and the model's
    ``generation_config.eos_token_id`` (an int or a list: chat models often stop on
    an end-of-turn token besides EOS)."""
    ids: set[Any] = {getattr(tokenizer, "eos_token_id", None)}
    gen_eos = getattr(generation_config, "eos_token_id", None)
    ids |= set(gen_eos) if isinstance(gen_eos, Iterable) else {gen_eos}
    return frozenset(int(i) for i in ids if i is not None)


def decode_config_for(generation: GenerationSpec, tokenizer: Any, generation_config: Any = None) -> DecodeConfig:
    """The DecodeConfig of a spec's ``generation`` settings for this tokenizer/model.

    EOS ids come from ``eos_ids_of``; stop strings are the spec's and the prompt format's
    (stages/prompting.py ``prompt_stops``: a model without a chat template answers a plain
    prompt); ``speculative.method`` none turns drafting off.
    """
    spec = generation.speculative
    stops = tuple(generation.stop) + tuple(s for s in prompt_stops(tokenizer) if s not in generation.stop)
    return DecodeConfig(
        max_new_tokens=generation.max_new_tokens,
        eos_ids=eos_ids_of(tokenizer, generation_config),
        temperature=generation.temperature,
        top_p=generation.top_p,
        top_k=generation.top_k,
        stop_strings=stops,
        repeat_ngram=generation.repeat_guard,
        speculative=spec.method,
        num_draft_tokens=spec.num_draft_tokens,
        max_ngram=spec.max_ngram,
        min_ngram=spec.min_ngram,
        adaptive=spec.adaptive,
    )


@dataclass
class RowResult:
    """One request's generation and its figures (seconds are wall time in the engine)."""

    tokens: list[int] = field(default_factory=list)  # generated ids, cut after the stop
    finish_reason: str = "length"  # "eos" | "stop" | "repeat" | "length"
    draft_tokens: int = 0
    accepted_tokens: int = 0
    decode_steps: int = 0  # forward passes after prefill this row took part in
    ttft_s: float = 0.0  # from the request's arrival at the engine to its first token
    decode_s: float = 0.0  # from first token to last token
    queue_s: float = 0.0  # from arrival to the start of its prefill (waiting for memory)
    stall_s: float = 0.0  # while decoding, time spent on other rows' prefill (it waited)
    prefill_s: float = 0.0  # its prefill (a group prefill's time split evenly over the group)
    compress_s: float = 0.0  # of the prefill, what the method reports as compression
    cached_prompt_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (not prefilled)
    context_tokens: int | None = None  # document-derived entries the model conditions on
    kept_positions: list[int] | None = None  # document positions a method prefill kept (CompressedPrefill)
    prefilled_positions: list[int] | None = None  # those it prefilled as text, in prompt order (CompressedPrefill)
    device_s: float = 0.0  # its share of the device: its prefill + each step's time / rows in the step
