"""The view by date of `longdoc report` (pipeline/report/dates.py): one line a date with its
latest run's status, the date's rows, what to do next and what it cost; the days a daily job
missed. An operator of a month of nights had to answer these with pyarrow over the Parquet
(a trial): a missing night was not said, nor why rows failed, nor the month's cost."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.report.dates import date_view, format_dates, missing_dates
from pipeline.report.load import load_output, run_summaries
from stages.layout import run_record_path
from stages.partition import commit_date
from stages.write import write_bytes_atomic
from tests.pipeline.report.test_load import _rows, _stage


def _record(root: str, run_date: str, run_id: str, started: str, **summary) -> None:
    spec = {"compression": {"method": "truncate", "target_tokens": summary.pop("budget", 512)},
            "generation": {"max_new_tokens": 8}}
    write_bytes_atomic(json.dumps({"summary": {"started_at": started, **summary}, "spec": spec}).encode(),
                       run_record_path(root, run_date, run_id))


def _month(root: str) -> None:
    """Five nights of one job: done; an input error; never run; interrupted with rows staged;
    a retryable failure after a change of budget."""
    _stage(root, _rows("a", "2026-03-01", 2))
    commit_date(root, "2026-03-01", "a")
    _record(root, "2026-03-01", "a", "2026-03-01T02:00:00", status="succeeded", rows=2, cost_usd=0.02)
    bad = _rows("b", "2026-03-02", 3)
    bad[0].update(output_text=None, error="read: in/2026-03-02.jsonl:2 is not valid JSON", error_kind="input")
    _stage(root, bad)
    commit_date(root, "2026-03-02", "b")
    _record(root, "2026-03-02", "b", "2026-03-02T02:00:00", status="partial", rows=3, failed=1, cost_usd=0.03)
    _stage(root, _rows("d", "2026-03-04", 4))  # staged, never published
    _record(root, "2026-03-04", "d", "2026-03-04T02:00:00", status="interrupted", rows=4, cost_usd=0.04)
    _stage(root, _rows("e1", "2026-03-05", 2))
    commit_date(root, "2026-03-05", "e1")
    _record(root, "2026-03-05", "e1", "2026-03-05T02:00:00", status="succeeded", rows=2, cost_usd=0.02)
    _stage(root, _rows("e2", "2026-03-05", 2, failed=1))  # the same requests again, another budget
    commit_date(root, "2026-03-05", "e2")
    _record(root, "2026-03-05", "e2", "2026-03-05T03:00:00", status="partial", rows=2, failed=1, cost_usd=0.01,
            budget=256)


def test_each_date_says_its_state_its_latest_run_and_what_to_do(tmp_path):
    root = str(tmp_path / "out")
    _month(root)
    table = load_output(root)
    view = date_view(table, run_summaries(root, table))
    by_date = {d["run_date"]: d for d in view["dates"]}
    assert list(by_date) == ["2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04", "2026-03-05"]
    assert (by_date["2026-03-01"]["status"], by_date["2026-03-01"]["next"]) == ("succeeded", "-")
    bad = by_date["2026-03-02"]
    assert (bad["status"], bad["rows"], bad["failed"]) == ("partial", 3, 1)
    assert bad["next"] == "fix the input, then rerun the date: read: in/2026-03-02.jsonl:2 is not valid JSON"
    assert (by_date["2026-03-03"]["status"], by_date["2026-03-03"]["runs"]) == ("no run", 0)
    stopped = by_date["2026-03-04"]
    assert (stopped["status"], stopped["rows"], stopped["staged"]) == ("interrupted", 0, 4)
    assert stopped["next"] == "rerun the date: it publishes the 4 staged row(s) first"
    changed = by_date["2026-03-05"]
    assert (changed["last_run"], changed["status"], changed["target_tokens"], changed["settings_changed"]) == (
        "e2", "partial", 256, True)
    assert changed["next"].startswith("rerun the date: it redoes the 1 retryable row(s); most frequent error (1)")
    totals = view["totals"]
    assert (totals["rows"], totals["failed"], totals["runs"], totals["dates"]) == (7, 2, 5, 5)
    # What every run spent (the replaced run e1 and the staged rows of d included), and what
    # the published rows carry (0.01 a row made ok, 0 one made failed: 2 + 3 + 1 rows).
    assert round(totals["cost_spent_usd"], 6) == 0.12 and round(totals["cost_published_usd"], 6) == 0.06

    text = format_dates(view)
    lines = text.splitlines()
    assert lines[0] == ("== by date: j, 5 run(s) over 5 date(s) 2026-03-01 .. 2026-03-05; the dates: "
                        "2 partial, 1 succeeded, 1 no run, 1 interrupted ==")
    assert any(ln.split()[:2] == ["2026-03-03", "no"] and ln.endswith("run the date") for ln in lines)
    assert "none 256/8*" in text  # the rows' method, the record's budget and max new tokens; * changed
    assert "cost of every run 0.1200 USD, of the rows published 0.0600 USD" in text
    assert "longdoc run SPEC --date DATE" in text


def test_only_a_daily_cadence_has_missing_days():
    assert missing_dates(["2026-03-01", "2026-03-02", "2026-03-04", "2026-03-05"]) == ["2026-03-03"]
    assert missing_dates(["2026-03-02", "2026-03-09", "2026-03-16"]) == []  # weekly: no gap
    assert missing_dates(["2026-03-01", "2026-03-03"]) == []  # two dates say no cadence
    # A weekday job's weekends are no gaps (a review: two weeks of weekday runs named them)
    weekdays = [f"2026-03-{d:02d}" for d in (2, 3, 4, 5, 6, 9, 10, 11, 12, 13)]
    assert missing_dates(weekdays) == [] and missing_dates(weekdays[:3] + weekdays[4:]) == ["2026-03-05"]
    assert missing_dates(weekdays[:6]) == []  # Monday to Monday: a week seen, the weekend is none
    # The last day before the last run is a gap like any other.
    assert missing_dates(["2026-03-01", "2026-03-02", "2026-03-03", "2026-03-05"]) == ["2026-03-04"]


def test_a_date_takes_its_latest_run_by_start_and_a_run_holding_the_lease_over_any():
    """The run that decides a date's line: the latest by start time (not by run id), and a run
    still holding the date's lease whatever started after it; a stalled one says so."""
    from schemas.output import rows_to_table

    def run(run_date, run_id, started, status, note=None):
        return {"run_date": run_date, "run_id": run_id, "started_at": started, "status": status, "note": note}

    summaries = [
        run("2026-03-01", "z", "2026-03-01T01:00:00", "succeeded"),
        run("2026-03-01", "a", "2026-03-01T03:00:00", "partial"),
        run("2026-03-02", "r1", "2026-03-02T01:00:00", "running", "running: pid 7 on host-1 since 01:00"),
        run("2026-03-02", "r2", "2026-03-02T02:00:00", "failed"),
        run("2026-03-03", "s", "2026-03-03T01:00:00", "running", "stalled: pid 9 on host-1, no progress for 2 h"),
    ]
    view = date_view(rows_to_table([]), summaries)
    by_date = {d["run_date"]: d for d in view["dates"]}
    assert (by_date["2026-03-01"]["last_run"], by_date["2026-03-01"]["status"]) == ("a", "partial")
    held = by_date["2026-03-02"]
    assert (held["last_run"], held["status"], held["next"]) == ("r1", "running", "wait: running: pid 7 on host-1 since 01:00")
    stalled = by_date["2026-03-03"]
    assert (stalled["status"], stalled["next"]) == ("stalled", "stalled: pid 9 on host-1, no progress for 2 h")


def test_the_command_prints_the_view_after_the_runs_or_alone_from_a_date_on(tmp_path):
    root = str(tmp_path / "out")
    _month(root)
    full = CliRunner().invoke(app, ["report", root])
    assert full.exit_code == 0, full.output
    assert full.output.index("== j 2026-03-05 (e2) ==") < full.output.index("== by date: j, 5 run(s) over 5 date(s)")
    only = CliRunner().invoke(app, ["report", root, "--dates", "--since", "2026-03-04"])
    assert only.exit_code == 0 and only.output.startswith("== by date: j, 3 run(s) over 2 date(s) 2026-03-04 .. 2026-03-05")
    assert "(e2) ==" not in only.output and "rows published 2, failed 1" in only.output
    view = json.loads(CliRunner().invoke(app, ["report", root, "--dates", "--json"]).output)
    assert [d["status"] for d in view["dates"]] == ["succeeded", "partial", "no run", "interrupted", "partial"]
    for option, value, says in (("--since", "March", "is not a date: give it as YYYY-MM-DD"),
                                ("--since", "2027-01-01", "no run of"), ("--date", "2026-03-03", "no run of"),
                                ("--date", "2026-W10-1", "is not a date")):
        res = CliRunner().invoke(app, ["report", root, option, value])
        assert res.exit_code == 2 and says in res.output and len(res.output.strip().splitlines()) == 1, res.output
    both = CliRunner().invoke(app, ["report", root, "--since", "2026-03-05", "--date", "2026-03-01"])
    assert both.exit_code == 2 and "--since and --date together" in both.output
    # One date: its runs and its answers (a trial could not see an older night's errors).
    one = CliRunner().invoke(app, ["report", root, "--date", "2026-03-02", "--answers", "5"])
    assert one.exit_code == 0 and "(b) ==" in one.output and "(e2) ==" not in one.output, one.output
    assert "is not valid JSON" in one.output.split("== by date")[1]
