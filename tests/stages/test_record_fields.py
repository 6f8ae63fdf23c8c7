"""stages/record_fields.py: what a record's id, questions and answers must be."""

from __future__ import annotations

import pytest

from schemas.spec import InputSpec
from stages.record_fields import given_answers, id_problem, pairing_problem, questions_and_answers

QA = InputSpec(uri="docs.jsonl", format="jsonl", question_field="q", answer_field="a")


@pytest.mark.parametrize("raw, present, problem", [
    ("d1", True, None), (7, True, None), (0, True, None),
    (None, False, "is missing"), (None, True, "is null"),
    (True, True, "is true, a boolean; fix: ids are strings or numbers"),
    ({"x": 1}, True, "is not a string or a number"), (["a"], True, "is not a string or a number"),
    ("  ", True, "is empty"),
])
def test_an_id_is_a_non_empty_string_or_number(raw, present, problem):
    assert id_problem(raw, present) == problem


def test_answers_pair_with_questions_by_position():
    assert given_answers(["Who?", "When?"], ["Ada", "1843"]) == ["Ada", "1843"]
    # One question not in a list: a list of answers is its acceptable answers.
    assert given_answers("Who?", ["Ada", "Ada Lovelace"]) == [["Ada", "Ada Lovelace"]]
    assert given_answers(["Who?"], None) == []
    assert pairing_problem({"q": ["Who?", "When?"], "a": ["Ada", None]}, QA) is None
    assert pairing_problem({"q": ["Who?"]}, QA) is None  # no answers: nothing to pair
    counted = pairing_problem({"q": ["Who?", "When?", "Where?"], "a": "Ada; 1843"}, QA)
    assert counted is not None and counted.startswith("field 'a' has 1 answer(s) for 3 question(s) in 'q'; fix:")
    nested = pairing_problem({"q": ["Who?"], "a": [[["Ada"]]]}, QA)
    assert nested is not None and "answer 1 of field 'a' is a list inside a list of acceptable answers" in nested
    obj = pairing_problem({"q": ["Who?"], "a": [{"text": "Ada"}]}, QA)
    assert obj is not None and "is an object" in obj and "fix: an answer is a string" in obj


def test_questions_are_non_empty_strings_asked_once():
    questions, answers, problem = questions_and_answers({"q": ["Who?", "Who?", "When?"], "a": ["Ada", "Ada", 1843]}, QA)
    assert (questions, answers, problem) == (["Who?", "When?"], ["Ada", "1843"], None)  # an exact repeat dropped
    _, _, problem = questions_and_answers({"q": ["Who?", "Who?"], "a": ["Ada", "Bob"]}, QA)
    assert problem is not None and "repeats question 1 ('Who?') with another answer" in problem
    _, _, problem = questions_and_answers({"q": ["", None, 3]}, QA)
    assert problem is not None and "question 1 of field 'q' is empty" in problem
    assert "question 2 of field 'q' is null" in problem and "question 3 of field 'q' is not a string (3)" in problem
    questions, answers, problem = questions_and_answers({"q": ["Who?"], "a": ["x", "y"]}, QA)
    assert questions == ["Who?"] and answers == [] and problem is not None  # unpaired answers score nothing


def test_a_question_problem_comes_before_the_answers_miscount_it_causes():
    """{"questions": 42, "answers": [3 answers]} led with "field 'a' has 3 answer(s) for 1
    question(s)": `longdoc report --dates` cuts the message, and showed only that."""
    # No question to pair with: the field's shape is the problem (`validate` refuses it by it).
    assert pairing_problem({"q": 42, "a": ["x", "y", "z"]}, QA).startswith("field 'q' is not a string or a list (42)")
    questions, answers, problem = questions_and_answers({"q": 42, "a": ["x", "y", "z"]}, QA)
    assert (questions, answers) == ([], [])
    assert problem == "field 'q' is not a string or a list (42); fix: a question is a non-empty string, several a list of them"
    _, _, problem = questions_and_answers({"q": {"text": "Who?"}}, QA)
    assert problem is not None and problem.startswith("field 'q' is not a string or a list ({\"text\": \"Who?\"})")
    _, _, problem = questions_and_answers({"q": ["Who?", 7], "a": ["x", "y", "z"]}, QA)
    assert problem is not None and problem.startswith("question 2 of field 'q' is not a string (7); fix:")
    assert "; field 'a' has 3 answer(s) for 2 question(s) in 'q'" in problem
