"""Relevance order of early exit's kept text (Finch ``order: relevance``)."""

from __future__ import annotations

import pytest
import torch
from finch_testlib import heads_config, random_parts
from planted import HEAD, doc_with_marker, planted_model

from stages.compression.finch import AUTO_MIN_RELEVANCE
from stages.decoding.state import prefill_full
from stages.finch.heads import HeadSet
from stages.finch.order import kept_units, lay_out, order_by_relevance
from stages.finch.prefill import FinchStep, finch_prefill
from stages.finch.spans import Boundaries, sentence_spans, snap_to_sentences
from stages.prompting import PromptParts

PLANTED = HeadSet("planted", "-", ((0, HEAD),))


def test_units_are_runs_or_sentences():
    kept = [2, 3, 4, 9, 10, 15]
    assert kept_units(kept) == [[2, 3, 4], [9, 10], [15]]
    spans = [(0, 4), (4, 12), (12, 20)]  # 3 and 4 are consecutive but in two sentences
    assert kept_units(kept, spans) == [[2, 3], [4, 9, 10], [15]]
    assert kept_units([]) == []


def test_best_unit_last_ties_in_document_order_unscored_first():
    units = [[2, 3, 4], [9, 10], [15], [20]]
    score = {2: 0.1, 3: 0.9, 4: 0.2, 9: 0.5, 10: 0.4, 15: 0.5}  # 20 has no score
    assert order_by_relevance(units, score) == [20, 9, 10, 15, 2, 3, 4]
    # Every index appears once; each unit keeps its own order.
    assert sorted(order_by_relevance(units, score)) == sorted(j for u in units for j in u)


def _parts(n: int, at: int, seed: int) -> PromptParts:
    frame = random_parts([(5, 0, 9)], seed=seed)[0]
    return PromptParts(frame.prefix_ids, doc_with_marker(n, at, seed), frame.query_ids)


def test_relevance_order_puts_the_marker_window_next_to_the_question():
    """Same kept tokens as document order; the planted head's window ends the context,
    and the state is a plain prefill of prefix + reordered tokens + query."""
    model = planted_model()
    parts = [_parts(200, 40, seed=2), _parts(160, 120, seed=3)]
    base = heads_config(target_tokens=24, chunk_tokens=32)
    trace: list[FinchStep] = []
    doc_order = finch_prefill(model, parts, base, 0, trace=trace, heads=PLANTED)
    rel_cfg = base.model_copy(update={"order": "relevance"})
    rel = finch_prefill(model, parts, rel_cfg, 0, heads=PLANTED)
    assert rel.context_tokens == doc_order.context_tokens == [24, 24]
    step = trace[-1]
    prompts = []
    for row, at in enumerate([40, 120]):
        idx = step.kept_index[0][row, 0, -24:].tolist()
        score = dict(zip(idx, step.kept_score[row, -24:].tolist(), strict=True))
        assert max(score, key=score.get) in range(at - 3, at + 4)
        order = order_by_relevance(kept_units(idx), score)
        assert sorted(order) == idx and order != idx
        assert at in order[-7:]  # the marker's run is laid out last
        prompts.append(parts[row].prefix_ids + [parts[row].context_ids[j] for j in order] + parts[row].query_ids)
    full = prefill_full(model, prompts, 0)
    torch.testing.assert_close(rel.state.last_logits, full.last_logits)
    assert not torch.allclose(rel.state.last_logits, doc_order.state.last_logits)


def test_relevance_order_needs_early_exit():
    with pytest.raises(ValueError, match="order relevance needs mode early_exit"):
        heads_config(order="relevance", mode="kv")
    assert heads_config(order="relevance").mode == "early_exit"


def test_sentences_in_relevance_order_through_finch_prefill():
    """keep sentences + order relevance: the sentence holding the marker is kept whole
    and laid out last; the state is a plain prefill of exactly that layout."""
    model = planted_model()
    doc = doc_with_marker(200, 100, seed=4)
    for j in range(9, 200, 10):  # a sentence end every 10 tokens (ids 1..6 never occur)
        doc[j] = 3
    frame = random_parts([(5, 0, 9)], seed=4)[0]
    part = PromptParts(frame.prefix_ids, doc, frame.query_ids)
    bounds = Boundaries(breaks=frozenset({3}), ends=frozenset(), opens=frozenset())
    cfg = heads_config(target_tokens=30, chunk_tokens=32, keep="sentences", order="relevance")
    trace: list[FinchStep] = []
    out = finch_prefill(model, [part], cfg, 0, trace=trace, heads=PLANTED, boundaries=bounds)
    step = trace[-1]
    idx = step.kept_index[0][0, 0, -30:].tolist()
    score = dict(zip(idx, step.kept_score[0, -30:].tolist(), strict=True))
    spans = sentence_spans(doc, bounds)
    layout = order_by_relevance(kept_units(snap_to_sentences(idx, spans, 30, score), spans), score)
    assert len(layout) == 30 and layout[-10:] == list(range(100, 110))  # the marker's sentence
    full = prefill_full(model, [part.prefix_ids + [doc[j] for j in layout] + part.query_ids], 0)
    torch.testing.assert_close(out.state.last_logits, full.last_logits)


def test_auto_settings_resolve_by_mode_and_task():
    cfg = heads_config()
    assert (cfg.keep, cfg.order, cfg.min_relevance) == ("auto", "auto", "auto")
    assert cfg.relevance_floor == 0.0  # unresolved auto fills the budget
    qa, summary = cfg.resolved("qa"), cfg.resolved("summarize")
    assert (qa.keep, qa.order, qa.min_relevance) == ("sentences", "relevance", AUTO_MIN_RELEVANCE)
    # A summary keeps the story's order and the whole budget.
    assert (summary.keep, summary.order, summary.min_relevance) == ("sentences", "document", 0.0)
    kv = heads_config(mode="kv").resolved("qa")
    assert (kv.keep, kv.order, kv.min_relevance) == ("tokens", "document", 0.0)
    explicit = heads_config(keep="tokens", order="document", min_relevance=0.5).resolved("qa")
    assert (explicit.keep, explicit.order, explicit.min_relevance) == ("tokens", "document", 0.5)


def test_floor_drops_units_below_a_fraction_of_the_best():
    kept = [2, 3, 4, 9, 10, 15, 20]
    score = {2: 0.1, 3: 0.9, 4: 0.2, 9: 0.5, 10: 0.4, 15: 0.2}  # 20 has no score
    assert lay_out(kept, None, score, "document") == kept  # no floor: everything, in order
    assert lay_out(kept, None, score, "relevance") == [20, 15, 9, 10, 2, 3, 4]
    assert lay_out(kept, None, score, "document", 0.5) == [2, 3, 4, 9, 10]  # 0.5 >= 0.45
    assert lay_out(kept, None, score, "relevance", 0.5) == [9, 10, 2, 3, 4]
    assert lay_out(kept, None, score, "auto", 0.99) == [2, 3, 4]  # the best unit always stays
    spans = [(0, 4), (4, 12), (12, 21)]
    assert lay_out(kept, spans, score, "document", 0.3) == [2, 3, 4, 9, 10]  # sentence units
    assert lay_out(kept, None, {}, "document", 0.5) == kept  # nothing scored: nothing dropped
    assert lay_out([], None, score, "relevance", 0.5) == []


def test_floor_settings_are_checked():
    for bad in (1.0, -0.1, "high"):
        with pytest.raises(ValueError, match="min_relevance"):
            heads_config(min_relevance=bad)
    with pytest.raises(ValueError, match="min_relevance needs mode early_exit"):
        heads_config(mode="kv", min_relevance=0.3)
    assert heads_config(mode="kv", min_relevance=0).relevance_floor == 0.0


def test_floor_through_finch_prefill_reads_only_the_best_sentences():
    """A floor keeps the marker's sentence and drops the low-scored rest of the budget;
    the state is a plain prefill of exactly what lay_out returns."""
    model = planted_model()
    doc = doc_with_marker(200, 100, seed=4)
    for j in range(9, 200, 10):
        doc[j] = 3
    frame = random_parts([(5, 0, 9)], seed=4)[0]
    part = PromptParts(frame.prefix_ids, doc, frame.query_ids)
    bounds = Boundaries(breaks=frozenset({3}), ends=frozenset(), opens=frozenset())
    cfg = heads_config(target_tokens=30, chunk_tokens=32, keep="sentences", order="relevance",
                           min_relevance=0.5)
    trace: list[FinchStep] = []
    out = finch_prefill(model, [part], cfg, 0, trace=trace, heads=PLANTED, boundaries=bounds)
    idx = trace[-1].kept_index[0][0, 0, -30:].tolist()
    score = dict(zip(idx, trace[-1].kept_score[0, -30:].tolist(), strict=True))
    spans = sentence_spans(doc, bounds)
    layout = lay_out(snap_to_sentences(idx, spans, 30, score), spans, score, "relevance", 0.5)
    assert 10 <= len(layout) < 30 and layout[-10:] == list(range(100, 110))
    assert out.context_tokens == [len(layout)]
    full = prefill_full(model, [part.prefix_ids + [doc[j] for j in layout] + part.query_ids], 0)
    torch.testing.assert_close(out.state.last_logits, full.last_logits)


def test_a_document_within_the_budget_keeps_its_order_in_any_batch():
    """Relevance order reorders compressed text only: a short row batched with a long one
    reads exactly as it does alone (where no scoring pass runs at all)."""
    model = planted_model()
    short = _parts(20, 12, seed=3)
    doc = list(short.context_ids)
    for j in (4, 9, 14, 19):  # four sentences: the marker's is the third
        doc[j] = 3
    parts = [_parts(200, 40, seed=2), PromptParts(short.prefix_ids, doc, short.query_ids)]
    bounds = Boundaries(breaks=frozenset({3}), ends=frozenset(), opens=frozenset())
    cfg = heads_config(target_tokens=24, chunk_tokens=32, keep="sentences", order="relevance")
    batch = finch_prefill(model, parts, cfg, 0, heads=PLANTED, boundaries=bounds)
    alone = finch_prefill(model, [parts[1]], cfg, 0, heads=PLANTED, boundaries=bounds)
    assert batch.context_tokens[1] == alone.context_tokens[0] == 20
    torch.testing.assert_close(batch.state.last_logits[1], alone.state.last_logits[0])
