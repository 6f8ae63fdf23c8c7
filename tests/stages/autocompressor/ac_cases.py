"""Helpers shared by the AutoCompressor tests: the copy task and the batched == alone check."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from stages.autocompressor.prefill import autocompressor_prefill
from stages.decoding.config import DecodeConfig
from stages.decoding.reference import decode_plain

N_KEYS, N_SYMBOLS, SEP = 2, 16, 3


def copy_task(seed: int, batch: int = 32) -> Iterator[torch.Tensor]:
    """Blocks [B, 2 * N_KEYS + 1]: segment 1 random keys; segment 2 SEP, then the same keys
    (unguessable without memory of segment 1)."""
    g = torch.Generator().manual_seed(seed)
    while True:
        keys = torch.randint(4, 4 + N_SYMBOLS, (batch, N_KEYS), generator=g)
        yield torch.cat([keys, torch.full((batch, 1), SEP), keys], dim=1)


def assert_rows_as_alone(ac, parts, cfg, batched, pad: int, max_new_tokens: int) -> None:
    """Each row of a batched prefill (``batched``: CompressedPrefill of ``parts``) has the
    logits and greedy decode of the same row prefilled alone (fp32, 1e-4)."""
    decode_cfg = DecodeConfig(max_new_tokens=max_new_tokens, eos_ids=frozenset())
    last = batched.state.last_logits.clone()
    out = decode_plain(ac.lm, batched.state, decode_cfg)
    for i, p in enumerate(parts):
        single = autocompressor_prefill(ac, [p], cfg, pad)
        torch.testing.assert_close(single.state.last_logits[0], last[i], atol=1e-4, rtol=1e-4)
        assert decode_plain(ac.lm, single.state, decode_cfg)[0].tokens == out[i].tokens
