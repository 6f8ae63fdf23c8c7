"""Read an output table back and summarise it per run (``longdoc report``).

Contract: ``load_output(uri)`` returns every committed row under ``uri`` (all run
dates) with OUTPUT_SCHEMA, ``run_date`` taken from the hive folder name; staged files,
run records and hidden temporary files are not rows (only ``run_date=D/*.parquet``
is read, so an output of an earlier version, with ``_runs/`` inside, reads the same).
``run_summaries`` returns one summary per run id, using the wall time recorded in the
run's record when present (else device time, as stated in ``throughput_basis``). Run
records are found where stages/layout.py ``run_record_candidates`` says: beside the
output root (``{uri}.runs/D/{run_id}.json``), else in ``{uri}/_runs/D/`` (earlier versions).
"""

from __future__ import annotations

import json
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.report.summary import summarize
from schemas.output import OUTPUT_SCHEMA
from stages.layout import run_record_candidates
from stages.partition import list_files, read_file

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


def load_output(uri: str) -> pa.Table:
    fs, files = list_output_files(uri)
    tables = []
    for run_date, f in files:
        t = read_file(fs, f)
        t = t.add_column(1, OUTPUT_SCHEMA.field("run_date"), pa.array([run_date] * t.num_rows, pa.string()))
        tables.append(t.select(OUTPUT_SCHEMA.names).cast(OUTPUT_SCHEMA))
    return pa.concat_tables(tables) if tables else OUTPUT_SCHEMA.empty_table()


def _recorded(uri: str, run_date: str, run_id: str) -> dict[str, Any]:
    """The run record's summary (stages/layout.py ``run_record_candidates``, the first that
    exists); {} when there is none."""
    record = read_run_record(uri, run_date, run_id)
    return record.get("summary", {}) if record else {}


def read_run_record(uri: str, run_date: str, run_id: str) -> dict[str, Any] | None:
    """The whole run record of ``run_id`` (summary and spec), from where this version writes
    it or, for an output of an earlier version, from ``{uri}/_runs/``; None when neither has it."""
    fs, root = fsspec.core.url_to_fs(uri)
    for path in run_record_candidates(root, run_date, run_id):
        if fs.exists(path):
            with fs.open(path, "r") as f:
                return json.load(f)
    return None


def run_summaries(uri: str, table: pa.Table) -> list[dict[str, Any]]:
    out = []
    runs = table.select(["run_date", "run_id"]).group_by(["run_date", "run_id"]).aggregate([])
    for rec in sorted(runs.to_pylist(), key=lambda r: (r["run_date"], r["run_id"])):
        mask = pc.and_(pc.equal(table["run_date"], rec["run_date"]), pc.equal(table["run_id"], rec["run_id"]))
        recorded = _recorded(uri, rec["run_date"], rec["run_id"])
        # A run id resumed: its rows came from every attempt, and so did their time.
        s = summarize(table.filter(mask), wall_s=recorded.get("wall_s_all_attempts", recorded.get("wall_s")))
        # The run's own status (succeeded / partial / failed / interrupted), as it recorded it.
        out.append({**rec, **s, "status": recorded.get("status")})
    return out
