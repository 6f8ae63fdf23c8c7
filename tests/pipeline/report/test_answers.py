"""`longdoc report --answers N` (pipeline/report/answers.py): the newest date's rows, in
document order, each with its question, answer or error, and its reference."""

from __future__ import annotations

from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.report.answers import FIELD_CHARS
from schemas.loading import spec_from_dict
from schemas.output import output_row
from stages.partition import commit_date
from tests.pipeline.report.test_load import _stage

QA = spec_from_dict({"name": "j", "input": {"uri": "/in", "question_field": "q", "answer_field": "a",
                                            "format": "jsonl"}, "task": {"kind": "qa"}})


def _row(run_date: str, doc: str, question: str, reference: str | None, **result) -> dict:
    req = {"run_id": "r-" + run_date, "run_date": run_date, "job": "j", "doc_id": doc,
           "request_id": f"{run_date}-{doc}-{question}", "prompt": question, "reference": reference}
    return output_row(QA, req, **result)


def test_answers_print_the_newest_date_in_document_order_with_references_and_errors(tmp_path):
    root = str(tmp_path / "out")
    _stage(root, [_row("2026-01-01", "old", "Old question?", None, output_text="old answer")])
    commit_date(root, "2026-01-01", "r-2026-01-01")
    _stage(root, [
        _row("2026-01-02", "b.txt", "Who wrote it?", "Ada", output_text="It was written by Ada."),
        _row("2026-01-02", "a.txt", "Where?", "Paris", output_text="In " + "very " * 300 + "far Rome.",
             finish_reason="length"),
        _row("2026-01-02", "c.txt", "When?", None, error="read: c.txt is not valid UTF-8", error_kind="input"),
    ])
    commit_date(root, "2026-01-02", "r-2026-01-02")

    res = CliRunner().invoke(app, ["report", root, "--answers", "2"])
    assert res.exit_code == 0, res.output
    out = res.output[res.output.index("answers of 2026-01-02"):]
    assert out.startswith("answers of 2026-01-02: 2 of 3 row(s)")
    assert "old answer" not in out and "c.txt" not in out  # another date; past the limit of 2
    assert out.index("[a.txt] Where?") < out.index("[b.txt] Who wrote it?")
    assert "reference (does not): Paris" in out and "[...]" in out  # a long answer is cut
    assert max(len(line) for line in out.splitlines()) <= 100
    assert "reference (contains it): Ada" in out and "answer: It was written by Ada." in out
    assert "answer (cut at max_new_tokens): In very" in out  # the row whose token limit stopped it

    res = CliRunner().invoke(app, ["report", root, "--answers", "10"])
    assert "3 of 3 row(s)" in res.output
    assert "[c.txt] When?" in res.output and "error (input): read: c.txt is not valid UTF-8" in res.output
    assert "answers of" not in CliRunner().invoke(app, ["report", root]).output  # off by default
    assert FIELD_CHARS < len("very " * 300)

    # With --json the answers come in the same JSON object as the runs (they were dropped).
    import json

    res = CliRunner().invoke(app, ["report", root, "--answers", "2", "--json"])
    data = json.loads(res.output)
    assert [r["run_id"] for r in data["runs"]] == ["r-2026-01-01", "r-2026-01-02"]
    assert [(a["doc_id"], a["prompt"]) for a in data["answers"]] == [("a.txt", "Where?"), ("b.txt", "Who wrote it?")]
    assert data["answers"][1]["output_text"] == "It was written by Ada." and data["answers"][1]["reference"] == "Ada"
    assert [a["finish_reason"] for a in data["answers"]] == ["length", None]
    assert isinstance(json.loads(CliRunner().invoke(app, ["report", root, "--json"]).output), list)  # as before


def test_a_documents_questions_keep_their_order_and_a_field_at_the_limit_is_whole(tmp_path):
    """Rows of one document come ordered by their question (the same output prints the same
    lines); a field of exactly FIELD_CHARS is not marked cut; every row shown: no hint of more."""
    root = str(tmp_path / "out")
    whole = "x" * FIELD_CHARS
    _stage(root, [_row("2026-01-02", "a.txt", "Why?", None, output_text="Because."),
                  _row("2026-01-02", "a.txt", "How?", None, output_text=whole)])
    commit_date(root, "2026-01-02", "r-2026-01-02")
    res = CliRunner().invoke(app, ["report", root, "--answers", "5"])
    assert res.exit_code == 0, res.output
    out = res.output[res.output.index("answers of 2026-01-02"):]
    assert out.index("[a.txt] How?") < out.index("[a.txt] Why?")
    assert "[...]" not in out and "".join(out.split()).count(whole) == 1
    assert out.splitlines()[0] == "answers of 2026-01-02: 2 of 2 row(s)"


def test_what_a_document_or_a_model_wrote_cannot_drive_the_terminal(tmp_path):
    """A security review's hostile document set the terminal title, planted a hyperlink,
    cleared the screen and forged a report line through `report --answers`: control
    characters and bidi overrides are printed as escapes; other scripts stay as they are."""
    from pipeline.report.safe_text import printable

    root = str(tmp_path / "out")
    _stage(root, [_row("2026-01-01", "d\nFAKE LINE: rows 999 ok", "What?\x1b]0;pwned\x07", "ALPHA\x1b[2J",
                       output_text="\x1b]8;;http://evil.example/\x07click \u202eevil\u202c Zürich ﻿नमस्ते")])
    commit_date(root, "2026-01-01", "r-2026-01-01")
    out = CliRunner().invoke(app, ["report", root, "--answers", "1"]).output
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "[d\\nFAKE LINE: rows 999 ok] What?\\x1b]0;pwned\\x07" in out
    assert not any(line.startswith("FAKE LINE") for line in out.splitlines())
    assert "\\x1b]8;;http://evil.example/\\x07click \\u202eevil\\u202c Zürich" in out and "नमस्ते" in out
    assert printable("tab\there") == "tab\\there" and printable("صباح\u200cالخير") == "صباح\u200cالخير"
