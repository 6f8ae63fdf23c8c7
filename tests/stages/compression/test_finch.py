"""stages/compression/finch.py: Finch's settings (``auto`` resolved per task, combinations
that cannot run refused with the allowed value), its prefill strategy as the generate
actor loads it, and its own LM-scoring conditioning (the query last, inside the budget)."""

from __future__ import annotations

import pytest
import torch

from schemas.loading import spec_from_dict
from stages.compression.finch import FinchMethod, prompt_similarity
from stages.decoding.state import prefill_full
from stages.finch.config import (
    AUTO_MIN_RELEVANCE,
    AUTO_MIN_RELEVANCE_CHUNK,
    FinchCompression,
    SelectCompression,
)
from stages.prompting import PromptParts

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


def _job(model_dir, kind: str, **compression):
    task = {"kind": "qa", "questions": ["Which river?"]} if kind == "qa" else {"kind": "summarize"}
    return spec_from_dict({"name": "f", "input": {"uri": "/unused"}, "task": task,
                           "compression": {"method": "finch", **compression}, "generation": {"model": str(model_dir)}})


def test_finch_defaults_are_the_paper_and_select_names_the_selection():
    """Names are claims: finch's defaults are the paper's frame; select is the selection."""
    f = FinchCompression()
    assert (f.mode, f.scoring, f.reading) == ("kv", "paper", "kept")
    s = SelectCompression()
    assert (s.mode, s.scoring, s.reading, s.scorer) == ("early_exit", "heads", "chunk", None)
    with pytest.raises(ValueError, match="select reads through the selecting heads.*use method finch"):
        SelectCompression(mode="kv")


@pytest.mark.parametrize(
    ("settings", "kind", "want"),
    [
        ({"method": "select"}, "qa", ("sentences", "relevance", AUTO_MIN_RELEVANCE_CHUNK, "fused")),
        ({"method": "select", "reading": "kept"}, "qa", ("sentences", "relevance", AUTO_MIN_RELEVANCE, "fused")),
        ({"method": "select"}, "summarize", ("sentences", "document", 0.0, "heads")),
        ({}, "qa", ("tokens", "document", 0.0, "heads")),  # finch: the paper's frame
        ({"mode": "kv", "scoring": "heads"}, "qa", ("tokens", "document", 0.0, "heads")),
        ({"method": "select", "keep": "tokens"}, "qa", ("tokens", "relevance", AUTO_MIN_RELEVANCE_CHUNK, "heads")),
        ({"method": "select", "min_relevance": 0.2, "order": "document", "evidence": "heads"}, "qa",
         ("sentences", "document", 0.2, "heads")),
        # finch's whole sentences in mode kv may take a floor; auto stays the paper's exact budget
        ({"scoring": "heads", "keep": "sentences"}, "qa", ("sentences", "document", 0.0, "heads")),
        ({"scoring": "heads", "keep": "sentences", "min_relevance": 0.5}, "qa",
         ("sentences", "document", 0.5, "heads")),
    ],
)
def test_auto_settings_resolve_per_task(settings, kind, want):
    settings = dict(settings)
    model = SelectCompression if settings.pop("method", "finch") == "select" else FinchCompression
    cfg = model(**settings)
    r = cfg.resolved(kind)
    assert (r.keep, r.order, r.min_relevance, r.evidence) == want
    assert r.relevance_floor == want[2]
    assert cfg.relevance_floor == (0.0 if "min_relevance" not in settings else settings["min_relevance"])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"scoring": "paper", "mode": "early_exit"},
         "mode early_exit keeps one token selection.*got scoring paper.*set mode: kv"),
        ({"head_mode": "kv_group", "scoring": "heads", "mode": "early_exit"}, "head_mode kv_group"),
        ({"mode": "kv", "order": "relevance"}, "order relevance needs mode early_exit.*allowed: order document"),
        ({"mode": "kv", "min_relevance": 0.3}, "min_relevance needs mode early_exit.*allowed: min_relevance 0"),
        ({"mode": "kv", "scoring": "heads", "keep": "tokens", "min_relevance": 0.3},
         "min_relevance needs mode early_exit, or keep sentences in mode kv.*keep tokens.*allowed: min_relevance 0"),
        ({"mode": "kv", "keep": "sentences"}, "keep sentences in mode kv.*got scoring paper.*allowed: keep tokens"),
        ({"mode": "kv", "keep": "sentences", "scoring": "heads", "head_mode": "kv_group"},
         "keep sentences in mode kv.*head_mode kv_group.*allowed: keep tokens"),
        ({"keep": "tokens", "evidence": "fused"}, "evidence fused scores whole sentences.*allowed: evidence heads"),
        ({"chunk_tokens": 8}, "chunk_tokens"),
        ({"min_relevance": 1.0}, "min_relevance"),
    ],
)
def test_settings_that_cannot_run_are_refused_with_the_allowed_value(settings, message):
    with pytest.raises(ValueError, match=message):
        FinchCompression(**settings)


def test_load_gives_a_chunked_prefill_within_the_budget(tiny_model_dir, tokenizer):
    job = _job(tiny_model_dir, "summarize", target_tokens=24, chunk_tokens=16)
    assert prompt_similarity(FinchCompression().resolved("summarize"), tokenizer, CPU) is None  # no embedder
    loaded = FinchMethod().load(job, CPU)
    assert not loaded.full_prefill
    doc = tokenizer("The river Elbe rises in the mountains. It flows north to the sea. " * 6,
                    add_special_tokens=False)["input_ids"]
    chunks: list[int] = []
    res = loaded.prefill([PromptParts([1, 5], doc, [7, 8, 9])], on_chunk=lambda: chunks.append(1))
    assert len(doc) > 24 and 0 < res.context_tokens[0] <= 24  # whole sentences up to the budget
    assert len(chunks) >= 2  # the document was read in passes, the engine called between them
    assert torch.isfinite(res.state.last_logits).all()


def test_scoring_condition_puts_the_query_last_inside_the_budget(tiny_model_dir):
    earlier = list(range(100, 180))
    loaded, condition = FinchMethod().scoring_condition(
        _job(tiny_model_dir, "qa", target_tokens=24, chunk_tokens=16, mode="kv"), CPU)
    got = condition([1], earlier, 4)
    assert got.context_tokens == [24]  # 20 entries kept of the document + the 4 query tokens
    assert int(got.state.valid[0].sum()) == 1 + 24
    for bad in (0, 24):
        with pytest.raises(ValueError, match=f"query_tokens {bad} must be >= 1 and below target_tokens 24"):
            condition([1], earlier, bad)
    # A budget that holds the whole earlier text gives the full-context state.
    loaded, condition = FinchMethod().scoring_condition(_job(tiny_model_dir, "qa", target_tokens=200), CPU)
    got = condition([1], earlier, 4)
    want = prefill_full(loaded.model, [[1, *earlier]], loaded.tokenizer.pad_token_id)
    assert got.context_tokens == [80]
    torch.testing.assert_close(got.state.last_logits, want.last_logits, atol=1e-4, rtol=1e-4)
