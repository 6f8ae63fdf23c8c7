"""stages/compression/select.py: method select loads its own early layers, or a scorer
model beside the generator, and prefills only the kept sentences within the budget."""

from __future__ import annotations

import pytest
import torch

from schemas.loading import spec_from_dict
from stages.compression import method_for
from stages.compression.select import SelectMethod
from stages.prompting import PromptBuilder

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


def _job(model_dir, **compression):
    return spec_from_dict({"name": "s", "input": {"uri": "/unused"}, "task": {"kind": "summarize"},
                           "compression": {"method": "select", **compression},
                           "generation": {"model": str(model_dir)}})


@pytest.mark.parametrize("scorer", [False, True])
def test_select_prefills_whole_sentences_within_the_budget(tiny_model_dir, tokenizer, scorer) -> None:
    settings = {"target_tokens": 40, "chunk_tokens": 32}
    if scorer:  # another model reads (here: the same tiny one, loaded again by path)
        settings["scorer"] = str(tiny_model_dir)
    job = _job(tiny_model_dir, **settings)
    method = method_for(job.compression)
    assert isinstance(method, SelectMethod) and method.reads_once_per_document(job)
    assert method.prefill_group_rows(job) == (16 if scorer else None)
    loaded = method.load(job, CPU)
    doc = PromptBuilder(tokenizer).encode_text("The river Elbe rises in the mountains. It flows north. " * 8)
    parts = PromptBuilder(tokenizer).build(doc, "Summarize.", None)
    out = loaded.prefill([parts])
    assert len(doc) > 40 and 0 < out.context_tokens[0] <= 40
    assert out.kept_positions is not None and len(out.kept_positions[0]) == out.context_tokens[0]
    assert torch.isfinite(out.state.last_logits).all()
