"""Whole sentences around Finch's selection (keep: sentences)."""

from __future__ import annotations

import pytest

from stages.finch.spans import boundary_token_ids, sentence_spans, snap_to_sentences

DOT, NL = 1, 2  # sentence-ending ids in these examples


def test_sentence_spans_tile_the_document():
    ids = [5, 6, DOT, 7, NL, 8, 9]
    assert sentence_spans(ids, frozenset({DOT, NL})) == [(0, 3), (3, 5), (5, 7)]
    assert sentence_spans([DOT], frozenset({DOT})) == [(0, 1)]
    assert sentence_spans([], frozenset({DOT})) == []


def test_the_answer_after_the_cue_is_kept_with_it():
    # Sentences: [0, 10) the cue + answer, [10, 20) and [20, 30) filler.
    spans = [(0, 10), (10, 20), (20, 30)]
    kept = [0, 1, 2, 3, 4, 12, 25]  # the heads chose the cue's words, not the answer (5..9)
    out = snap_to_sentences(kept, spans, budget=7)
    assert out == [0, 1, 2, 3, 4, 12, 25]  # no whole sentence fits 7: the heads' own picks
    out = snap_to_sentences(kept, spans, budget=12)
    assert out[:10] == list(range(10)) and len(out) == 12  # the whole first sentence, answer included
    assert out[10:] == [12, 25]  # then the remaining picks, in document order


def test_exact_budget_and_order():
    spans = [(0, 4), (4, 9), (9, 30)]
    kept = [1, 5, 6, 7, 20]
    for budget in (1, 5, 9, 12, 30, 40):
        out = snap_to_sentences(kept, spans, budget)
        assert len(out) == min(budget, 30) and out == sorted(set(out))
    # Density first: 3 of 5 tokens of (4, 9) beats 1 of 4 of (0, 4) and 1 of 21.
    assert snap_to_sentences(kept, spans, 5) == [4, 5, 6, 7, 8]


def test_boundary_ids_of_the_embedded_tokenizer(tokenizer):
    ids = boundary_token_ids(tokenizer)
    enc = tokenizer("First sentence. Second one!\nThird?", add_special_tokens=False)["input_ids"]
    spans = sentence_spans(enc, ids)
    texts = [tokenizer.decode(enc[a:b]) for a, b in spans]
    assert texts == ["First sentence.", " Second one!", "\n", "Third?"]
    assert not any(tokenizer.decode([i]).strip().isalpha() for i in list(ids)[:50])


def test_keep_sentences_needs_early_exit():
    from stages.compression.finch import FinchCompression

    with pytest.raises(ValueError, match="keep sentences needs mode early_exit"):
        FinchCompression(keep="sentences", mode="kv")
    assert FinchCompression(keep="sentences").mode == "early_exit"
