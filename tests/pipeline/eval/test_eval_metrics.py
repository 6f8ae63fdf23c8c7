"""SQuAD-style answer metrics: normalisation, exact match, whole-word contains, F1."""

from __future__ import annotations

import pytest

from pipeline.eval.metrics import contains, exact_match, normalize_answer, score, token_f1


def test_normalize_answer_follows_squad_rules() -> None:
    assert normalize_answer("  The KESTREL-7, an   Owl! ") == "kestrel7 owl"
    assert normalize_answer("A theory") == "theory"  # only whole-word articles go


def test_exact_match() -> None:
    assert exact_match("The Glacierworks.", "glacierworks") == 1.0
    assert exact_match("Glacierworks Ltd", "Glacierworks") == 0.0
    assert exact_match("8041", ["1234", "8041"]) == 1.0  # best over references


def test_contains_is_whole_word() -> None:
    assert contains("It is every 17 minutes, they say.", "every 17 minutes") == 1.0
    assert contains("The code is 80412.", "8041") == 0.0
    assert contains("minutes every 17", "every 17 minutes") == 0.0  # order matters
    assert contains("The", "the") == 1.0  # reference normalising to nothing: equality
    assert contains("An answer", "the") == 0.0


def test_token_f1_values() -> None:
    assert token_f1("brass telescope", "brass telescope") == 1.0
    # pred: {the, brass, one} -> {brass, one}; ref: {brass, telescope}: p=1/2, r=1/2
    assert token_f1("the brass one", "brass telescope") == pytest.approx(0.5)
    # pred 4 tokens, 2 shared; ref 2 tokens: p=0.5, r=1 -> 2/3
    assert token_f1("amber lantern in hall", "amber lantern") == pytest.approx(2 / 3)
    assert token_f1("nothing shared", "amber lantern") == 0.0
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0


def test_missing_prediction_scores_zero_and_references_are_required() -> None:
    assert score(None, "x") == {"exact_match": 0.0, "contains": 0.0, "f1": 0.0}
    with pytest.raises(ValueError, match="reference"):
        exact_match("x", [])


def test_normalizing_keeps_decimal_points_and_reads_unicode_as_a_reader_would() -> None:
    """A held-out set's answers: '155 metres' is not '15.5 metres'; a zero-width space, a
    decomposed umlaut or full-width digits do not make a right answer wrong."""
    assert contains("It was 155 metres", "15.5 metres") == 0.0
    assert contains("It was 15.5 metres.", "15.5 metres") == 1.0
    assert contains("1214 people", "1,214") == 1.0  # a thousands separator still goes
    assert contains("The code is ZEB\u200bRA-42.", "ZEBRA-42") == 1.0
    assert contains("die na\u0308chste Sitzung", "nächste Sitzung") == 1.0
    assert contains("\uff11\uff18\uff17\uff15", "1875") == 1.0
    assert contains("«Paris», sagte er.", "Paris") == 1.0
