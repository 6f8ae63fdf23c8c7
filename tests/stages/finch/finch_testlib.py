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
    "heads-shared-kv": {"mode": "kv"},
    "heads-kv_group": {"head_mode": "kv_group", "mode": "kv"},
    "heads-per_layer": {"selection": "per_layer", "mode": "kv"},
    "heads-early_exit": {"mode": "early_exit"},
}
KV_VARIANTS = [v for v in VARIANTS if VARIANTS[v].get("mode") == "kv"]
