"""Shared builders for the Finch tests: tiny random models of each supported family
and random prompts split into PromptParts."""

from __future__ import annotations

import torch
from tiny_models import tiny_causal_lm

from stages.prompting import PromptParts

VOCAB = 512


def tiny(family: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float64, **overrides):
    """A 2-layer random model (4 query / 2 KV heads, head_dim 16) of ``family``."""
    overrides.setdefault("pad_token_id", 0)
    return tiny_causal_lm(VOCAB, family, seed, dtype, **overrides)


def random_parts(lengths: list[tuple[int, int, int]], seed: int = 0) -> list[PromptParts]:
    """PromptParts with random token ids; lengths = (prefix, doc, query) per row."""
    g = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, VOCAB, (n,), generator=g).tolist()

    return [PromptParts(ids(a), ids(b), ids(c)) for a, b, c in lengths]


#: Every Finch configuration family the generic checks run on: name -> spec fields.
VARIANTS: dict[str, dict] = {
    "paper-sum": {"scoring": "paper", "mode": "kv"},
    "paper-kv_group": {"scoring": "paper", "head_mode": "kv_group", "mode": "kv"},
    "heads-shared-kv": {"scoring": "heads", "mode": "kv"},
    "heads-kv_group": {"scoring": "heads", "head_mode": "kv_group", "mode": "kv"},
    "heads-per_layer": {"scoring": "heads", "selection": "per_layer", "mode": "kv"},
    "heads-early_exit": {"scoring": "heads", "mode": "early_exit"},
    # Chunk reading (stages/finch/shared.py): a document read once for all its questions.
    "paper-sum-chunk": {"scoring": "paper", "mode": "kv", "reading": "chunk"},
    "heads-kv_group-chunk": {"scoring": "heads", "head_mode": "kv_group", "mode": "kv", "reading": "chunk"},
    "heads-early_exit-chunk": {"scoring": "heads", "mode": "early_exit", "reading": "chunk"},
    # Chunk reading with the document's text before each chunk as its context (chunk_context).
    "paper-sum-chunk-context": {"scoring": "paper", "mode": "kv", "reading": "chunk", "chunk_context": 24},
    "heads-kv-chunk-whole-context": {"scoring": "heads", "mode": "kv", "reading": "chunk", "chunk_context": 4096},
}
KV_VARIANTS = [v for v in VARIANTS if VARIANTS[v].get("mode") == "kv"]
#: Variants whose kept entries were read with the document before them (the paper's
#: reading, or a chunk context longer than every document): with a budget holding every
#: document they equal one full prefill.
CONTEXT_VARIANTS = [v for v in VARIANTS
                    if VARIANTS[v].get("reading", "kept") == "kept" or VARIANTS[v].get("chunk_context", 0) >= 4096]


def heads_config(**fields):
    """Finch settings that select with the retrieval heads (early exit unless ``mode`` is
    given), read as the paper reads unless ``reading`` is given: the settings these
    tests were written for, before method finch's defaults became the paper's."""
    from stages.finch.config import FinchCompression

    fields.setdefault("scoring", "heads")
    fields.setdefault("mode", "early_exit")
    return FinchCompression(**fields)
