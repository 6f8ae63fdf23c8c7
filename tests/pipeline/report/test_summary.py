"""Run summaries: status, error counts by kind, versions, the JSON record."""

from __future__ import annotations

import json

from pipeline.report.summary import (
    format_summary,
    package_versions,
    run_record_json,
    run_summary,
    summarize,
)
from schemas.output import INPUT, RETRYABLE, rows_to_table


def _table(errors: list[tuple[str | None, str | None]]):
    return rows_to_table([
        {"run_id": "r", "run_date": "2026-01-01", "job": "j", "doc_id": f"d{i}", "request_id": f"q{i}",
         "error": err, "error_kind": kind, "output_tokens": None if err else 5, "e2e_s": 1.0}
        for i, (err, kind) in enumerate(errors)
    ])


def test_status_follows_the_date_and_the_abort():
    figures = _table([(None, None), ("read: empty", INPUT), ("generate: OSError", RETRYABLE)])
    date = {"rows": 10, "failed": 2, "errors_input": 1, "errors_retryable": 1}
    s = run_summary(figures, wall_s=2.0, date_counts=date, aborted=None)
    assert s["status"] == "partial" and s["errors_by_kind"] == {"input": 1, "retryable": 1}
    assert s["date_failed_fraction"] == 0.2 and s["date_errors_by_kind"] == {"input": 1, "retryable": 1}
    clean = {"rows": 10, "failed": 0, "errors_input": 0, "errors_retryable": 0}
    assert run_summary(figures, 2.0, clean, None)["status"] == "succeeded"
    failed = run_summary(figures, 2.0, clean, aborted=RuntimeError("actor died"))
    assert failed["status"] == "failed" and failed["abort_reason"] == "RuntimeError: actor died"
    assert "status" in format_summary(s) and "partial" in format_summary(s)


def test_record_carries_versions_and_round_trips():
    versions = package_versions()
    assert versions["longdoc"] and versions["pyarrow"] and versions["ray"] and versions["python"]
    s = run_summary(_table([(None, None)]), 1.0, {"rows": 1, "failed": 0}, None)
    s["versions"] = versions
    record = json.loads(run_record_json(s, {"name": "j"}))
    assert record["summary"]["versions"] == versions and record["spec"] == {"name": "j"}


def test_prompt_tokens_from_the_prefix_cache_are_summed_over_successful_rows():
    rows = [{"run_id": "r", "run_date": "2026-01-01", "job": "j", "doc_id": "d0", "request_id": f"q{i}",
             "error": err, "prompt_tokens": 100, "cached_prompt_tokens": cached, "e2e_s": 1.0}
            for i, (err, cached) in enumerate([(None, 0), (None, 80), (None, 80), ("generate: OSError", None)])]
    s = summarize(rows_to_table(rows), wall_s=1.0)
    assert s["tokens_in"] == 300 and s["tokens_in_cached"] == 160
    assert "of them from the prefix cache  160" in format_summary(s)
    # an output written before schema version 5 has no such column: nothing was cached
    old = rows_to_table(rows[:1]).drop_columns(["cached_prompt_tokens"])
    assert summarize(old)["tokens_in_cached"] == 0
