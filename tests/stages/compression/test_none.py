"""stages/compression/none.py: method ``none`` declares the whole document, prefilled as
is in the generate actor, and its prefill is the model's own forward pass over the prompt."""

from __future__ import annotations

import pytest
import torch

from schemas.compression import NoCompression
from schemas.loading import spec_from_dict
from stages.compression import registry
from stages.compression.none import NoneMethod
from stages.prompting import PromptParts
from stages.token_bytes import NO_EDGES

pytestmark = pytest.mark.usefixtures("one_thread")


def _job(model_dir, compression: dict):
    return spec_from_dict({"name": "n", "input": {"uri": "/unused"}, "task": {"kind": "summarize"},
                           "compression": compression, "generation": {"model": str(model_dir)}})


def test_none_is_the_first_method_a_full_prefill_of_the_document():
    method = registry()["none"]
    assert isinstance(method, NoneMethod) and next(iter(registry())) == "none"
    assert method.spec_model is NoCompression and method.runs_at == "prefill"
    assert method.needs == ("doc_ids",) and method.adds == ()
    assert not method.reads_any_length and not method.eval_budgeted and not method.needs_checkpoint


def test_prefill_is_the_models_forward_over_each_whole_prompt(tiny_model_dir):
    job = _job(tiny_model_dir, {"method": "none"})
    method = NoneMethod()
    loaded = method.load(job, torch.device("cpu"))
    assert loaded.full_prefill  # the engine prefills it itself, chunked into its slots
    parts = [PromptParts([1, 5, 6], list(range(10, 31)), [7, 8]), PromptParts([1], list(range(40, 46)), [9])]
    res = loaded.prefill(parts)
    assert res.context_tokens == [21, 6] and res.compress_s == [0.0, 0.0]
    for row, p in enumerate(parts):  # left padding changes nothing: each row as the model reads it alone
        with torch.inference_mode():
            alone = loaded.model(input_ids=torch.tensor([p.full_ids])).logits[0, -1].float()
        torch.testing.assert_close(res.state.last_logits[row], alone, atol=1e-4, rtol=1e-4)
    assert res.state.next_pos.tolist() == [26, 8]
    assert method.kv_tokens(job, parts[0]) is None  # the whole prompt
    assert method.expected_kv_tokens(job) == 2048


def test_another_methods_settings_and_tokenize_hooks_are_refused(tiny_model_dir):
    job = _job(tiny_model_dir, {"method": "truncate", "target_tokens": 8})
    with pytest.raises(ValueError, match="NoneMethod needs compression.method 'none', got 'truncate'"):
        NoneMethod().config(job)
    with pytest.raises(NotImplementedError, match="none runs at prefill, not in tokenize"):
        NoneMethod().compress_ids(NoCompression(), [1, 2, 3], NO_EDGES)
    with pytest.raises(NotImplementedError, match="not as a text stage"):
        NoneMethod().stage_class()
