"""Shared fixtures for the AutoCompressor tests.

Tiny models run single-threaded: on a shared 2-core machine, intra-op threads spin against
other processes and make tiny matmuls ~30x slower.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import one_torch_thread, tiny_causal_lm


def tiny_llama(vocab_size: int, seed: int = 0, **overrides):
    """2-layer Llama, GQA 4/2 heads, hidden 64 (tests/tiny_models.py)."""
    return tiny_causal_lm(vocab_size, "llama", seed, **overrides)


@pytest.fixture(autouse=True)
def _one_thread():
    yield from one_torch_thread()


@pytest.fixture
def make_ac():
    """Factory: an AutoCompressor over a fresh tiny Llama (summary embeddings randomised so
    that summary tokens differ from each other)."""
    from stages.autocompressor.model import ACConfig, AutoCompressor

    def build(vocab: int = 100, k: int = 3, accumulate: bool = True, seed: int = 0, **overrides):
        lm = tiny_llama(vocab, seed=seed, initializer_range=0.2, **overrides)
        g = torch.Generator().manual_seed(seed + 1)
        summary = torch.randn(k, lm.config.hidden_size, generator=g) * 0.2
        return AutoCompressor(
            lm, ACConfig(summary_length=k, accumulate_summary=accumulate), summary
        ).eval()

    return build


@pytest.fixture
def make_lm():
    """Factory: tests/conftest.make_tiny_llama(vocab_size, seed, **overrides)."""
    return tiny_llama
