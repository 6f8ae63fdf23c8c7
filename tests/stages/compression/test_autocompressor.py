"""stages/compression/autocompressor.py: the method's settings, which checkpoint it reads
(given, or the one shipped for the model, else an error that says what to set), the
tokenizer that comes with it, its admission bound and the prefill it loads."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from schemas.loading import spec_from_dict
from schemas.spec import EMBEDDED_MODEL
from stages.compression import registry
from stages.compression.autocompressor import AutoCompressorCompression, AutoCompressorMethod
from stages.prompting import PromptParts

pytestmark = pytest.mark.usefixtures("one_thread")


def _job(model: str, **compression):
    return spec_from_dict({"name": "a", "input": {"uri": "/unused"}, "task": {"kind": "summarize"},
                           "compression": {"method": "autocompressor", **compression},
                           "generation": {"model": model}})


def test_declaration_and_settings():
    method = registry()["autocompressor"]
    assert isinstance(method, AutoCompressorMethod)
    assert method.runs_at == "prefill" and method.reads_any_length and method.needs_checkpoint
    cfg = AutoCompressorCompression()
    assert (cfg.checkpoint, cfg.segment_tokens, cfg.target_tokens, cfg.soft_prompt_at) == (None, None, None, "start")
    with pytest.raises(ValueError, match="segment_tokens"):
        AutoCompressorCompression(segment_tokens=8)
    with pytest.raises(ValueError, match="soft_prompt_at"):
        AutoCompressorCompression(soft_prompt_at="end")


def test_checkpoint_given_or_shipped_else_what_to_set(method_env):
    method = AutoCompressorMethod()
    ckpt = method_env.required["checkpoint"]
    job = _job(str(method_env.model_dir), checkpoint=ckpt)
    assert method.checkpoint(job) == ckpt
    assert method.tokenizer_source(job) == str(method_env.model_dir)  # our format names its base model
    shipped = method.checkpoint(_job(EMBEDDED_MODEL))  # the paper's form by default
    assert shipped.endswith("smollm2-135m-instruct") and Path(shipped).is_dir()
    variant = method.checkpoint(_job(EMBEDDED_MODEL, summary_form="kv"))
    assert variant.endswith("smollm2-135m-instruct-kv") and Path(variant).is_dir()
    assert method.checkpoint(_job(EMBEDDED_MODEL, checkpoint=variant)) == variant  # its own form
    with pytest.raises(ValueError, match="is of summary form 'kv', but compression.summary_form is 'vectors'"):
        method.checkpoint(_job(EMBEDDED_MODEL, checkpoint=variant, summary_form="vectors"))
    with pytest.raises(ValueError, match="compression.checkpoint is not set and no AutoCompressor checkpoint "
                                         "of summary form 'vectors' ships for generation.model .*allowed: set "
                                         "compression.checkpoint"):
        method.checkpoint(_job(str(method_env.model_dir)))


def test_kv_tokens_bounds_the_prompt_by_the_document_part_it_reads(method_env):
    method = AutoCompressorMethod()
    parts = PromptParts([1, 2, 3], list(range(10, 110)), [4, 5, 6, 7])
    ckpt = method_env.required["checkpoint"]
    assert method.kv_tokens(_job("m", checkpoint=ckpt), parts) == 3 + 100 + 4 + 1
    assert method.kv_tokens(_job("m", checkpoint=ckpt, target_tokens=40), parts) == 3 + 40 + 4 + 1


@pytest.mark.parametrize(("target", "read"), [(None, 100), (40, 40)])
def test_load_compresses_each_segment_into_summary_vectors(method_env, target, read):
    """The tiny checkpoint: 3 summary vectors per segment, accumulated over the segments."""
    settings = {"checkpoint": method_env.required["checkpoint"], "segment_tokens": 32}
    if target:
        settings["target_tokens"] = target
    loaded = AutoCompressorMethod().load(_job(str(method_env.model_dir), **settings), torch.device("cpu"))
    assert not loaded.full_prefill
    res = loaded.prefill([PromptParts([1, 5], list(range(10, 110)), [7, 8])])
    assert res.context_tokens == [3 * math.ceil(read / 32)]
    assert torch.isfinite(res.state.last_logits).all() and res.compress_s[0] > 0
