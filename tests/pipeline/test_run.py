"""Whole pipeline through real Ray Data and real Parquet: rows in = rows out."""

from __future__ import annotations

import json

import duckdb
import pyarrow.parquet as pq
import pytest

from pipeline.report.load import load_output, run_summaries
from pipeline.runner import run_job
from schemas.loading import load_spec, spec_from_dict
from schemas.output import OUTPUT_COLUMNS

DATE = "2026-01-31"


def _corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "rivers.txt").write_text("Rivers carry water to the sea. The Rhine flows through Basel. " * 5)
    (d / "cities.md").write_text("Zurich is a city on a lake. It has many bridges and old streets. " * 4)
    (d / "empty.txt").write_text("")
    (d / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    (d / "huge.txt").write_text("token " * 5000)  # > the tiny model's 4096-token window
    return d


def _spec(tmp_path, model_dir, **extra):
    data = {
        "name": "t",
        "input": {"uri": str(_corpus(tmp_path)), "format": "text"},
        "generation": {"model": str(model_dir), "max_new_tokens": 5},
        "resources": {"batch_size": 2},
        "output": {"uri": str(tmp_path / "out")},
    }
    data.update(extra)
    return spec_from_dict(data)


def test_bad_inputs_are_error_rows_and_the_rest_succeeds(tmp_path, tiny_model_dir, ray_session):
    spec = _spec(tmp_path, tiny_model_dir)
    result = run_job(spec, run_date=DATE, run_id="run-a", progress=False)
    table = load_output(result.output_uri)
    assert table.num_rows == 5  # every document has a row
    rows = {r["doc_id"]: r for r in table.to_pylist()}
    assert rows["rivers.txt"]["error"] is None and rows["rivers.txt"]["output_tokens"] > 0
    assert rows["cities.md"]["error"] is None
    assert "empty.txt is empty" in rows["empty.txt"]["error"]
    assert "not valid UTF-8" in rows["latin1.txt"]["error"]
    assert "context of 4096" in rows["huge.txt"]["error"]
    assert result.summary["rows"] == 5 and result.summary["failed"] == 3
    assert set(table.column_names) == set(OUTPUT_COLUMNS)
    # The run summary JSON sits beside the table.
    runs = list((tmp_path / "out" / "_runs" / DATE).glob("*.json"))
    assert json.loads(runs[0].read_text())["summary"]["rows"] == 5

    # DuckDB reads the hive-partitioned output with every column.
    con = duckdb.connect()
    n, avg_e2e, date = con.execute(
        f"select count(*), avg(e2e_s), any_value(run_date) from '{tmp_path}/out/**/*.parquet'"
    ).fetchone()
    assert n == 5 and avg_e2e > 0 and str(date) == DATE

    # A rerun of the same date skips everything already written: no duplicates.
    again = run_job(spec, run_date=DATE, run_id="run-b", progress=False)
    assert again.skipped == 5 and again.summary["rows"] == 0
    table2 = load_output(result.output_uri)
    assert table2.num_rows == 5 and len(set(table2.column("request_id").to_pylist())) == 5
    assert [s["run_id"] for s in run_summaries(result.output_uri, table2)] == ["run-a"]

    # The next night's run lands in its own partition; one query spans both dates.
    run_job(spec, run_date="2026-02-01", run_id="run-c", progress=False)
    per_date = con.execute(
        f"select cast(run_date as varchar), count(*), count(error) from "
        f"read_parquet('{tmp_path}/out/**/*.parquet', hive_partitioning = true) group by 1 order by 1"
    ).fetchall()
    assert per_date == [(DATE, 5, 3), ("2026-02-01", 5, 3)]


def test_truncate_and_qa_from_jsonl(tmp_path, tiny_model_dir, ray_session):
    data = tmp_path / "qa.jsonl"
    docs = [
        {"id": "a", "text": "The vault code is 7431. " * 40, "questions": ["What is the code?", "Where?"], "answers": ["7431", None]},
        {"id": "b", "body": "missing text field"},
    ]
    data.write_text("\n".join(json.dumps(d) for d in docs))
    spec = spec_from_dict(
        {
            "name": "qa",
            "input": {"uri": str(data), "format": "jsonl", "question_field": "questions", "answer_field": "answers"},
            "task": {"kind": "qa"},
            "compression": {"method": "truncate", "target_tokens": 50},
            "generation": {"model": str(tiny_model_dir), "max_new_tokens": 4},
            "output": {"uri": str(tmp_path / "out")},
        }
    )
    result = run_job(spec, run_date=DATE, progress=False)
    rows = sorted(load_output(result.output_uri).to_pylist(), key=lambda r: (r["doc_id"], r["prompt"] or ""))
    assert len(rows) == 3
    assert [r["prompt"] for r in rows[:2]] == ["What is the code?", "Where?"]
    assert rows[0]["reference"] == "7431"
    for r in rows[:2]:
        assert r["error"] is None and r["context_tokens"] == 50
        assert r["compression_ratio"] == pytest.approx(r["doc_tokens"] / 50)
    assert "missing field 'text'" in rows[2]["error"] and "qa.jsonl:2" in rows[2]["error"]


def test_one_big_file_is_written_batch_by_batch(tmp_path, tiny_model_dir, ray_session):
    """A single-file corpus must not reach the generate pool as one block: each
    generate batch is staged as its own file (resume granularity, progress, and work
    for every actor of the pool); the end of the run compacts them into one file."""
    data = tmp_path / "one.jsonl"
    data.write_text("\n".join(json.dumps({"id": f"d{i}", "text": f"Document {i} talks about rivers. " * 8})
                              for i in range(6)))
    spec = spec_from_dict(
        {
            "name": "big",
            "input": {"uri": str(data), "format": "jsonl"},
            "generation": {"model": str(tiny_model_dir), "max_new_tokens": 2},
            "resources": {"batch_size": 2},
            "output": {"uri": str(tmp_path / "out")},
        }
    )
    result = run_job(spec, run_date=DATE, progress=False)
    files = list((tmp_path / "out" / f"run_date={DATE}").glob("*.parquet"))
    assert load_output(result.output_uri).num_rows == 6
    assert result.summary["staged_blocks"] == 3
    assert len(files) == 1 and pq.ParquetFile(files[0]).metadata.num_rows == 6
    assert not list((tmp_path / "out" / "_staging").rglob("*.staged"))  # published, then removed


@pytest.mark.e2e
def test_sample_job_with_the_embedded_model(tmp_path, ray_session):
    spec = load_spec(
        "jobs/sample-summarize.yaml",
        ["input.limit=2", "generation.max_new_tokens=16", "resources.num_cpus=1", f"output.uri={tmp_path}/out"],
    )
    result = run_job(spec, run_date=DATE, progress=False)
    table = load_output(result.output_uri)
    assert table.num_rows == 2
    for r in table.to_pylist():
        assert r["error"] is None, r["error"]
        assert r["output_tokens"] > 0 and len(r["output_text"].split()) >= 3
        assert r["speculative"] == "prompt_lookup" and r["compression"] == "truncate"
        assert r["context_tokens"] <= 1024 and r["doc_tokens"] >= 2000
    assert result.summary["output_tokens_per_s"] > 0
