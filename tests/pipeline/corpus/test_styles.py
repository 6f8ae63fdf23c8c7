"""The question-style rule: how much of its evidence a question repeats."""

from __future__ import annotations

import pytest

from pipeline.corpus.styles import (
    ECHOED_MIN,
    PARAPHRASED_MAX,
    content_words,
    echo_share,
    native_style,
    stem,
    style_of,
)


def test_content_words_drop_function_words_and_meet_by_stem():
    assert content_words("What fish did the conference dinner in Tallinn serve?") == {
        "fish", "conferenc", "dinner", "tallinn", "serv"}  # fmt: skip
    assert stem("served") == stem("serve") == "serv"
    assert stem("bus") == "bus"  # at least three letters stay


def test_echo_share_leaves_the_answer_out():
    sentence = "The conference dinner in Tallinn served smoked eel with rye bread."
    # cues: conference, dinner, tallinn, serv, rye, bread; the question has four of them
    assert echo_share("What fish did the conference dinner in Tallinn serve?", sentence, "smoked eel") == pytest.approx(4 / 6)
    assert echo_share("Which smoked eel?", "Smoked eel.", "smoked eel") == 0.0  # nothing but the answer


def test_styles_and_the_gap_between_them():
    fact = ["Every new hire at the Lagos branch is handed a copper kettle on the first morning."]
    assert style_of("What is every new hire at the Lagos branch handed on the first morning?",
                    fact, "copper kettle") == "echoed"
    assert style_of("What gift do people joining the Lagos team receive?", fact, "copper kettle") == "paraphrased"
    with pytest.raises(ValueError, match="between the paraphrased"):
        style_of("What is every new hire in Lagos given?", fact, "copper kettle")  # 3/8 shared
    assert PARAPHRASED_MAX < ECHOED_MIN


def test_two_sentence_needs_the_first_sentence():
    two = ["The Freiburg team needed a name for its new monitoring service.",
           "After a long vote, everyone agreed on HERONWATCH."]
    assert style_of("What name did the Freiburg team give its new monitoring service?", two, "HERONWATCH") == "two_sentence"
    with pytest.raises(ValueError, match="needs only that one"):
        style_of("What did everyone agree on after a long vote?", two, "HERONWATCH")
    with pytest.raises(ValueError, match="no evidence"):
        style_of("Why?", [], "x")


def test_native_questions_get_one_cut_off():
    ev = "The pydoc module can create HTML from the doc strings in your Python source code."
    assert native_style("Which module can create HTML from the doc strings in your Python source code?", ev, "pydoc") == "echoed"
    assert native_style("Which tool renders web pages from comments?", ev, "pydoc") == "paraphrased"
