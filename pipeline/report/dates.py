"""`longdoc report`'s view by date: one line a date, what state it is in and what to do.

An operator of a nightly job asks per date, not per run: is it done, how many rows failed
and why, which run wrote it last and with what settings, what did it cost, is anything
still running, and which nights never ran. ``date_view`` answers from what ``report``
already read (the committed rows and the run summaries of pipeline/report/load.py), each
failing date's most frequent error among them; ``format_dates`` prints it.

A date's status is its latest run's (by start time): that run saw the whole date, so
``succeeded`` means every request has a row and none failed, ``partial`` that some failed.
A running run (it holds the date's lease) makes the date ``running`` whatever came before.
A date with no run is listed only inside a daily cadence (the dates seen are mostly one
day apart): a weekly job's other days are not gaps.
"""

from __future__ import annotations

import datetime as dt
import statistics
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.report.load import UNRECORDED, frequent_errors
from pipeline.report.safe_text import printable

NO_RUN = "no run"
#: Statuses after which the date needs another run (the rows staged, if any, are published by it).
_RERUN = ("interrupted", "failed", UNRECORDED)


def _day(d: str) -> dt.date:
    return dt.date.fromisoformat(d)


def missing_dates(dates: list[str]) -> list[str]:
    """Days between the first and last of ``dates`` that have no run, when the dates are
    a daily cadence (their median gap is one day) and, once they span a week, the job has
    run on that day of the week (a weekday job's weekends are no gaps); [] otherwise."""
    days = sorted({_day(d) for d in dates})
    if len(days) < 3 or statistics.median((b - a).days for a, b in zip(days, days[1:])) != 1:
        return []
    seen = set(days)
    weekdays = {d.weekday() for d in days} if (days[-1] - days[0]).days >= 7 else set(range(7))
    every = (days[0] + dt.timedelta(n) for n in range((days[-1] - days[0]).days))
    return [str(d) for d in every if d not in seen and d.weekday() in weekdays]


def _date_rows(table: pa.Table, run_date: str) -> tuple[int, pa.Table, int]:
    """(rows, the failed rows, of them retryable) committed for ``run_date``."""
    rows = table.filter(pc.equal(table["run_date"], run_date))
    failed = rows.filter(pc.is_valid(rows["error"]))
    # A row failed before error_kind existed counts as retryable (as in summary.py's RunTally).
    input_errors = int(pc.sum(pc.fill_null(pc.equal(failed["error_kind"], "input"), False)).as_py() or 0)
    return rows.num_rows, failed, failed.num_rows - input_errors


def _next_step(status: str, last: dict[str, Any], failed: pa.Table, retryable: int) -> str:
    """What the operator does next for the date, in one phrase (``RERUN`` said once below
    the table)."""
    if status == "running":  # holding its lease: wait; without one the note says either may be true
        note = last.get("note") or "running"
        return f"wait: {note}" if note.startswith("running: ") else note
    if status == "stalled":
        return last.get("note") or "end the stalled run, then rerun the date"
    if status == NO_RUN:
        return "run the date"
    if status in _RERUN:
        staged = last.get("rows_staged") or 0
        why = f" (aborted: {str(last['abort_reason']).splitlines()[0][:80]})" if last.get("abort_reason") else ""
        return f"rerun the date{why}" + (f": it publishes the {staged} staged row(s) first" if staged else "")
    if failed.num_rows:  # the rows report already read: the date's files are not read again
        (message, n, _), *_ = frequent_errors(failed.column("error").to_pylist(), 1)
        message = printable(" ".join(message.split()))  # it may quote a document's id
        if retryable:
            return f"rerun the date: it redoes the {retryable} retryable row(s); most frequent error ({n}): {message[:100]}"
        more = f" (and {failed.num_rows - 1} more)" if failed.num_rows > 1 else ""
        return f"fix the input, then rerun the date: {message[:120]}{more}"
    return "-"


#: How to rerun a date, said once below the table.
RERUN = "longdoc run SPEC --date DATE"


def date_view(table: pa.Table, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """{"dates": one dict a date (newest last, with the days a daily job missed), "totals":
    {...}}. ``table``: load_output(an output); ``summaries``: run_summaries of it."""
    by_date: dict[str, list[dict[str, Any]]] = {}
    for s in summaries:
        by_date.setdefault(s["run_date"], []).append(s)
    lines = []
    for run_date in sorted(set(by_date) | set(missing_dates(list(by_date)))):
        runs = sorted(by_date.get(run_date, []), key=lambda s: (s.get("started_at") or "", s["run_id"]))
        if not runs:
            lines.append({"run_date": run_date, "status": NO_RUN, "runs": 0,
                          "next": _next_step(NO_RUN, {}, table.slice(0, 0), 0)})
            continue
        live = [s for s in runs if s.get("status") == "running"]
        last = live[-1] if live else runs[-1]
        status = last.get("status") or "unknown"
        if live and (last.get("note") or "").startswith("stalled"):
            status = "stalled"
        rows, failed_rows, retryable = _date_rows(table, run_date)
        failed = failed_rows.num_rows
        spent = [s.get("cost_spent_usd") for s in runs]
        lines.append({
            "run_date": run_date, "status": status, "rows": rows, "failed": failed,
            "staged": last.get("rows_staged") or 0, "runs": len(runs), "last_run": last["run_id"],
            "job": last.get("job"), "method": last.get("method"), "target_tokens": last.get("target_tokens"),
            "max_new_tokens": last.get("max_new_tokens"),
            # Runs whose record has no spec (an earlier longdoc's, or none) say nothing here.
            "settings_changed": len({(s.get("model"), s.get("method"), s.get("target_tokens"),
                                      s.get("max_new_tokens")) for s in runs if s.get("method") is not None}) > 1,
            "cost_usd": sum(c for c in spent if c) if any(spent) else None,
            "next": _next_step(status, last, failed_rows, retryable),
        })
    costs = [d["cost_usd"] for d in lines if d.get("cost_usd")]
    counts: dict[str, int] = {}
    for d in lines:
        counts[d["status"]] = counts.get(d["status"], 0) + 1
    totals = {
        "dates": len(lines), "runs": len(summaries), "by_status": counts,
        "rows": table.num_rows, "failed": table.num_rows - table.column("error").null_count,
        "cost_spent_usd": sum(costs), "cost_published_usd": float(pc.sum(table["cost_usd"]).as_py() or 0.0),
    }
    return {"dates": lines, "totals": totals}


def _usd(cost: float | None) -> str:
    """Dollars without an exponent: a CPU night costs fractions of a cent."""
    if cost is None:
        return "-"
    return f"{cost:,.2f}" if cost >= 10 else f"{cost:.4f}" if cost >= 0.01 else f"{cost:.6f}"


def _settings(d: dict[str, Any]) -> str:
    if d["status"] == NO_RUN:
        return "-"
    budget = "" if d.get("target_tokens") is None else f" {d['target_tokens']}"
    new = "" if d.get("max_new_tokens") is None else f"/{d['max_new_tokens']}"
    return f"{d.get('method') or '?'}{budget}{new}" + ("*" if d.get("settings_changed") else "")


def format_dates(view: dict[str, Any]) -> str:
    """The view as a table, one line a date, and two lines of totals."""
    dates, totals = view["dates"], view["totals"]
    if not dates:
        return ""
    jobs = sorted({d["job"] for d in dates if d.get("job")})
    span = dates[0]["run_date"] if len(dates) == 1 else f"{dates[0]['run_date']} .. {dates[-1]['run_date']}"
    states = ", ".join(f"{n} {k}" for k, n in sorted(totals["by_status"].items(), key=lambda kv: -kv[1]))
    head = ("date", "status", "rows", "failed", "staged", "runs", "last run", "settings", "cost USD", "next")
    table = [head]
    for d in dates:
        cost = d.get("cost_usd")
        table.append((
            d["run_date"], d["status"], str(d.get("rows", "-")), str(d.get("failed", "-")),
            str(d.get("staged") or "-"), str(d["runs"]), d.get("last_run") or "-", _settings(d),
            _usd(cost), d["next"],
        ))
    widths = [max(len(r[i]) for r in table) for i in range(len(head) - 1)]
    right = {2, 3, 4, 5, 8}
    # The states are the dates' (a trial read "2 run(s): 1 succeeded" as a run that failed).
    out = [f"== by date: {', '.join(jobs) or 'output'}, {totals['runs']} run(s) over {totals['dates']} date(s) "
           f"{span}; the dates: {states} =="]
    for r in table:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=False))]
        out.append("  " + "  ".join(cells) + "  " + r[-1])
    out.append(f"  rows published {totals['rows']}, failed {totals['failed']}; cost of every run "
               f"{_usd(totals['cost_spent_usd'])} USD, of the rows published {_usd(totals['cost_published_usd'])} USD")
    if any(d["next"].startswith(("rerun", "run the date", "fix")) for d in dates):
        out.append(f"  rerun (or run) a date: {RERUN}; its staged rows are published, done requests skipped")
    if any(d.get("settings_changed") for d in dates):
        out.append("  settings: method budget/max new tokens of the date's last run; * other settings on an "
                   "earlier run of the date")
    return "\n".join(out)
