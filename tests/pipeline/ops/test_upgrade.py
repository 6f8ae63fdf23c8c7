"""`longdoc upgrade`: an output whose dates an older schema wrote reads as one table again."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd
import polars as pl
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.date_lease import DateLease
from pipeline.ops.upgrade import upgrade
from schemas.output import FILE_SCHEMA, SCHEMA_VERSION
from stages.partition import commit_date
from stages.rows import rows_to_batch
from stages.write import WriteStage

NEW = FILE_SCHEMA.names[-1]  # the column the latest schema version added


def _date(root: Path, date: str, older: bool) -> None:
    """Commit two rows on ``date``; ``older``: then rewrite the file as the schema version
    before the current one wrote it (its last column missing)."""
    rows = [{"run_id": "r", "run_date": date, "job": "j", "doc_id": f"d{i}", "request_id": f"{date}-{i}",
             "output_text": f"answer {i}", "error": None} for i in range(2)]
    WriteStage(str(root), date, "r")(rows_to_batch(rows))
    commit_date(str(root), date, "r")
    if older:
        (path,) = (root / f"run_date={date}").glob("*.parquet")
        t = pq.read_table(path).drop_columns([NEW])
        pq.write_table(t.replace_schema_metadata({b"longdoc.schema_version": str(SCHEMA_VERSION - 1).encode()}), path)


def test_upgrade_makes_a_folder_of_two_schema_versions_one_table_for_every_reader(tmp_path):
    root = tmp_path / "out"
    _date(root, "2026-01-01", older=True)
    _date(root, "2026-01-02", older=False)
    # Before: Polars refuses the folder; pandas takes the first file's columns.
    with pytest.raises(Exception, match=NEW):
        pl.read_parquet(root)
    assert NEW not in pd.read_parquet(root).columns
    cli = CliRunner()
    report = cli.invoke(app, ["report", str(root)])
    assert report.exit_code == 0 and "1 file(s) of 1 date(s) (2026-01-01) were written by an earlier" in report.output
    assert f"longdoc upgrade {root}" in report.output
    dry = cli.invoke(app, ["upgrade", str(root), "--dry-run"])
    assert dry.exit_code == 0 and "2026-01-01: 1 file(s) to upgrade" in dry.output and "would rewrite 1" in dry.output
    assert NEW not in pq.read_schema(next((root / "run_date=2026-01-01").glob("*.parquet"))).names
    done = cli.invoke(app, ["upgrade", str(root)])
    assert done.exit_code == 0 and "rewrote 1 file(s) of 1 date(s)" in done.output
    # After: every reader, no options, every date with every column; the rows unchanged.
    df = pd.read_parquet(root)
    assert NEW in df.columns and len(df) == 4 and sorted(df["output_text"]) == ["answer 0", "answer 0", "answer 1",
                                                                                "answer 1"]
    assert pl.read_parquet(root).height == 4
    got = duckdb.sql(f"select count(*), count(distinct request_id) from read_parquet('{root}/**/*.parquet') "
                     f"where {NEW} is null").fetchall()
    assert got == [(4, 4)]
    again = cli.invoke(app, ["upgrade", str(root)])
    assert "nothing to do" in again.output
    assert "earlier longdoc" not in cli.invoke(app, ["report", str(root)]).output


def test_upgrade_of_a_missing_output_is_refused_by_name(tmp_path, capsys):
    out = CliRunner().invoke(app, ["upgrade", str(tmp_path / "nope")])
    assert out.exit_code == 2 and "nope" in out.output and "does not exist" in out.output
    (tmp_path / "out" / "job").mkdir(parents=True)  # the spec's output.uri is one level below
    with pytest.raises(typer.Exit):
        upgrade(str(tmp_path / "out"), dry_run=False)
    assert "no output files under" in capsys.readouterr().err


def test_upgrade_leaves_a_date_that_a_run_writes_now_to_that_run(tmp_path):
    """Rewriting a date's files beside a run that publishes into it could undo its publish;
    the run's own commit upgrades its date."""
    root = tmp_path / "out"
    _date(root, "2026-01-01", older=True)
    _date(root, "2026-01-02", older=True)
    lease = DateLease(str(root), "2026-01-02", "nightly", "j")
    lease.acquire()
    try:
        done = CliRunner().invoke(app, ["upgrade", str(root)])
    finally:
        lease.release()
    assert done.exit_code == 75 and "2026-01-02: 1 file(s) left: run nightly" in done.output
    assert "rewrote 1 file(s) of 1 date(s)" in done.output
    assert NEW in pq.read_schema(next((root / "run_date=2026-01-01").glob("*.parquet"))).names
    assert NEW not in pq.read_schema(next((root / "run_date=2026-01-02").glob("*.parquet"))).names


def test_upgrade_refuses_a_date_with_a_planted_link_and_rewrites_nothing(tmp_path):
    """A link in the output's folders (stages/links.py) is never followed: upgrade's rewrite
    of the date would write its temporary files through a linked ``_scratch``."""
    root = tmp_path / "out"
    _date(root, "2026-01-01", older=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    scratch = tmp_path / "out.runs" / "_scratch"
    if scratch.exists():  # the commit's own, left empty
        scratch.rmdir()
    scratch.symlink_to(elsewhere)
    done = CliRunner().invoke(app, ["upgrade", str(root)])
    assert done.exit_code == 2, done.output
    assert f"{scratch} is a symbolic link (to {elsewhere})" in done.output and "nothing of 2026-01-01" in done.output
    assert NEW not in pq.read_schema(next((root / "run_date=2026-01-01").glob("*.parquet"))).names
    assert list(elsewhere.iterdir()) == []
