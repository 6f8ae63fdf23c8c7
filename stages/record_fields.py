"""What one input record's id, questions and answers must be: checks on a record's fields.

Contract (pure functions of a record, a dict as JSONL or a Parquet row gives it; no I/O):
- ``id_problem(raw_id, present)``: what makes an id unusable, in words, or None.
- ``questions_and_answers(rec, inp)``: the record's usable questions, their answers paired
  by position, and what is wrong with them (None when nothing is).
- ``pairing_problem(rec, inp)``: what is wrong with how the answers pair with the questions.
- ``given_answers(raw_q, raw_a)``: the answers as a list to pair with the questions.
Shared by the read stage (stages/read.py, each record's error row), `validate`'s preflight
(pipeline/preflight.py, a field of another shape refused) and the eval's set checks
(pipeline/eval/checks.py), so the three say the same of one record.
"""

from __future__ import annotations

import json
from typing import Any

from schemas.output import reference_text
from schemas.spec import InputSpec


def id_problem(raw_id: Any, present: bool) -> str | None:
    """What makes a record's id unusable, in words (None: it is usable). A boolean would
    become the text "True", an empty id a document nobody can join on."""
    if raw_id is None:
        return "is null" if present else "is missing"
    if isinstance(raw_id, bool):
        return f"is {str(raw_id).lower()}, a boolean; fix: ids are strings or numbers"
    if isinstance(raw_id, (dict, list, tuple)):
        return "is not a string or a number"
    if not str(raw_id).strip():
        return "is empty"
    return None


def questions_and_answers(rec: dict[str, Any], inp: InputSpec) -> tuple[list[str], list[str | None], str | None]:
    """(the record's usable questions, their answers, what is wrong with them or None).

    Answers pair with questions by position (``pairing_problem``). A question must be a
    non-empty string (a number or a nested value would be asked as its Python text); one
    asked twice is one request (its id hashes the question), so a repeat with another
    answer is a problem and an exact repeat is dropped.

    The questions' own problems come first: a summary that cuts the message (``longdoc report
    --dates``) still shows the cause rather than the answers' miscount it leads to. A field
    that is neither a string nor a list (``{"questions": 42}``) is named as the field, and its
    answers are not counted against it (there is no question to pair them with)."""
    qf = inp.question_field
    raw_q = rec.get(qf) if qf else None
    if shape := question_field_problem(raw_q, qf):
        return [], [], shape
    raw_a = rec.get(inp.answer_field) if inp.answer_field else None
    items, given = _as_list(raw_q), given_answers(raw_q, raw_a)
    answers = [reference_text(a) for a in given]
    problems = []
    pairing = pairing_problem(rec, inp)
    if pairing:
        answers = []
    questions: list[str] = []
    kept: list[str | None] = []
    first: dict[str, int] = {}  # question -> its position in `questions`
    for i, q in enumerate(items):
        ref = answers[i] if i < len(answers) else None
        if isinstance(q, bytes):
            q = q.decode("utf-8", "replace")
        if not isinstance(q, str) or not q.strip():
            what = "null" if q is None else "empty" if isinstance(q, str) else f"not a string ({json.dumps(q, default=str)})"
            problems.append(f"question {i + 1} of field {qf!r} is {what}; fix: questions are non-empty strings")
        elif q in first:
            if kept[first[q]] != ref:
                problems.append(f"question {i + 1} of field {qf!r} repeats question {first[q] + 1} ({q!r}) with "
                                "another answer; fix: ask it once, its acceptable answers in one list")
        else:
            first[q] = len(questions)
            questions.append(q)
            kept.append(ref)
    if pairing:
        problems.append(pairing)
    return questions, kept if answers else [], "; ".join(problems) or None


def pairing_problem(rec: dict[str, Any], inp: InputSpec) -> str | None:
    """What is wrong with how a record's answers pair with its questions, in words (None: they
    pair, or one of the two is absent). Answers pair with questions by position, one each (a
    list inside the list holds one question's acceptable answers: schemas/output.py
    ``reference_text``; so does the list given for a single question that is not in a list):
    a count that differs would score the wrong questions; an answer that is an object, or a
    list within its acceptable answers, has no text to score. The run makes such a record error
    rows; `validate` refuses a spec only when all its first records break it
    (pipeline/preflight.py: a field of another shape, not a stray record)."""
    qf, af = inp.question_field, inp.answer_field
    raw_q = rec.get(qf) if qf else None
    raw_a = rec.get(af) if af else None
    if raw_q is None or raw_a is None:
        return None
    if shape := question_field_problem(raw_q, qf):
        return shape  # no question to pair with: the field's own shape is the cause (and `validate`'s refusal)
    given = given_answers(raw_q, raw_a)
    for i, answer in enumerate(given):
        # An object (or a list nested deeper than one question's alternatives) has no text to
        # score against: its Python repr ("{'x': 1}") became the reference, every row "ok".
        alternatives = answer if isinstance(answer, (list, tuple)) else [answer]
        odd = next((a for a in alternatives if isinstance(a, (dict, list, tuple))), None)
        if odd is not None:
            return (f"answer {i + 1} of field {af!r} is {_json_kind(odd)} ({json.dumps(odd, default=str)[:60]}); "
                    "fix: an answer is a string, a number, null, or a list of acceptable answers to one question")
    nq, na = len(_as_list(raw_q)), len(given)
    if nq == na:
        return None
    return (f"field {af!r} has {na} answer(s) for {nq} question(s) in {qf!r}; fix: one answer per question, "
            "in order (null for a question without one; a list of acceptable answers for one question goes "
            "inside the list)")


def question_field_problem(raw_q: Any, qf: str | None) -> str | None:
    """What is wrong with a questions field (named ``qf``) that is neither a string nor a list
    (``42``), in words; None for one of those shapes, or none given."""
    if raw_q is None or isinstance(raw_q, (str, bytes, list, tuple)):
        return None
    return (f"field {qf!r} is not a string or a list ({json.dumps(raw_q, default=str)[:60]}); "
            "fix: a question is a non-empty string, several a list of them")


def _json_kind(value: Any) -> str:
    return "an object" if isinstance(value, dict) else "a list inside a list of acceptable answers"


def given_answers(raw_q: Any, raw_a: Any) -> list:
    """The answers as a list to pair with the questions: one question not in a list with a
    list of answers has them as its acceptable answers (one entry)."""
    return [raw_a] if isinstance(raw_q, (str, bytes)) and isinstance(raw_a, (list, tuple)) else _as_list(raw_a)


def _as_list(v: Any) -> list:
    if v is None:
        return []
    return list(v) if isinstance(v, (list, tuple)) else [v]
