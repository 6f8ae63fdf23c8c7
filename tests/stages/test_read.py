"""Readers: every format, local and memory:// URIs, bad inputs as error documents."""

from __future__ import annotations

import json
import uuid

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.loading import spec_from_dict
from schemas.spec import InputSpec
from stages.read import expand_requests, generation_fingerprint, list_shards, read_shard, request_id


def _read_all(inp: InputSpec, date: str = "2026-01-01"):
    uri = inp.uri.replace("{run_date}", date)
    return [d for s in list_shards(inp, date) for d in read_shard(s, inp, uri)]


def test_text_folder_local(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("alpha doc")
    (tmp_path / "sub" / "b.md").write_text("# beta")
    (tmp_path / "skip.json").write_text("{}")
    (tmp_path / "bad.txt").write_bytes(b"ok \xff\xfe")
    (tmp_path / "empty.txt").write_text("  \n")
    docs = {d.doc_id: d for d in _read_all(InputSpec(uri=str(tmp_path), format="text"))}
    assert set(docs) == {"a.txt", "sub/b.md", "bad.txt", "empty.txt"}
    assert docs["a.txt"].text == "alpha doc" and docs["a.txt"].error is None
    assert "not valid UTF-8" in docs["bad.txt"].error and "bad.txt" in docs["bad.txt"].error
    assert "empty" in docs["empty.txt"].error


def test_jsonl_memory_fs_with_bad_lines():
    root = f"memory://corpus-{uuid.uuid4().hex}"
    lines = [
        json.dumps({"id": "d1", "text": "one", "questions": ["q1", "q2"], "answers": ["a1", "a2"]}),
        "{not json",
        json.dumps({"id": "d3"}),
        json.dumps({"id": "d4", "text": "four", "questions": "single q"}),
        "",
    ]
    with fsspec.open(f"{root}/{{run_date}}/part.jsonl".replace("{run_date}", "2026-01-01"), "w") as f:
        f.write("\n".join(lines))
    inp = InputSpec(uri=root + "/{run_date}", format="jsonl", question_field="questions", answer_field="answers")
    docs = _read_all(inp)
    assert len(docs) == 4
    assert docs[0].questions == ["q1", "q2"] and docs[0].answers == ["a1", "a2"]
    assert "part.jsonl:2" in docs[1].error and "not valid JSON" in docs[1].error
    assert "part.jsonl:3" in docs[2].error and "missing field 'text'" in docs[2].error
    assert docs[3].questions == ["single q"]


def test_parquet_file_and_missing_field(tmp_path):
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"doc": ["x", "y"], "body": ["text x", None]}), path)
    inp = InputSpec(uri=str(path), format="parquet", id_field="doc", text_field="body")
    docs = _read_all(inp)
    assert [d.doc_id for d in docs] == ["x", "y"]
    assert docs[0].text == "text x"
    assert "row1" in docs[1].error and "'body'" in docs[1].error


def test_missing_uri_and_empty_folder(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        list_shards(InputSpec(uri=str(tmp_path / "nope")), "2026-01-01")
    with pytest.raises(ValueError, match="no text files"):
        list_shards(InputSpec(uri=str(tmp_path)), "2026-01-01")


def test_requests_expand_per_question_with_stable_ids(tmp_path):
    spec = spec_from_dict(
        {
            "name": "qa",
            "input": {"uri": str(tmp_path), "format": "jsonl", "question_field": "q"},
            "task": {"kind": "qa", "questions": ["Shared?"]},
        }
    )
    from stages.read import Document

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
