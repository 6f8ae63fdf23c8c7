"""Read an output table back and summarise it per run (``longdoc report``).

Contract: ``load_output(uri)`` returns every committed row under ``uri`` (all run
dates) with OUTPUT_SCHEMA, ``run_date`` taken from the hive folder name; staged files,
run records and hidden temporary files are not rows (only ``run_date=D/*.parquet``
is read, so an output of an earlier version, with ``_runs/`` inside, reads the same).
``run_summaries`` returns one summary per run id, using the wall time recorded in the
run's record when present (else device time, as stated in ``throughput_basis``); a run
with a record and no published row is listed too when it has something to show
(running, interrupted or failed, rows staged, rows that later runs replaced, or a rerun
that found every request done: ``nothing_to_do``), with its record's figures,
``rows_published: 0``, ``rows_staged`` (its rows waiting for the next run of the date, or
a running run's rows so far) and a ``note`` saying why and what to do. Every summary
carries ``started_at``/``finished_at`` and ``cost_spent_usd`` from the record (what the
run spent, rows since replaced included). Run
records are found where stages/layout.py ``run_record_candidates`` says: beside the
output root (``{uri}.runs/D/{run_id}.json``), else in ``{uri}/_runs/D/`` (earlier versions).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.date_lease import lease_holder
from pipeline.report.summary import summarize
from schemas.output import OUTPUT_SCHEMA
from stages.layout import LEGACY_RUNS, run_record_candidates, runs_root, staging_dirs
from stages.partition import is_outdated, list_files, read_file
from stages.write import STAGED_SUFFIX

_PREFIX = "run_date="


def list_output_files(uri: str) -> tuple[fsspec.AbstractFileSystem, list[tuple[str, str]]]:
    """(filesystem, [(run_date, committed file path)]) under ``uri``, sorted."""
    fs, root = fsspec.core.url_to_fs(uri)
    if not fs.exists(root):
        return fs, []
    out = []
    for d in sorted(fs.ls(root, detail=False)):
        name = d.rstrip("/").rsplit("/", 1)[-1]
        if name.startswith(_PREFIX):
            out += [(name[len(_PREFIX):], f) for f in list_files(fs, d, ".parquet")]
    return fs, out


def outdated_files(uri: str) -> dict[str, list[str]]:
    """{run_date: [committed files written with an older schema]} under ``uri`` (their
    footers only; stages/partition.py ``is_outdated``; `longdoc upgrade` rewrites them)."""
    fs, files = list_output_files(uri)
    out: dict[str, list[str]] = {}
    for run_date, f in files:
        if is_outdated(fs, f):
            out.setdefault(run_date, []).append(f)
    return out


def load_output(uri: str) -> pa.Table:
    fs, files = list_output_files(uri)
    tables = []
    for run_date, f in files:
        t = read_file(fs, f)
        t = t.add_column(1, OUTPUT_SCHEMA.field("run_date"), pa.array([run_date] * t.num_rows, pa.string()))
        tables.append(t.select(OUTPUT_SCHEMA.names).cast(OUTPUT_SCHEMA))
    return pa.concat_tables(tables) if tables else OUTPUT_SCHEMA.empty_table()


def _recorded(uri: str, run_date: str, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run record's summary and spec (stages/layout.py ``run_record_candidates``, the
    first that exists); ({}, {}) when there is none."""
    record = read_run_record(uri, run_date, run_id) or {}
    return record.get("summary", {}), record.get("spec", {})


def _settings(spec: dict[str, Any], rows: pa.Table | None) -> dict[str, Any]:
    """What a run read with: ``model``, ``method`` (its rows' values, else its spec's) and
    ``target_tokens`` (the spec's budget; None for a method without one)."""
    def one(column: str, fallback: Any) -> Any:
        if rows is not None and column in rows.column_names and rows.num_rows:
            values = sorted({v for v in rows.column(column).to_pylist() if v is not None})
            return ", ".join(values) if values else fallback
        return fallback

    compression, generation = spec.get("compression") or {}, spec.get("generation") or {}
    return {"model": one("model", generation.get("model")),
            "method": one("compression", compression.get("method")),
            "target_tokens": compression.get("target_tokens"),
            "max_new_tokens": generation.get("max_new_tokens")}


def read_run_record(uri: str, run_date: str, run_id: str) -> dict[str, Any] | None:
    """The whole run record of ``run_id`` (summary and spec), from where this version writes
    it or, for an output of an earlier version, from ``{uri}/_runs/``; None when neither has it."""
    fs, root = fsspec.core.url_to_fs(uri)
    for path in run_record_candidates(root, run_date, run_id):
        if fs.exists(path):
            with fs.open(path, "r") as f:
                return json.load(f)
    return None


def output_root_hint(uri: str) -> str:
    """Why ``uri`` holds no output, when it is a near miss: it does not exist, it is one
    date's folder, or output roots sit below it. "" otherwise."""
    fs, path = fsspec.core.url_to_fs(uri)
    path = path.rstrip("/")
    if not fs.exists(path):
        return ": it does not exist (pass the spec's output.uri, e.g. out/my-job)"
    name = path.rsplit("/", 1)[-1]
    if name.startswith(_PREFIX):
        return f": that is one date's folder; pass the output root above it ({uri.rstrip('/').rsplit('/', 1)[0]})"
    below = [d for d in fs.ls(path, detail=False)
             if fs.isdir(d) and any(c.rstrip("/").rsplit("/", 1)[-1].startswith(_PREFIX) for c in fs.ls(d, detail=False))]
    if below:
        names = ", ".join(f"{uri.rstrip('/')}/{d.rstrip('/').rsplit('/', 1)[-1]}" for d in sorted(below)[:3])
        return f": output roots are one level below it: {names}"
    return ""


def date_errors(uri: str, run_date: str, limit: int = 3) -> list[tuple[str, int, int]]:
    """The most frequent errors among the published rows of ``run_date`` (at most ``limit``),
    read from its files: ``frequent_errors`` of their ``error`` column."""
    from stages.write import partition_dir

    fs, part = fsspec.core.url_to_fs(partition_dir(uri, run_date))
    return frequent_errors((e for f in list_files(fs, part, ".parquet")
                            for e in read_file(fs, f, ["error"]).column("error").to_pylist()), limit)


def frequent_errors(errors: Iterable[str | None], limit: int = 3) -> list[tuple[str, int, int]]:
    """The most frequent of ``errors`` (None: a row without one), at most ``limit``: (a
    message, how many rows, how many distinct messages of its kind). A kind is the message
    with its quoted names and numbers left out, so nine documents too long for the context
    are one line, not nine: what a failed night says first."""
    from collections import Counter

    counts: Counter[str] = Counter()
    example: dict[str, set[str]] = {}
    for e in errors:
        if e:
            kind = _ERROR_DETAILS.sub("_", e)
            counts[kind] += 1
            example.setdefault(kind, set()).add(e)
    return [(min(example[k]), n, len(example[k])) for k, n in counts.most_common(limit)]


#: What differs between errors of one kind: quoted names, paths' line numbers, counts.
_ERROR_DETAILS = re.compile(r"'[^']*'|\"[^\"]*\"|\d+(?:\.\d+)?")


_DATE = re.compile(r"\d{4}-\d{2}-\d{2}$")
#: A run whose record still says it started (pipeline/runner.py writes it first, the full
#: record last): running now, or its driver ended without writing one.
UNRECORDED = "ended unrecorded"  # the status `report` gives such a run once its driver is known to be gone
#: How the note of a run holding its date's lease starts (``_running``).
_LIVE = "running: "


def recorded_runs(uri: str) -> list[tuple[str, str]]:
    """(run_date, run_id) of every run record under ``uri`` (this layout and earlier ones),
    sorted: the runs that happened, whether or not their rows are published."""
    fs, root = fsspec.core.url_to_fs(uri)
    found: set[tuple[str, str]] = set()
    for base in (runs_root(root), f"{root.rstrip('/')}/{LEGACY_RUNS}"):
        if not fs.exists(base):
            continue
        for folder in fs.ls(base, detail=False):
            run_date = folder.rstrip("/").rsplit("/", 1)[-1]
            if _DATE.match(run_date):  # not _staging, _ledger or _scratch
                found |= {(run_date, f.rsplit("/", 1)[-1][: -len(".json")]) for f in list_files(fs, folder, ".json")}
    return sorted(found)


def _staged_files(uri: str, run_date: str, run_id: str) -> tuple[fsspec.AbstractFileSystem, list[str]]:
    fs, root = fsspec.core.url_to_fs(uri)
    return fs, [f for folder in staging_dirs(root, run_date) for f in list_files(fs, f"{folder}/{run_id}", STAGED_SUFFIX)]


def staged_rows(uri: str, run_date: str, run_id: str) -> int:
    """Rows ``run_id`` staged for ``run_date`` that no run has published yet (an interrupted
    run's: the next run of the date publishes them first)."""
    fs, files = _staged_files(uri, run_date, run_id)
    n = 0
    for f in files:
        with fs.open(f, "rb") as fh:
            n += pq.ParquetFile(fh).metadata.num_rows
    return n


def staged_tables(uri: str, run_date: str, run_id: str) -> Iterator[pa.Table]:
    """The blocks ``run_id`` staged for ``run_date`` (FILE_SCHEMA), not yet published."""
    fs, files = _staged_files(uri, run_date, run_id)
    for f in files:
        yield read_file(fs, f)


def _running(uri: str, run_id: str, recorded: dict[str, Any], run_date: str,
             records: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]]) -> tuple[str, str]:
    """(status, note) of a run whose record still says ``running``. Its driver ended without
    writing its end (``UNRECORDED``) when a later run of its date recorded its end, or when
    the date's lease (pipeline/date_lease.py) names it but its holder is gone (or names
    another run). A run holding the lease is running; with no lease at all (a longdoc
    before leases wrote it, or the lease was removed) it may be either."""
    started = recorded.get("started_at") or ""
    later = [rid for (d, rid), (s, _) in records.items()
             if d == run_date and (s.get("started_at") or "") > started and s.get("status") not in (None, "running")]
    ended = "its driver ended without a record of its end (killed, or its machine or Ray head node lost)"
    if later:
        return UNRECORDED, f"{ended}; the later run {later[-1]} went on with the date"
    try:
        holder = lease_holder(uri, run_date)
    except OSError:  # a lease this user cannot read: say what the record says
        holder = None
    if holder is None:
        return "running", f"no record of its end: still running, or {ended}; run the date again to finish it"
    now = time.time()
    state = holder.state(now) if holder.run_id == run_id else "ended"
    if state == "ended":
        return UNRECORDED, f"{ended}; run the date again to finish it"
    if state == "stalled":
        return "running", (f"stalled: {holder.describe(now)}; its process is still there (stopped or hung?): "
                           "end it, then run the date again")
    return "running", f"{_LIVE}{holder.describe(now)}"


def run_summaries(uri: str, table: pa.Table) -> list[dict[str, Any]]:
    out = []
    runs = table.select(["run_date", "run_id"]).group_by(["run_date", "run_id"]).aggregate([])
    with_rows = {(r["run_date"], r["run_id"]) for r in runs.to_pylist()}
    runs = sorted(with_rows | set(recorded_runs(uri)))
    records = {run: _recorded(uri, *run) for run in runs}
    for run_date, run_id in runs:
        rec = {"run_date": run_date, "run_id": run_id}
        recorded, spec = records[(run_date, run_id)]
        # When it ran, and what it spent (its record's cost covers rows later runs replaced).
        when = {k: recorded.get(k) for k in ("started_at", "finished_at")}
        status, running_note = recorded.get("status"), None
        if status == "running":  # its record says it started, and no more (pipeline/runner.py)
            status, running_note = _running(uri, run_id, recorded, run_date, records)
        if (run_date, run_id) not in with_rows:  # its record's figures; its rows are not (or no longer) here
            staged = staged_rows(uri, run_date, run_id)
            keys = summarize(OUTPUT_SCHEMA.empty_table()).keys()
            figures = {k: recorded.get(k) for k in keys}
            if running_note and running_note.startswith(_LIVE):  # its rows so far; the run publishes them itself
                rows_note = f"{staged} row(s) done so far, staged: it publishes them when it ends"
                figures["rows"] = staged
            elif staged:
                rows_note = (f"{staged} row(s) staged, not yet published: run the date again (longdoc run SPEC "
                             f"--date {run_date}) to publish them")
            elif recorded.get("rows"):
                rows_note = "its rows were replaced by a later run of the date"
            elif recorded.get("skipped") and status in ("succeeded", "partial"):
                rows_note = f"nothing left to do: the date's {recorded['skipped']} request(s) were already done"
                figures["nothing_to_do"] = True
            elif status in ("interrupted", "failed"):
                rows_note = f"no row was staged: run the date again (longdoc run SPEC --date {run_date})"
            elif status in ("running", UNRECORDED):
                rows_note = None  # the running note says it
            else:
                continue  # a run that had nothing to do and said so: nothing to show
            note = "; ".join(n for n in (running_note, rows_note) if n) or None
            out.append({**rec, "job": recorded.get("job"), **_settings(spec, None), **figures, **when,
                        "status": status, "cost_spent_usd": recorded.get("cost_usd"),
                        "rows_published": 0, "rows_staged": staged, "note": note})
            continue
        mask = pc.and_(pc.equal(table["run_date"], run_date), pc.equal(table["run_id"], run_id))
        rows = table.filter(mask)
        # A run id resumed: its rows came from every attempt, and so did their time.
        s = summarize(rows, wall_s=recorded.get("wall_s_all_attempts", recorded.get("wall_s")))
        replaced = (recorded.get("rows") or 0) - rows.num_rows
        notes = [running_note] if running_note else []
        if replaced > 0:  # e.g. its error row, fixed and redone by a later run
            notes.append(f"{replaced} of its {recorded['rows']} row(s) were replaced by a later run of the date")
        # The run's own status (succeeded / partial / failed / interrupted), as it recorded it.
        out.append({**rec, "job": rows.column("job")[0].as_py(), **_settings(spec, rows), **s, **when,
                    "retried": recorded.get("retried"),  # what the run said; rows cannot tell
                    "cost_spent_usd": recorded.get("cost_usd", s["cost_usd"]),
                    "status": status, **({"note": "; ".join(notes)} if notes else {})})
    return out
