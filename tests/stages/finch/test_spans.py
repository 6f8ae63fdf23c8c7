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


def test_a_wrapped_line_joins_prose_but_not_a_line_that_is_a_break_itself():
    """join_lines: a single newline before a token that breaks again (a line that is only
    ":\n", say: no whitespace first) ends its sentence; before prose it joins."""
    colon_nl = 4  # a break that does not open with whitespace
    b = Boundaries(breaks=frozenset({NL, colon_nl}), ends=frozenset({DOT}), opens=frozenset({SPACED}),
                   newlines=frozenset({NL}))
    assert sentence_spans([5, NL, 6, DOT], b, join_lines=True) == [(0, 4)]  # wrapped prose
    assert sentence_spans([5, NL, colon_nl, 6], b, join_lines=True) == [(0, 2), (2, 3), (3, 4)]


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
    # The share, not the count: 2 of 2 tokens of (0, 2) go before 3 of 10 of (2, 12).
    assert snap_to_sentences([0, 1, 2, 3, 4], [(0, 2), (2, 12)], 10) == list(range(10))


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


def _sentences(tokenizer, text: str) -> list[str]:
    b = sentence_boundaries(tokenizer)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [tokenizer.decode(ids[a:e]) for a, e in sentence_spans(ids, b)]


def test_cjk_marks_end_sentences_without_a_space_after_them(tokenizer):
    """A Chinese document was one "sentence", so select kept its first 512 tokens: the
    full-width marks a byte-level tokenizer splits across tokens end sentences too."""
    assert _sentences(tokenizer, "公司成立于一九九八年。总部位于上海！是吗？好的") == [
        "公司成立于一九九八年。", "总部位于上海！", "是吗？", "好的"]
    assert _sentences(tokenizer, "東京の桜は四月に咲きます。新製品は来年です。") == [
        "東京の桜は四月に咲きます。", "新製品は来年です。"]


def test_abbreviations_dates_initials_and_enumerators_do_not_end_sentences(tokenizer):
    text = ("Die Sitzung wurde von Dr. med. Anna Schäfer geleitet. Sie findet am 15. Feb. 2024 statt. "
            "Es gibt z. B. die Liste. Danach kam M. Dupont. Am 3. Oktober war es. He was born in 1999. "
            "Then he left.")
    assert _sentences(tokenizer, text) == [
        "Die Sitzung wurde von Dr. med. Anna Schäfer geleitet.", " Sie findet am 15. Feb. 2024 statt.",
        " Es gibt z. B. die Liste.", " Danach kam M. Dupont.", " Am 3. Oktober war es.",
        " He was born in 1999.", " Then he left."]
    # English sentences that end in a number or a one-letter name still end there; a list's
    # enumerator stays with its item; a full stop before a line break ends whatever precedes.
    text = "Porting to Python 3. It works.\n1. Build it.\n2. Run it. It is equal to x. It raises e.g.\nnext"
    assert _sentences(tokenizer, text) == [
        "Porting to Python 3.", " It works.", "\n", "1. Build it.", "\n", "2. Run it.", " It is equal to x.",
        " It raises e.g.", "\n", "next"]
    # An enumerator is one or two digits (or one letter): a longer number starting its line
    # is a year or a figure, and its full stop ends its sentence (spans.py's contract).
    assert _sentences(tokenizer, "Intro.\n12. Run it.\n123. Items were sold.") == [
        "Intro.", "\n", "12. Run it.", "\n", "123.", " Items were sold."]
    # A full stop followed by a word in lower case ends nothing ("Ann." is no abbreviation here).
    assert _sentences(tokenizer, "See the Ann. report for details. Then go.") == [
        "See the Ann. report for details.", " Then go."]


def test_no_sentence_grows_past_the_cap_and_no_cut_splits_a_character(tokenizer):
    from stages.finch.spans import MAX_SENTENCE

    b = sentence_boundaries(tokenizer)
    for text in ("so yeah we talked about the thing, and then he said " * 12, "数据中心位于北京市海淀区" * 40):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        spans = sentence_spans(ids, b)
        assert spans[0][0] == 0 and spans[-1][1] == len(ids)
        assert all(a == e0 for (_, e0), (a, _) in zip(spans, spans[1:], strict=False))  # they tile
        assert len(spans) > 1 and all(e - a <= MAX_SENTENCE for a, e in spans)
        pieces = [tokenizer.decode(ids[a:e]) for a, e in spans]
        assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    # The prose pieces end at a clause (after a comma) or before a word, never inside one.
    pieces = _sentences(tokenizer, "so yeah we talked about the thing, and then he said " * 12)
    assert all(p.endswith(",") or nxt.startswith(" ") for p, nxt in zip(pieces, pieces[1:], strict=False))
    # A comma in the second half of the piece is there every time: each cut is made after it.
    assert all(p.endswith(",") for p in pieces[:-1]), pieces
    # Without a clause's end, before the last word of the piece's second half: words of several
    # tokens each put the cap inside one.
    pieces = _sentences(tokenizer, "we talked about uncharacteristically extraordinary thingamajigs " * 20)
    assert len(pieces) > 1 and all(nxt.startswith(" ") for nxt in pieces[1:]), pieces
