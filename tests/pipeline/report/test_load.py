"""Reading an output table back (pipeline/report/load.py): committed rows of every run
date with the run_date column from the folder, nothing staged or hidden, and one summary
per run with the recorded wall time when the run wrote one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict

from pipeline.date_lease import Holder, machine_id
from pipeline.report.load import list_output_files, load_output, run_summaries
from schemas.loading import spec_from_dict
from schemas.output import FILE_SCHEMA, OUTPUT_SCHEMA, output_row, rows_to_table
from stages.layout import lease_path, run_record_path, staging_dir
from stages.partition import commit_date
from stages.write import staged_file_name, write_bytes_atomic, write_table_atomic

SPEC = spec_from_dict({"name": "j", "input": {"uri": "/in"}, "task": {"kind": "summarize"}})


def _rows(run_id: str, run_date: str, n: int, failed: int = 0) -> list[dict]:
    rows = []
    for i in range(n):
        req = {"run_id": run_id, "run_date": run_date, "job": "j", "doc_id": f"d{i}", "request_id": f"{run_date}-{i}"}
        if i < failed:
            rows.append(output_row(SPEC, req, error="generate: boom", error_kind="retryable"))
        else:
            rows.append(output_row(SPEC, req, output_text="ok", output_tokens=10, prompt_tokens=100,
                                   e2e_s=1.0, device_s=2.0, cost_usd=0.01))
    return rows


def _stage(root: str, rows: list[dict]) -> None:
    run_date, run_id = rows[0]["run_date"], rows[0]["run_id"]
    name = staged_file_name([r["request_id"] for r in rows])
    write_table_atomic(rows_to_table(rows, FILE_SCHEMA), f"{staging_dir(root, run_date)}/{run_id}/{name}")


def test_committed_rows_of_every_date_come_back_with_their_run_date(tmp_path):
    root = str(tmp_path / "out")
    _stage(root, _rows("r1", "2026-01-01", 3, failed=1))
    commit_date(root, "2026-01-01", "r1")
    _stage(root, _rows("r2", "2026-01-02", 2))
    commit_date(root, "2026-01-02", "r2")
    _stage(root, _rows("r3", "2026-01-03", 4))  # staged, never committed: not rows yet
    (tmp_path / "out" / "run_date=2026-01-01" / ".half-written.parquet").write_bytes(b"not parquet")

    _, files = list_output_files(root)
    assert [d for d, _ in files] == ["2026-01-01", "2026-01-02"]
    table = load_output(root)
    assert table.schema.equals(OUTPUT_SCHEMA, check_metadata=False)
    assert sorted(table.column("run_date").to_pylist()) == ["2026-01-01"] * 3 + ["2026-01-02"] * 2
    assert table.column("error").null_count == 4


def test_no_output_yet_is_an_empty_table(tmp_path):
    table = load_output(str(tmp_path / "nothing"))
    assert table.num_rows == 0 and table.schema.equals(OUTPUT_SCHEMA)


def test_one_summary_per_run_on_wall_time_when_recorded(tmp_path):
    root = str(tmp_path / "out")
    _stage(root, _rows("r1", "2026-01-01", 4, failed=1))
    commit_date(root, "2026-01-01", "r1")
    _stage(root, _rows("r2", "2026-01-02", 2))
    commit_date(root, "2026-01-02", "r2")
    write_bytes_atomic(json.dumps({"summary": {"wall_s": 10.0}}).encode(), run_record_path(root, "2026-01-01", "r1"))

    summaries = run_summaries(root, load_output(root))
    assert [(s["run_date"], s["run_id"]) for s in summaries] == [("2026-01-01", "r1"), ("2026-01-02", "r2")]
    first, second = summaries
    assert (first["rows"], first["failed"], first["throughput_basis"], first["wall_s"]) == (4, 1, "wall", 10.0)
    assert first["output_tokens_per_s"] == 30 / 10.0  # the 3 ok rows' tokens over the recorded wall time
    assert (second["throughput_basis"], second["device_s"]) == ("device", 4.0)


def test_report_shows_the_recorded_status_and_scores_answers_against_references(tmp_path):
    """`longdoc report` printed `status -` for a succeeded run and never scored answers."""
    root = str(tmp_path / "out")
    qa = spec_from_dict({"name": "j", "input": {"uri": "/in", "question_field": "q", "answer_field": "a",
                                                "format": "jsonl"}, "task": {"kind": "qa"}})
    answers = [("Paris", "The capital is Paris."), ("42", "42"), ("blue", "It is red."), (None, "anything")]
    rows = [output_row(qa, {"run_id": "r1", "run_date": "2026-01-01", "job": "j", "doc_id": f"d{i}",
                            "request_id": f"q{i}", "reference": ref}, output_text=out, output_tokens=3)
            for i, (ref, out) in enumerate(answers)]
    _stage(root, rows)
    commit_date(root, "2026-01-01", "r1")
    # Recorded where versions before {root}.runs/ wrote run records: an old output still reports.
    write_bytes_atomic(json.dumps({"summary": {"wall_s": 1.0, "status": "succeeded"}}).encode(),
                       f"{root}/_runs/2026-01-01/r1.json")
    (s,) = run_summaries(root, load_output(root))
    assert s["status"] == "succeeded"
    assert (s["answers_scored"], s["answers_contain"], s["answers_exact"]) == (3, 2 / 3, 1 / 3)

    from typer.testing import CliRunner

    from pipeline.cli import app

    res = CliRunner().invoke(app, ["report", root])
    assert res.exit_code == 0, res.output
    assert "succeeded" in res.output and "status                          -" not in res.output
    assert "answers with a reference" in res.output and "containing the reference" in res.output


def test_a_run_record_in_the_current_place_wins_over_one_an_earlier_version_left(tmp_path):
    root = str(tmp_path / "out")
    _stage(root, _rows("r1", "2026-01-01", 2))
    commit_date(root, "2026-01-01", "r1")
    write_bytes_atomic(json.dumps({"summary": {"wall_s": 9.0, "status": "failed"}}).encode(),
                       f"{root}/_runs/2026-01-01/r1.json")
    write_bytes_atomic(json.dumps({"summary": {"wall_s": 2.0, "status": "succeeded"}}).encode(),
                       run_record_path(root, "2026-01-01", "r1"))
    (s,) = run_summaries(root, load_output(root))  # the old _runs/ folder is not read as rows either
    assert (s["rows"], s["wall_s"], s["status"]) == (2, 2.0, "succeeded")


def test_a_run_without_published_rows_is_listed_from_its_record_with_its_staged_rows(tmp_path):
    """An interrupt before any publish leaves a record and staged rows, no row in the table:
    `report` said "no rows" (or skipped the run beside others); it lists the run, its status
    and the rows waiting for the next run of the date, and says how to publish them."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    root = str(tmp_path / "out")
    _stage(root, _rows("r2", "2026-01-02", 3))  # the interrupted run's rows, staged
    record = {"summary": {"status": "interrupted", "rows": 3, "ok": 3, "failed": 0, "wall_s": 7.5}}
    write_bytes_atomic(json.dumps(record).encode(), run_record_path(root, "2026-01-02", "r2"))
    res = CliRunner().invoke(app, ["report", root])
    assert res.exit_code == 0, res.output
    assert "(r2)" in res.output and "interrupted" in res.output and "staged, not yet published" in res.output
    assert "longdoc run SPEC --date 2026-01-02" in res.output
    assert res.output.count("not yet published") == 1  # said once, with the command (a trial saw it twice)

    _stage(root, _rows("r1", "2026-01-01", 2))
    commit_date(root, "2026-01-01", "r1")
    write_bytes_atomic(json.dumps({"summary": {"status": "succeeded", "wall_s": 2.0}}).encode(),
                       run_record_path(root, "2026-01-01", "r1"))
    first, second = run_summaries(root, load_output(root))
    assert (first["run_id"], first["rows"], "rows_published" in first) == ("r1", 2, False)
    assert (second["run_id"], second["status"], second["rows"], second["wall_s"]) == ("r2", "interrupted", 3, 7.5)
    assert (second["rows_published"], second["rows_staged"]) == (0, 3)
    # A rerun that found nothing to do has a record and nothing to show: not listed.
    write_bytes_atomic(json.dumps({"summary": {"status": "succeeded", "rows": 0}}).encode(),
                       run_record_path(root, "2026-01-01", "r3"))
    assert [s["run_id"] for s in run_summaries(root, load_output(root))] == ["r1", "r2"]
    # One that skipped the date's done requests is listed, briefly: an operator's latest run
    # of the date was missing from `report` (a trial).
    write_bytes_atomic(json.dumps({"summary": {"status": "succeeded", "rows": 0, "skipped": 2}}).encode(),
                       run_record_path(root, "2026-01-01", "r4"))
    (noop,) = [s for s in run_summaries(root, load_output(root)) if s["run_id"] == "r4"]
    assert noop["nothing_to_do"] and "the date's 2 request(s) were already done" in noop["note"]
    block = CliRunner().invoke(app, ["report", root]).output.split("(r4) ==")[1].split("==")[0]
    assert "already done" in block and "tokens in" not in block, block  # its settings, status and why only
    # A run whose rows a later run replaced (another spec for the same questions) says so.
    write_bytes_atomic(json.dumps({"summary": {"status": "succeeded", "rows": 2}}).encode(),
                       run_record_path(root, "2026-01-01", "r0"))
    (replaced,) = [s for s in run_summaries(root, load_output(root)) if s["run_id"] == "r0"]
    assert replaced["note"] == "its rows were replaced by a later run of the date" and replaced["rows"] == 2
    # ... and so does one of whose rows a later run replaced some (its error row, fixed):
    # it said "partial" with no failed row and no reason.
    write_bytes_atomic(json.dumps({"summary": {"status": "partial", "rows": 3, "failed": 1}}).encode(),
                       run_record_path(root, "2026-01-01", "r1"))
    (first,) = [s for s in run_summaries(root, load_output(root)) if s["run_id"] == "r1"]
    assert (first["rows"], first["failed"], first["status"]) == (2, 0, "partial")
    assert first["note"] == "1 of its 3 row(s) were replaced by a later run of the date"


def test_a_run_whose_record_says_it_started_and_no_more_is_named(tmp_path):
    """A driver Ray ended (its head node killed mid-run) wrote no row and no record: `report`
    said there was nothing under the output. The runner's first record (status running)
    names the run; once a later run of the date recorded its end, the first one ended
    unrecorded, and its rows that the later run published keep that word."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    root = str(tmp_path / "out")

    def record(run_id: str, started: str, **summary) -> None:
        write_bytes_atomic(json.dumps({"summary": {"started_at": started, **summary}}).encode(),
                           run_record_path(root, "2026-01-01", run_id))

    record("r1", "2026-01-01T02:00:00+00:00", status="running")

    def lease(seen_at: float, pid: int) -> None:  # what r1's driver last wrote
        holder = Holder(run_id="r1", job="job", host=socket.gethostname(), machine=machine_id(), pid=pid, token="t",
                        started_at="2026-01-01T02:00:00+00:00", seen_at=seen_at, beat=1)
        write_bytes_atomic(json.dumps(asdict(holder)).encode(), lease_path(root, "2026-01-01"))

    lease(time.time(), os.getpid())  # running: it holds the date and renews its lease
    res = CliRunner().invoke(app, ["report", root])
    assert res.exit_code == 0, res.output
    assert "(r1)" in res.output and "running: run r1" in res.output
    # Its rows so far are staged: counted as its rows, and the run publishes them itself
    # (`report` told a trial to run the date again, which exits 75 while it runs).
    _stage(root, _rows("r1", "2026-01-01", 2))
    (running,) = run_summaries(root, load_output(root))
    assert (running["status"], running["rows"], running["rows_staged"]) == ("running", 2, 2)
    assert running["note"].endswith("2 row(s) done so far, staged: it publishes them when it ends"), running["note"]
    assert "run the date again" not in CliRunner().invoke(app, ["report", root]).output
    for f in (tmp_path / "out.runs" / "_staging").rglob("*"):
        if f.is_file():
            f.unlink()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    lease(time.time() - 3600, ended.pid)  # its driver killed: the lease stays, naming a process that ended
    res = CliRunner().invoke(app, ["report", root])
    assert "ended unrecorded" in res.output and "run the date again to finish it" in res.output
    _stage(root, _rows("r1", "2026-01-01", 2))  # what it staged; the next run publishes it
    commit_date(root, "2026-01-01", "r2")
    _stage(root, _rows("r2", "2026-01-01", 3)[2:])
    commit_date(root, "2026-01-01", "r2")
    record("r2", "2026-01-01T03:00:00+00:00", status="succeeded", rows=1, retried=2)
    first, second = run_summaries(root, load_output(root))
    assert second["retried"] == 2  # as the run printed it ("error rows retried"), not "-"
    assert (first["run_id"], first["status"], first["rows"]) == ("r1", "ended unrecorded", 2)
    assert "ended without a record of its end" in first["note"] and "the later run r2" in first["note"]
    assert (second["run_id"], second["status"], "note" in second) == ("r2", "succeeded", False)
    res = CliRunner().invoke(app, ["report", root])
    assert "ended unrecorded" in res.output and "the later run r2 went on with the date" in res.output


def test_a_dates_errors_are_counted_by_kind_with_an_example(tmp_path):
    """Nine documents too long for the context were said as '1 x' three times, one per name."""
    from pipeline.report.load import date_errors

    root = str(tmp_path / "out")
    rows = _rows("r1", "2026-01-01", 6, failed=0)
    for i, row in enumerate(rows[:4]):
        row.update(output_text=None, error_kind="input",
                   error=f"generate: document 'doc-{i}.md' needs {9000 + i} prompt tokens, more than 8192")
    rows[4].update(output_text=None, error="generate: boom", error_kind="retryable")
    _stage(root, rows)
    commit_date(root, "2026-01-01", "r1")
    (too_long, n, kinds), (boom, one, single) = date_errors(root, "2026-01-01")
    assert (n, kinds) == (4, 4) and too_long == "generate: document 'doc-0.md' needs 9000 prompt tokens, more than 8192"
    assert (boom, one, single) == ("generate: boom", 1, 1)
    # as many kinds as the limit allows, most frequent first
    assert [e[0] for e in date_errors(root, "2026-01-01", limit=2)] == [too_long, boom]
    assert [e[0] for e in date_errors(root, "2026-01-01", limit=1)] == [too_long]


def test_recorded_runs_are_the_dates_run_records_not_the_leases_beside_them(tmp_path):
    """``{root}.runs/`` holds a date's run records and, beside them, ``_leases/D.json``,
    ``_staging``, ``_ledger``: only the date folders name runs."""
    from pipeline.report.load import recorded_runs
    from stages.layout import lease_path, run_record_path
    from stages.write import write_bytes_atomic

    root = str(tmp_path / "out")
    write_bytes_atomic(b"{}", run_record_path(root, "2026-01-01", "r1"))
    write_bytes_atomic(b'{"run_id": "r2"}', lease_path(root, "2026-01-02"))
    assert recorded_runs(root) == [("2026-01-01", "r1")]
