"""stages/requests.py: a document's request rows, their ids stable across runs."""

from __future__ import annotations

import json

from schemas.loading import spec_from_dict
from stages.read import Document
from stages.requests import expand_requests, generation_fingerprint, request_id


def test_requests_expand_per_question_with_stable_ids(tmp_path):
    spec = spec_from_dict(
        {
            "name": "qa",
            "input": {"uri": str(tmp_path), "format": "jsonl", "question_field": "q"},
            "task": {"kind": "qa", "questions": ["Shared?"]},
        }
    )
    doc = Document("d1", "f.jsonl", "text", questions=["Q1"], answers=["A1"])
    fp = generation_fingerprint(spec)
    rows = expand_requests(doc, spec, "run1", "2026-01-01", fp)
    assert [r["prompt"] for r in rows] == ["Q1", "Shared?"]
    assert rows[0]["reference"] == "A1" and rows[1]["reference"] is None
    again = expand_requests(doc, spec, "run2", "2026-01-02", fp)
    assert [r["request_id"] for r in rows] == [r["request_id"] for r in again]
    other = spec.model_copy(update={"generation": spec.generation.model_copy(update={"max_new_tokens": 7})})
    assert request_id("d1", "text", "Q1", generation_fingerprint(other)) != rows[0]["request_id"]
    no_q = expand_requests(Document("d2", "f", "text"), spec.model_copy(
        update={"task": spec.task.model_copy(update={"questions": ()})}), "r", "d", fp)
    assert len(no_q) == 1 and "no question" in no_q[0]["error"]
    # The row says what to do (it named the field only).
    assert no_q[0]["error"].endswith("fix: give the record its questions in 'q', or set task.questions to ask every document")
    assert no_q[0]["prompt"] is None  # it asks nothing: not the default instruction
    assert no_q[0]["request_id"] == request_id("d2", "text", spec.task.resolved_instruction, fp)  # ids as before


def test_error_kind_reaches_the_request_rows(tmp_path):
    spec = spec_from_dict({"name": "k", "input": {"uri": str(tmp_path)}})
    fp = generation_fingerprint(spec)
    bad = Document("d", "f", None, error="read: f is empty", error_kind="input")
    lost = Document("e", "f", None, error="read: cannot read f", error_kind="retryable")
    ok = Document("g", "f", "text")
    assert expand_requests(bad, spec, "r", "2026-01-01", fp)[0]["error_kind"] == "input"
    assert expand_requests(lost, spec, "r", "2026-01-01", fp)[0]["error_kind"] == "retryable"
    assert expand_requests(ok, spec, "r", "2026-01-01", fp)[0]["error_kind"] is None


def test_a_setting_added_later_keeps_the_request_ids_of_earlier_runs_while_at_its_default(tmp_path):
    """finch's max_scoring_layers came after Finch jobs had written rows: unset, it is not in
    the fingerprint, so a rerun of an old date after the upgrade finds its rows; set, it is."""
    base = {"name": "f", "input": {"uri": str(tmp_path)}, "task": {"kind": "summarize"},
            "compression": {"method": "finch", "target_tokens": 512}}
    fp = generation_fingerprint(spec_from_dict(base))
    before = spec_from_dict(base).compression.model_dump(mode="json")
    for name in ("max_scoring_layers", "reading", "share_reading", "heads_from", "chunk_context"):
        del before[name]  # the settings as they were dumped before the fields existed
    assert json.loads(fp)["compression"] == before
    capped = spec_from_dict({**base, "compression": {**base["compression"], "scoring": "heads", "max_scoring_layers": 8}})
    assert json.loads(generation_fingerprint(capped))["compression"]["max_scoring_layers"] == 8
    assert "repeat_guard" not in json.loads(fp)  # the repeat guard, off by default, the same way
    guarded = spec_from_dict({**base, "generation": {"repeat_guard": 12}})
    assert json.loads(generation_fingerprint(guarded))["repeat_guard"] == 12


def test_a_question_the_record_and_the_task_both_ask_is_one_request_with_the_records_answer(tmp_path):
    spec = spec_from_dict({"name": "qa", "input": {"uri": str(tmp_path), "format": "jsonl", "question_field": "q"},
                           "task": {"kind": "qa", "questions": ["Who?", "Why?"]}})
    doc = Document("d1", "f.jsonl", "text", questions=["Who?"], answers=["Ada"])
    rows = expand_requests(doc, spec, "r", "2026-01-01", generation_fingerprint(spec))
    assert [(r["prompt"], r["reference"]) for r in rows] == [("Who?", "Ada"), ("Why?", None)]
    assert len({r["request_id"] for r in rows}) == 2 and all(r["doc_requests"] == 2 for r in rows)
