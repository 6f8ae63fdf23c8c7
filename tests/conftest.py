"""Shared fixtures: tiny random Llama-family models for speed, the embedded default
for the few end-to-end tests. Tiny models use the embedded tokenizer so prompts,
chat templates and EOS behave like the real thing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

from tiny_models import tiny_causal_lm  # noqa: E402

from schemas.spec import EMBEDDED_MODEL  # noqa: E402


def make_tiny_llama(vocab_size: int, seed: int = 0, **overrides):
    """A 2-layer Llama with GQA (4 query heads, 2 KV heads), RoPE, random weights."""
    return tiny_causal_lm(vocab_size, "llama", seed, **overrides)


@pytest.fixture(scope="session")
def tokenizer():
    """The embedded SmolLM2 tokenizer (converts the GGUF once into the user cache)."""
    from stages.model_loading import load_tokenizer

    return load_tokenizer(EMBEDDED_MODEL)


@pytest.fixture(scope="session")
def tiny_model(tokenizer):
    return make_tiny_llama(len(tokenizer))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_model, tokenizer) -> Path:
    """The tiny model saved as a HF directory, for tests that load models by path."""
    d = tmp_path_factory.mktemp("tiny-llama")
    tiny_model.save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def embedded_model():
    from stages.model_loading import load_causal_lm

    return load_causal_lm(EMBEDDED_MODEL)


@pytest.fixture(scope="session")
def ray_session():
    """One embedded Ray for the whole test session (starting Ray costs ~10-20 s).

    Tests that run pipelines in-process use it; ``run_job`` reuses an initialised Ray.
    """
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",  # ours, even where a `ray start` cluster runs on this machine
            num_cpus=8,  # logical slots: actor pools + read/write tasks, not cores
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}},
        )
    yield ray
    ray.shutdown()


def write_spec(path: Path, text: str) -> Path:
    """Write a YAML spec file for a test and return its path."""
    path.write_text(text)
    return path
