"""Fixtures shared by the stage tests: ``method_env`` (every compression method on a
tiny model, see tests/method_cases.py) and ``one_thread``."""

from __future__ import annotations

import pytest
import torch
from method_cases import WINDOW, MethodEnv
from tiny_models import one_torch_thread, tiny_causal_lm


@pytest.fixture(scope="session")
def method_env(tmp_path_factory, tokenizer) -> MethodEnv:
    from stages.autocompressor.checkpoint import save_autocompressor
    from stages.autocompressor.model import ACConfig, AutoCompressor

    model_dir = tmp_path_factory.mktemp("tiny-window")
    lm = tiny_causal_lm(len(tokenizer), "llama", seed=3, max_position_embeddings=WINDOW, initializer_range=0.1)
    lm.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    g = torch.Generator().manual_seed(4)
    summary = torch.randn(3, lm.config.hidden_size, generator=g) * 0.2
    ac = AutoCompressor(lm, ACConfig(summary_length=3, accumulate_summary=True), summary)
    ckpt = save_autocompressor(ac, tmp_path_factory.mktemp("tiny-ac"), base_model=str(model_dir))
    # The kv form (every 4th key/value of a segment kept), the embedded model's default.
    kv = AutoCompressor(lm, ACConfig(summary_length=1, summary_form="kv", kv_stride=4))
    kv_ckpt = save_autocompressor(kv, tmp_path_factory.mktemp("tiny-ac-kv"), base_model=str(model_dir))
    return MethodEnv(
        model_dir, {"checkpoint": str(ckpt)},
        variants={"autocompressor-kv": {"checkpoint": str(kv_ckpt)},
                  "finch-kv-sentences": {"scoring": "heads", "keep": "sentences"}},
    )


@pytest.fixture
def one_thread():
    """One intra-op thread for tiny models (tests/tiny_models.py); use with usefixtures."""
    yield from one_torch_thread()
