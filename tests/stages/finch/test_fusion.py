"""Fused sentence evidence (evidence: fused): the heads' scores and the embedder's similarity."""

from __future__ import annotations

import pytest
import torch
from finch_testlib import heads_config

from schemas.spec import EMBEDDED_EMBEDDER
from stages.decoding.state import prefill_full
from stages.embedding import load_embedder
from stages.finch.fusion import (
    choose_sentences,
    fuse,
    head_evidence,
    make_similarity,
    paragraph_follows,
    sentence_cosines,
    similarity_evidence,
)
from stages.finch.heads import HeadSet, all_heads
from stages.finch.prefill import finch_prefill
from stages.finch.spans import sentence_boundaries, sentence_spans
from stages.prompting import PromptBuilder

FILLER = [
    "The committee met in the old library to review the archive.",
    "Members read reports about roads, bridges and the harbour.",
    "They agreed to meet again after the summer break.",
    "The minutes were typed on a borrowed machine.",
    "Several members asked for shorter meetings next year.",
    "The treasurer presented the accounts without comment.",
]
FACT = "Every new hire at the Lagos branch is handed a copper kettle on the first morning."
QUESTION = "What gift do people joining the Lagos team receive?"


@pytest.fixture(scope="module")
def embedder():
    return load_embedder(EMBEDDED_EMBEDDER, "cpu", batch_size=16)


class CountingEmbedder:
    """The real embedder, counting the texts it embeds."""

    def __init__(self, inner) -> None:
        self.inner, self.chunks, self.max_tokens = inner, 0, inner.max_tokens

    def count_tokens(self, texts):
        return self.inner.count_tokens(texts)

    def embed_queries(self, texts):
        return self.inner.embed_queries(texts)

    def embed_chunks(self, texts):
        self.chunks += len(texts)
        return self.inner.embed_chunks(texts)


def test_head_evidence_is_the_best_kept_token_per_sentence():
    spans = [(0, 4), (4, 9), (9, 12)]
    assert head_evidence(spans, {1: 0.2, 2: 0.4, 5: 0.8}) == [0.5, 1.0, 0.0]
    assert head_evidence(spans, {}) == [0.0, 0.0, 0.0]
    assert head_evidence(spans, {1: -0.4, 5: 0.8}) == [0.0, 1.0, 0.0]  # in [0, 1]: below 0 is 0


def test_similarity_is_relative_to_the_documents_median_and_best():
    cos = torch.tensor([0.1, 0.2, 0.3, 0.7, 0.9])
    rel = similarity_evidence(cos, [True, True, True, True, False])  # the blank one scores 0
    assert rel == pytest.approx([0.0, 0.0, 0.2, 1.0, 0.0], abs=1e-6)  # median 0.2 (lower of the two middles)
    assert similarity_evidence(torch.full((3,), 0.4), [True] * 3) == [0.0, 0.0, 0.0]
    assert similarity_evidence(torch.zeros(2), [False, False]) == [0.0, 0.0]
    with pytest.raises(ValueError, match="cosines for"):
        similarity_evidence(torch.zeros(2), [True])


def test_fuse_weights_and_checks():
    assert fuse([1.0, 0.0], [0.0, 1.0], 0.25) == [0.75, 0.25]
    with pytest.raises(ValueError, match="weight"):
        fuse([1.0], [1.0], 1.5)
    with pytest.raises(ValueError, match="head scores for"):
        fuse([1.0], [1.0, 0.0], 0.5)


def test_choose_sentences_floor_budget_and_order():
    spans = [(0, 5), (5, 8), (8, 20), (20, 24)]
    fused = [0.2, 0.9, 1.0, 0.6]
    # Floor 0.5: sentences 2, 1, 3 qualify; 2 (12 tokens) then 1 (3) fit 16, 3 (4) does not.
    assert choose_sentences(spans, fused, 16, 0.5, "relevance") == [*range(5, 8), *range(8, 20)]
    assert choose_sentences(spans, fused, 16, 0.5, "document") == list(range(5, 20))
    # No floor, a budget the best sentence overflows: it is skipped, the next ones that fit
    # go in (1, then 3; 0 no longer fits), least relevant first.
    assert choose_sentences(spans, fused, 9, 0.0, "relevance") == [*range(20, 24), *range(5, 8)]
    assert choose_sentences(spans, fused, 2, 0.5, "relevance") == [8, 9]  # nothing fits: the best's head
    assert choose_sentences([], [], 10, 0.5, "relevance") == []
    # Sentences that fill the budget exactly are all taken.
    assert choose_sentences(spans, fused, 15, 0.5, "document") == list(range(5, 20))


def test_a_chosen_sentence_brings_the_next_one_of_its_paragraph():
    spans = [(0, 5), (5, 8), (8, 20), (20, 24)]
    fused = [0.2, 1.0, 0.1, 0.6]
    follows = [False, False, True, True]  # 2 goes on 1's paragraph, 3 on 2's
    # 1 brings 2 (its paragraph); 3 is next by rank and fits; 2 is not taken twice.
    assert choose_sentences(spans, fused, 24, 0.5, "relevance", follows) == [
        *range(20, 24), *range(5, 8), *range(8, 20)]  # fmt: skip
    assert choose_sentences(spans, fused, 24, 0.5, "document", follows) == list(range(5, 24))
    # No room for the next one: the chosen sentence alone.
    assert choose_sentences(spans, fused, 6, 0.5, "relevance", follows) == list(range(5, 8))
    assert choose_sentences(spans, fused, 24, 0.5, "relevance", [False] * 4) == [*range(20, 24), *range(5, 8)]
    # A sentence taken already (here with the one it brought) is not brought again.
    assert choose_sentences(spans, [0.2, 0.6, 1.0, 0.1], 40, 0.5, "relevance", follows) == list(range(5, 24))


def test_paragraph_follows_reads_blank_lines():
    assert paragraph_follows(["A b.", " C d.", "\n\nE f.", "\nG.", "\n", "\nH."]) == [
        False, True, False, True, False, False]  # fmt: skip


def test_sentence_cosines_find_the_paraphrased_fact_and_embed_a_document_once(tokenizer, embedder):
    builder = PromptBuilder(tokenizer)
    doc = builder.encode_text(" ".join(FILLER[:3]) + "\n\n" + FACT + "\n\n" + " ".join(FILLER[3:]))
    spans = sentence_spans(doc, sentence_boundaries(tokenizer), join_lines=True)
    counting = CountingEmbedder(embedder)
    view, view2 = sentence_cosines(counting, tokenizer, [doc, doc], [spans, spans],
                                   [QUESTION, "When do the members meet again?"])
    texts = [tokenizer.decode(doc[s:e]).strip() for s, e in spans]
    assert texts[int(view.cosine.argmax())] == FACT
    assert "meet again" in texts[int(view2.cosine.argmax())]
    assert view.content == [bool(t) for t in texts] and counting.chunks == sum(view.content)  # embedded once
    # FILLER[1] goes on FILLER[0]'s paragraph; the fact starts its own.
    assert view.follows[texts.index(FILLER[1])] and not view.follows[texts.index(FACT)]


def _fact_prompt(builder: PromptBuilder, filler_first: int):
    text = " ".join(FILLER * 2)[: 40 * filler_first] + "\n\n" + FACT + "\n\n" + " ".join(FILLER * 3)
    return builder.build(builder.encode_text(text), "Answer the question using the document.", QUESTION)


def test_finch_prefill_reads_the_sentence_the_embedder_finds(tokenizer, tiny_model, embedder):
    """Weight 1: the paraphrased fact is read, last (relevance order), whatever the random
    heads scored; the state is a plain prefill of that text. Rows batched = rows alone."""
    builder = PromptBuilder(tokenizer)
    parts = [_fact_prompt(builder, 2), _fact_prompt(builder, 7)]
    bounds = sentence_boundaries(tokenizer)
    similarity = make_similarity(embedder, tokenizer)
    cfg = heads_config(target_tokens=48, chunk_tokens=32, keep="sentences", order="relevance",
                           min_relevance=0.5, evidence="fused", similarity_weight=1.0, sentence_split="prose")
    heads = HeadSet("tiny", "-", all_heads(tiny_model))
    out = finch_prefill(tiny_model, parts, cfg, tokenizer.pad_token_id, heads=heads, boundaries=bounds,
                        similarity=similarity)
    prompts = []
    for p, n in zip(parts, out.context_tokens, strict=True):
        spans = sentence_spans(p.context_ids, bounds, join_lines=True)
        texts = [tokenizer.decode(p.context_ids[s:e]).strip() for s, e in spans]
        (view,) = similarity([p], [spans])
        read = choose_sentences(spans, similarity_evidence(view.cosine, view.content), 48, 0.5, "relevance")
        s, e = spans[texts.index(FACT)]
        assert read[-(e - s):] == list(range(s, e)) and n == len(read) <= 48  # the fact, next to the question
        prompts.append(p.prefix_ids + [p.context_ids[j] for j in read] + p.query_ids)
    full = prefill_full(tiny_model, prompts, tokenizer.pad_token_id)
    torch.testing.assert_close(out.state.last_logits, full.last_logits)
    for row, p in enumerate(parts):
        alone = finch_prefill(tiny_model, [p], cfg, tokenizer.pad_token_id, heads=heads, boundaries=bounds,
                              similarity=similarity)
        assert alone.context_tokens == [out.context_tokens[row]]
        torch.testing.assert_close(alone.state.last_logits[0], out.state.last_logits[row])


SUBJECT = "The Oslo office bought a small sailing boat in May."
ANSWER = "Everyone there calls her the Silver Gull."
BOAT_QUESTION = "What name did the Oslo office give the sailing boat it bought in May?"


def test_the_qa_default_reads_the_sentence_after_the_one_it_chooses(tokenizer, tiny_model, embedder):
    """The subject's sentence is chosen; its answer is the next sentence of the paragraph.
    The qa defaults (next_sentence on, chosen on the tuning part) read both, in a state equal
    to a plain prefill of that text; with next_sentence off the answer is not read."""
    builder = PromptBuilder(tokenizer)
    text = " ".join(FILLER[:3]) + "\n\n" + SUBJECT + " " + ANSWER + "\n\n" + " ".join(FILLER[3:] * 2)
    parts = builder.build(builder.encode_text(text), "Answer the question using the document.", BOAT_QUESTION)
    bounds = sentence_boundaries(tokenizer)
    similarity = make_similarity(embedder, tokenizer)
    heads = HeadSet("tiny", "-", all_heads(tiny_model))
    spans = sentence_spans(parts.context_ids, bounds, join_lines=True)
    texts = [tokenizer.decode(parts.context_ids[s:e]).strip() for s, e in spans]
    (view,) = similarity([parts], [spans])
    evidence = similarity_evidence(view.cosine, view.content)
    answer_ids = set(range(*spans[texts.index(ANSWER)]))

    default = heads_config(target_tokens=48, chunk_tokens=32, similarity_weight=1.0).resolved("qa")
    assert default.next_sentence and default.evidence == "fused" and default.min_relevance == 0.5
    for cfg in (default, default.model_copy(update={"next_sentence": False})):
        read = choose_sentences(spans, evidence, 48, 0.5, "relevance", view.follows if cfg.next_sentence else None)
        assert set(range(*spans[texts.index(SUBJECT)])) <= set(read)
        assert (answer_ids <= set(read)) is cfg.next_sentence
        out = finch_prefill(tiny_model, [parts], cfg, tokenizer.pad_token_id, heads=heads, boundaries=bounds,
                            similarity=similarity)
        assert out.context_tokens == [len(read)]
        full = prefill_full(tiny_model, [parts.prefix_ids + [parts.context_ids[j] for j in read] + parts.query_ids],
                            tokenizer.pad_token_id)
        torch.testing.assert_close(out.state.last_logits, full.last_logits)


def test_fused_settings_are_checked_and_resolved():
    with pytest.raises(ValueError, match="evidence fused scores whole sentences"):
        heads_config(evidence="fused", mode="kv")
    with pytest.raises(ValueError, match="evidence fused scores whole sentences"):
        heads_config(evidence="fused", keep="tokens")
    with pytest.raises(ValueError, match="similarity_weight"):
        heads_config(similarity_weight=1.5)
    assert heads_config().resolved("qa").evidence == "fused"
    assert heads_config().resolved("summarize").evidence == "heads"
    assert heads_config(mode="kv").resolved("qa").evidence == "heads"
    with pytest.raises(ValueError, match="needs a question-sentence similarity"):
        finch_prefill(None, [], heads_config(evidence="fused", keep="sentences"), 0, boundaries=object())
