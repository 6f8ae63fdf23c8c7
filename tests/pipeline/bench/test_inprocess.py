"""pipeline/bench/inprocess.py: a job spec run in one process without Ray writes
`longdoc run`'s rows (one per request, a failed one as an error row, committed under the
run date) and a timeline whose stamps come in order.

In-process on random:tiny (two documents kept of three by input.limit); the bench job
runs this module as ``python -m`` without Ray (tests/pipeline/bench/test_job.py)."""

from __future__ import annotations

import json

import pyarrow.dataset as ds
import pytest
from tiny_models import one_torch_thread

from pipeline.bench.inprocess import main


@pytest.fixture(autouse=True)
def _one_thread():
    yield from one_torch_thread()  # tiny matmuls on a shared 2-core machine


DATE = "2026-01-31"


def _spec(tmp_path, method: str, docs: list[str]) -> str:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(docs)))
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""
name: inproc
input: {{uri: {corpus}, format: jsonl, limit: 2}}
task: {{kind: summarize}}
compression: {json.dumps({"method": method, **({"target_tokens": 16} if method == "truncate" else {})})}
generation: {{model: "random:tiny", max_new_tokens: 3}}
resources: {{actors: 1, batch_size: 1, num_cpus: 1, num_gpus: 0}}
output: {{uri: {tmp_path / "out"}}}
""")
    return str(spec)


def _rows(tmp_path) -> list[dict]:
    return ds.dataset(str(tmp_path / "out" / f"run_date={DATE}"), format="parquet").to_table().to_pylist()


def test_two_documents_become_two_committed_rows_and_an_ordered_timeline(tmp_path):
    spec = _spec(tmp_path, "truncate", ["The river Elbe flows north to the sea. " * 20, "Hamburg is a port.", "unread"])
    timeline = tmp_path / "timeline.json"
    main([spec, "--date", DATE, "--run-id", "r1", "--timeline", str(timeline)])
    rec = json.loads(timeline.read_text())
    assert rec["runner"] == "inprocess" and rec["documents"] == 2 and rec["requests"] == 2
    assert rec["rows"] == 2 and rec["failed"] == 0 and rec["batch_size"] == 1 and rec["batches_in_flight"] >= 1
    stamps = ["t_start", "t_imported", "t_generate_ready", "t_first_start", "t_first_submit", "t_last_written",
              "t_committed"]
    assert [rec[s] for s in stamps] == sorted(rec[s] for s in stamps)
    assert rec["generate_init_s"] > 0 and rec["tokenize_s"] > 0 and rec["text_stage_s"] == 0
    assert rec["read_s"] > 0 and rec["t_generate_ready"] - rec["t_imported"] >= rec["generate_init_s"]
    assert rec["engine"]["steps"] >= 2 and rec["engine"]["describe"]
    rows = sorted(_rows(tmp_path), key=lambda r: r["doc_id"])
    assert [r["doc_id"] for r in rows] == ["d0", "d1"]
    assert all(r["error"] is None and 1 <= r["output_tokens"] <= 3 for r in rows)
    assert rows[0]["context_tokens"] == 16 and rows[0]["compression"] == "truncate"  # cut at tokenize
    # One staged block per batch, both committed, none left behind.
    assert rec["commit"]["staged_files"] == 2 and rec["commit"]["added"] == 2
    assert not list((tmp_path / "out").rglob("*.staged"))


def test_a_document_the_model_cannot_hold_is_an_error_row_counted_as_failed(tmp_path):
    long_doc = "word " * 9000  # beyond random:tiny's 8192 positions: method none cannot cut it
    spec = _spec(tmp_path, "none", ["A short document.", long_doc])
    timeline = tmp_path / "timeline.json"
    main([spec, "--date", DATE, "--run-id", "r2", "--timeline", str(timeline)])
    rec = json.loads(timeline.read_text())
    assert rec["rows"] == 2 and rec["failed"] == 1
    rows = {r["doc_id"]: r for r in _rows(tmp_path)}
    assert rows["d0"]["error"] is None and rows["d0"]["output_text"] is not None
    assert rows["d1"]["error"] and "8192" in rows["d1"]["error"] and rows["d1"]["output_text"] is None
