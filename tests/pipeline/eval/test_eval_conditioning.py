"""The eval's conditioning: a method's own ``ConditionsContinuations`` or the default."""

from __future__ import annotations

import pytest
import torch

from pipeline.eval.conditioning import condition_for, text_context
from schemas.loading import spec_from_dict
from stages.compression import registry
from stages.compression.base import CompressionMethod
from stages.compression.lm_scoring import ConditionsContinuations


def test_only_methods_that_need_it_implement_the_eval_interface():
    own = {name for name, m in registry().items() if isinstance(m, ConditionsContinuations)}
    assert own == {"finch", "select"}  # its query sits in its cache (select: finch's reading)
    assert not hasattr(CompressionMethod, "scoring_condition")  # not part of the runtime contract


def _job(model_dir, compression):
    return spec_from_dict({"name": "c", "input": {"uri": "/unused"}, "task": {"kind": "qa", "questions": ["q"]},
                           "compression": compression, "generation": {"model": str(model_dir)}})


@pytest.mark.parametrize("compression,kept", [
    ({"method": "none"}, list(range(3, 40))),
    ({"method": "truncate", "target_tokens": 10, "keep": "head"}, list(range(3, 13))),
])  # fmt: skip
def test_default_condition_is_text_compression_then_prefill(tiny_model_dir, compression, kept):
    from stages.decoding.state import prefill_full

    job = _job(tiny_model_dir, compression)
    method = registry()[compression["method"]]
    earlier = list(range(3, 40))
    assert text_context(method, job)(earlier, "q") == kept
    loaded, condition = condition_for(method, job, torch.device("cpu"))
    got = condition([1], earlier, 4)
    assert got.context_tokens == [len(kept)]
    want = prefill_full(loaded.model, [[1] + kept], loaded.tokenizer.pad_token_id)
    torch.testing.assert_close(got.state.last_logits, want.last_logits)
