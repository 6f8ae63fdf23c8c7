"""Whole sentences around Finch's selection (keep: sentences)."""

from __future__ import annotations

import pytest
from finch_testlib import heads_config

from stages.finch.spans import Boundaries, sentence_boundaries, sentence_spans, snap_to_sentences

DOT, NL, SPACED = 1, 2, 3  # a sentence end, a line break, a token opening with a space
B = Boundaries(breaks=frozenset({NL}), ends=frozenset({DOT}), opens=frozenset({SPACED, 8}))


def test_sentence_spans_tile_the_document():
    ids = [5, 6, DOT, SPACED, NL, 8, 9]
    assert sentence_spans(ids, B) == [(0, 3), (3, 5), (5, 7)]
    assert sentence_spans([DOT], B) == [(0, 1)]
    assert sentence_spans([], B) == []
    # An end token followed by a token that does not open with a space ("3.1") ends
    # nothing; followed by a break it does.
    assert sentence_spans([5, DOT, 6, 7, DOT, NL, 5], B) == [(0, 5), (5, 6), (6, 7)]


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


def test_scores_rank_sentences_by_their_best_token():
    spans = [(0, 4), (4, 9), (9, 30)]
    kept = [1, 5, 6, 7, 20]
    score = {1: 0.9, 5: 0.2, 6: 0.3, 7: 0.1, 20: 0.5}
    # (0, 4) holds the best token: it goes first although (4, 9) is denser; the rest of
    # the budget takes the best remaining picks (20, then 6).
    assert snap_to_sentences(kept, spans, 6, score) == [0, 1, 2, 3, 6, 20]
    assert snap_to_sentences(kept, spans, 9, score) == list(range(9))
    for budget in (1, 5, 9, 12, 30, 40):
        out = snap_to_sentences(kept, spans, budget, score)
        assert len(out) == min(budget, 30) and out == sorted(set(out))


def test_boundaries_of_the_embedded_tokenizer(tokenizer):
    b = sentence_boundaries(tokenizer)
    text = "First sentence. Python 3.1 was released on June 27, 2009.\nThird?"
    enc = tokenizer(text, add_special_tokens=False)["input_ids"]
    texts = [tokenizer.decode(enc[a:e]) for a, e in sentence_spans(enc, b)]
    assert texts == ["First sentence.", " Python 3.1 was released on June 27, 2009.", "\n", "Third?"]
    assert not any(tokenizer.decode([i]).strip().isalpha() for i in list(b.ends)[:50])
    assert all("\n" in tokenizer.decode([i]) for i in list(b.breaks)[:50])


def test_keep_sentences_in_mode_kv_needs_one_shared_heads_selection():

    assert heads_config(keep="sentences").mode == "early_exit"
    assert heads_config(keep="sentences", mode="kv").keep == "sentences"
    with pytest.raises(ValueError, match="keep sentences in mode kv.*selection per_layer"):
        heads_config(keep="sentences", mode="kv", selection="per_layer")


def test_sentence_index_numbers_each_rows_sentences_and_pads_with_zero():
    from stages.finch.spans import Boundaries, sentence_index
    from stages.prompting import PromptParts

    bounds = Boundaries(breaks=frozenset({3}), ends=frozenset(), opens=frozenset())
    parts = [PromptParts([], [5, 3, 6, 6, 3, 7], []), PromptParts([], [8, 8, 3], [])]
    idx = sentence_index(parts, bounds, join_lines=False, device="cpu")
    assert idx.tolist() == [[0, 0, 1, 1, 1, 2], [0, 0, 0, 0, 0, 0]]
