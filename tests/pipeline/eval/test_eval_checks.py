"""An eval set's mistakes, said before any model loads (pipeline/eval/checks.py)."""

from __future__ import annotations

import json
import time

import typer
from typer.testing import CliRunner

from pipeline.eval.checks import check_eval_set
from pipeline.eval.runner import eval_command

TEXT = "The lease starts on 1 May. The rent is 900 euros. The rent is paid monthly."


def _write(tmp_path, *records) -> str:
    p = tmp_path / "set.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(p)


def test_a_set_nothing_could_be_scored_on_is_refused_before_any_model_loads(tmp_path) -> None:
    """`answer` for `answers` ran every method and printed a table of dashes, exit 0."""
    path = _write(tmp_path, {"id": "a", "text": TEXT, "questions": ["When?"], "answer": ["1 May"]})
    check = check_eval_set(path)
    assert len(check.refusals) == 1 and "'answers'" in check.refusals[0] and "answer" in check.refusals[0]
    app = typer.Typer()
    app.command("eval")(eval_command)
    app.command("noop")(lambda: None)
    t0 = time.perf_counter()
    res = CliRunner().invoke(app, ["eval", "--eval-set", path, "--methods", "bm25"])
    assert res.exit_code == 2 and "none of its 1 record(s) has 'answers'" in res.output
    assert time.perf_counter() - t0 < 30  # refused, not run
    res = CliRunner().invoke(app, ["eval", "--eval-set", str(tmp_path)])
    assert res.exit_code == 2 and "is a folder" in res.output
    assert check_eval_set(_write(tmp_path, {"id": "a", "text": TEXT})).refusals  # no questions either


def test_figures_that_would_mislead_are_noted(tmp_path) -> None:
    path = _write(
        tmp_path,
        {"id": "a", "text": TEXT, "questions": ["When?", "How much?", "How often?", "Who?"],
         "answers": ["1 May", "900 euros", "monthly", None], "style": ["echoed", "two-sentence"],
         "styles": ["echoed"]},
        {"id": "b", "text": TEXT, "questions": ["Which rent?", "Size?"], "answers": ["The rent", "70 m2"]},
    )
    check = check_eval_set(path)
    assert not check.refusals
    notes = "\n".join(check.notes)
    assert "field 'styles' is not read by eval (did you mean 'style'?)" in notes
    assert "'style' has another length than 'questions' in 1 record(s), first line 1 (2 for 4 questions)" in notes
    assert "style 'two-sentence' is not one of echoed, paraphrased, two_sentence" in notes
    assert "1 question(s) have no answer" in notes and "line 1 question 4" in notes
    assert "1 answer(s) do not occur in their document" in notes and "'70 m2'" in notes
    assert "occur more than once" in notes and "'The rent', 2 times" in notes
    clean = _write(tmp_path, {"id": "a", "text": TEXT, "questions": ["When?"], "answers": ["1 May"],
                              "style": ["echoed"]})
    assert check_eval_set(clean).notes == [] and check_eval_set(clean).refusals == []


def test_records_the_reader_fails_are_noted_with_what_they_do_to_the_scores(tmp_path) -> None:
    """One answer for two questions was noted as "a question without an answer" and the run
    failed both rows; a question that is a number crashed `eval` with a traceback."""
    from pipeline.eval.specs import load_question_meta

    path = _write(
        tmp_path,
        {"id": "a", "text": TEXT, "questions": ["When?", "How much?"], "answers": ["1 May"]},
        {"id": "b", "text": TEXT, "questions": 42, "answers": ["1 May"]},
    )
    with open(path, "a") as f:
        f.write('{"id": "c", "text": "a raw\tcontrol character"\n')  # not JSON: an error row of the run
    notes = "\n".join(check_eval_set(path).notes)
    assert ("1 record(s) whose answers do not pair with their questions (first: line 1: field 'answers' has 1 "
            "answer(s) for 2 question(s)") in notes and "scored as wrong" in notes
    assert "question(s) have no answer" not in notes  # not what happens to them
    assert "1 record(s) with a question that is not a non-empty string (first: line 2 question 1 (42))" in notes
    assert "repeat an id" not in notes
    meta = load_question_meta(path)  # no traceback on either record, nor on the line that is not JSON
    assert ("a", "When?") in meta and ("b", "42") in meta
    twice = _write(tmp_path, {"id": "a", "text": TEXT, "questions": ["When?"], "answers": ["1 May"]},
                   {"id": "a", "text": TEXT, "questions": ["Who?"], "answers": ["1 May"]})
    assert "1 record(s) repeat an id of an earlier one (first: id 'a' at lines 1 and 2)" in "\n".join(
        check_eval_set(twice).notes)
