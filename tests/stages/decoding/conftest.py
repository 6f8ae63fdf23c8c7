"""Decoding-engine test setup.

Threads: tiny models run many small ops; on a shared 2-core machine two OpenMP
threads spin against each other, so these tests run on one thread.
"""

from __future__ import annotations

from pathlib import Path

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


# ----------------------------------------------------------------------------- sampling checks
# Shared by test_engine_sampling.py (dynamic engine) and test_device_sampling.py (static).
@pytest.fixture(scope="module")
def small_vocab_model(tiny_llama_factory):
    """A 16-token-vocabulary Llama; a larger init spreads the logits: peaked
    distributions, so drafts are often accepted and often rejected."""
    from sampling_stats import V

    return tiny_llama_factory(V, seed=3, initializer_range=0.2)


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    import torch
    from sampling_stats import V

    return torch.randint(0, V, (20,), generator=torch.Generator().manual_seed(0)).tolist()


@pytest.fixture(scope="module")
def exact_marginals(small_vocab_model, prompt):
    """Exact marginals ([V], [V]) of the 2nd and 3rd generated tokens, by enumeration."""
    from sampling_stats import V, probs_after

    p1 = probs_after(small_vocab_model, [prompt])[0]  # [V]
    p2 = probs_after(small_vocab_model, [prompt + [a] for a in range(V)])  # [V, V]
    p3 = probs_after(small_vocab_model, [prompt + [a, b] for a in range(V) for b in range(V)])  # [V*V, V]
    joint12 = p1[:, None] * p2  # [V, V]
    return joint12.sum(0), joint12.flatten() @ p3


def _kernel_choices_reset(monkeypatch, cache: Path):
    """The C kernels' per-process choices reset and their build cache in ``cache``; reset
    again after the test, so the next user decides in its own environment."""
    from stages.decoding.backends.cpu_native import attention, linear

    monkeypatch.setenv("LONGDOC_CACHE", str(cache))
    for module in (attention, linear):
        module._kernel_choice.cache_clear()
    yield cache
    for module in (attention, linear):
        module._kernel_choice.cache_clear()


@pytest.fixture
def fresh_kernel(monkeypatch, tmp_path):
    """The kernels' choices reset and an empty build cache: the kernels are compiled again
    (~2 s each), for the tests of building itself (once per machine, a failed build, no
    compiler)."""
    yield from _kernel_choices_reset(monkeypatch, tmp_path)


@pytest.fixture(scope="session")
def _kernel_build_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kernel-build-cache")


@pytest.fixture
def kernel(monkeypatch, _kernel_build_cache):
    """The kernels' choices reset, their build cache shared by the whole session (each kernel
    compiled once, not once per test): for the tests of the kernels' results."""
    yield from _kernel_choices_reset(monkeypatch, _kernel_build_cache)
