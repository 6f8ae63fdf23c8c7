"""Decoding-engine test setup.

Threads: tiny models run many small ops; on a shared 2-core machine two OpenMP
threads spin against each other, so these tests run on one thread.
"""

from __future__ import annotations

import pytest
from tiny_models import one_torch_thread, tiny_causal_lm


@pytest.fixture(scope="session")
def tiny_llama_factory():
    """tiny_causal_lm(vocab_size, seed=..., **overrides) for Llama (tests/tiny_models.py)."""
    return lambda vocab_size, seed=0, **overrides: tiny_causal_lm(vocab_size, "llama", seed, **overrides)


@pytest.fixture
def tiny_engine(tiny_model):
    """A fresh engine state for the shared tiny model (nothing learned carries between tests)."""
    from stages.decoding.engine_state import EngineState

    return EngineState(tiny_model)


@pytest.fixture(autouse=True)
def _single_thread():
    yield from one_torch_thread()
