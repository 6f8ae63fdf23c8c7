"""Committing staged blocks: compaction, in-place replacement of retried rows, crash safety."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.output import FILE_SCHEMA, INPUT, RETRYABLE, SCHEMA_VERSION, rows_to_table
from stages.layout import runs_root
from stages.partition import commit_date, is_outdated, read_file, scan_date, upgrade_date
from stages.rows import rows_to_batch
from stages.write import WriteStage

DATE = "2026-05-01"


@pytest.fixture
def root(tmp_path) -> Path:
    """An output root with a parent: its staged blocks go to the sibling ``out.runs/``."""
    return tmp_path / "out"


def _staging(root: Path) -> Path:
    return Path(runs_root(str(root))) / "_staging"


def _rows(ids: range, error: str | None = None, kind: str | None = None, run_id: str = "r1") -> list[dict]:
    return [{"run_id": run_id, "run_date": DATE, "job": "j", "doc_id": f"d{i}", "request_id": f"q{i:03d}",
             "output_text": None if error else f"answer {i} by {run_id}", "error": error, "error_kind": kind}
            for i in ids]


def _stage(root: Path, run_id: str, *blocks: list[dict]) -> None:
    stage = WriteStage(str(root), DATE, run_id)
    for rows in blocks:
        stage(rows_to_batch(rows))


def _visible(root: Path) -> dict[str, dict]:
    """request_id -> row, over what a reader sees; fails on a duplicate request."""
    out: dict[str, dict] = {}
    for f in sorted((root / f"run_date={DATE}").glob("*.parquet")):
        for r in pq.read_table(f).to_pylist():
            assert r["request_id"] not in out, f"request {r['request_id']} twice"
            out[r["request_id"]] = r
    return out


def test_blocks_are_compacted_into_one_file_and_staging_is_emptied(root):
    _stage(root, "r1", _rows(range(0, 4)), _rows(range(4, 8)), _rows(range(8, 10), "read: empty", INPUT))
    assert _visible(root) == {}  # nothing visible before the commit
    assert len(scan_date(str(root), DATE).rows) == 10  # but a resume already sees them
    out = commit_date(str(root), DATE, "r1")
    assert out == {"staged_files": 3, "replaced": 0, "added": 10, "dropped": 0, "files_written": 1,
                   "upgraded": 0}
    files = list((root / f"run_date={DATE}").glob("*.parquet"))
    assert [f.name.startswith("part-r1-") for f in files] == [True]
    assert len(_visible(root)) == 10
    assert not list((_staging(root)).rglob("*.staged"))
    assert scan_date(str(root), DATE).counts() == {"rows": 10, "failed": 2, "errors_input": 2,
                                                       "errors_retryable": 0}


def test_staged_blocks_live_beside_the_output_root_never_in_it(root):
    _stage(root, "r1", _rows(range(0, 4)))
    assert not root.exists() and list(_staging(root).rglob("*.staged"))  # a reader of root sees nothing
    commit_date(str(root), DATE, "r1")
    assert [p.name for p in root.iterdir()] == [f"run_date={DATE}"]
    assert {p.suffix for p in root.rglob("*") if p.is_file()} == {".parquet"}


def test_a_reader_listing_the_partition_mid_publish_sees_only_finished_parquet(root, monkeypatch):
    """Polars refuses a folder holding any non-Parquet file, hidden or not: every rename
    into ``run_date=D/`` (a new compacted file and a rewritten one) must come from outside."""
    import os

    import polars as pl

    part = root / f"run_date={DATE}"
    seen: list[tuple[set[str], int]] = []
    rename = os.replace

    def spy(src, dst):  # the real rename, after looking at the folder the way a reader would
        if os.path.isdir(part):
            seen.append(({p.suffix for p in part.iterdir()}, pl.read_parquet(str(root)).height))
        assert not str(src).startswith(str(part)), f"temporary file inside the partition: {src}"
        return rename(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    _stage(root, "r1", _rows(range(0, 3)), _rows(range(3, 5), "generate: OSError", RETRYABLE))
    monkeypatch.setattr(os, "replace", rename)  # staging is outside the root anyway
    commit_date(str(root), DATE, "r1")
    _stage(root, "r2", _rows(range(3, 5), run_id="r2"), _rows(range(5, 7), run_id="r2"))
    monkeypatch.setattr(os, "replace", spy)
    commit_date(str(root), DATE, "r2")  # rewrites the first file, then adds a second
    assert seen == [({".parquet"}, 5), ({".parquet"}, 5)]
    assert pl.read_parquet(str(root)).height == 7
    assert not list(Path(runs_root(str(root)), "_scratch").iterdir())  # nothing left behind


def test_blocks_an_earlier_version_staged_inside_the_root_are_published_and_removed(root):
    """A crashed run of an earlier version left its blocks in ``{root}/_staging/D/``: the next
    run's scan counts them (no request redone) and its publish takes them, once."""
    _stage(root, "r0", _rows(range(0, 3)), _rows(range(3, 4), "generate: OSError", RETRYABLE))
    legacy = root / "_staging"
    shutil.move(_staging(root), legacy)  # where versions before {root}.runs/ staged them
    scan = scan_date(str(root), DATE)
    assert len(scan.rows) == 4 and scan.skip("retryable") == {"q000", "q001", "q002"}
    _stage(root, "r1", _rows(range(3, 5), run_id="r1"))  # the rerun redoes q003, adds q004
    out = commit_date(str(root), DATE, "r1")
    assert out["staged_files"] == 3 and out["added"] == 5
    rows = _visible(root)
    assert sorted(rows) == [f"q{i:03d}" for i in range(5)] and rows["q003"]["run_id"] == "r1"
    assert not list(legacy.rglob("*.staged")) and not list(_staging(root).rglob("*.staged"))


def test_compaction_splits_at_the_target_size(root):
    _stage(root, "r1", _rows(range(0, 3)), _rows(range(3, 6)), _rows(range(6, 9)))
    out = commit_date(str(root), DATE, "r1", target_bytes=1)  # every block exceeds it
    assert out["files_written"] == 3 and len(_visible(root)) == 9


def test_a_compacted_file_has_row_groups_of_about_the_row_group_size(root, monkeypatch):
    import stages.partition as partition

    _stage(root, "r1", *[_rows(range(i, i + 2)) for i in range(0, 20, 2)])  # 10 blocks
    one_block = partition.read_file(*partition.fsspec.core.url_to_fs(
        str(next((_staging(root)).rglob("*.staged")))))
    # Three blocks fill a row group: a new group starts after every third block.
    monkeypatch.setattr(partition, "ROW_GROUP_BYTES", 3 * one_block.nbytes)
    commit_date(str(root), DATE, "r1")
    [f] = (root / f"run_date={DATE}").glob("*.parquet")
    meta = pq.ParquetFile(f).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [6, 6, 6, 2]
    assert len(_visible(root)) == 20


def test_a_retried_row_replaces_the_old_error_in_its_file(root):
    _stage(root, "r1", _rows(range(0, 3)), _rows(range(3, 5), "generate: ActorDiedError", RETRYABLE))
    commit_date(str(root), DATE, "r1")
    (before,) = (root / f"run_date={DATE}").glob("*.parquet")
    scan = scan_date(str(root), DATE)
    assert scan.skip("retryable") == {"q000", "q001", "q002"} and len(scan.skip("none")) == 5
    _stage(root, "r2", _rows(range(3, 5), run_id="r2"))  # the rerun redoes q003, q004
    out = commit_date(str(root), DATE, "r2")
    assert out["replaced"] == 2 and out["added"] == 0
    assert list((root / f"run_date={DATE}").glob("*.parquet")) == [before]  # same file, rewritten
    rows = _visible(root)
    assert len(rows) == 5 and all(r["error"] is None for r in rows.values())
    assert rows["q003"]["output_text"] == "answer 3 by r2" and rows["q000"]["run_id"] == "r1"


def test_a_commit_interrupted_before_cleanup_is_finished_by_the_next_without_duplicates(root):
    _stage(root, "r1", _rows(range(0, 2)), _rows(range(2, 4), "generate: OSError", RETRYABLE))
    commit_date(str(root), DATE, "r1")
    _stage(root, "r2", _rows(range(2, 4), run_id="r2"), _rows(range(4, 6), run_id="r2"))
    # Crash after every file was published but before the staged copies were deleted:
    saved = root.parent / "saved"
    shutil.copytree(_staging(root), saved)
    commit_date(str(root), DATE, "r2")
    published = {f.name: f.stat().st_mtime_ns for f in (root / f"run_date={DATE}").glob("*.parquet")}
    shutil.rmtree(_staging(root))
    shutil.copytree(saved, _staging(root))
    assert len(scan_date(str(root), DATE).rows) == 6  # a reader mid-way: each request once
    out = commit_date(str(root), DATE, "r3")
    assert out["files_written"] == 0 and out["staged_files"] == 2  # already published: cleanup only
    assert {f.name: f.stat().st_mtime_ns for f in (root / f"run_date={DATE}").glob("*.parquet")} == published
    rows = _visible(root)
    assert sorted(rows) == [f"q{i:03d}" for i in range(6)] and all(r["error"] is None for r in rows.values())


def test_files_written_before_schema_2_are_read_conformed(root):
    part = root / f"run_date={DATE}"
    part.mkdir(parents=True)
    pq.write_table(pa.table({"run_id": ["r0"], "run_date": [DATE], "job": ["j"], "doc_id": ["d"],
                             "request_id": ["q"], "error": ["boom"]}), part / "part-old.parquet")
    t = read_file(scan_date(str(root), DATE).fs, str(part / "part-old.parquet"))
    assert "run_date" not in t.column_names
    assert t.column("schema_version").to_pylist() == [1] and t.column("error_kind").to_pylist() == [None]
    assert scan_date(str(root), DATE).skip("retryable") == frozenset()  # unknown kind: retried


def test_stale_error_rows_are_dropped_and_a_file_of_only_stale_rows_removed(root):
    # Run 1: file A holds an unreadable-file error row plus two answers; file B only errors.
    _stage(root, "r1", _rows(range(0, 2)) + _rows(range(2, 3), "read: cannot read f", RETRYABLE))
    commit_date(str(root), DATE, "r1")
    _stage(root, "r2", _rows(range(5, 7), "read: cannot read g", RETRYABLE, run_id="r2"))
    commit_date(str(root), DATE, "r2")
    assert len(list((root / f"run_date={DATE}").glob("*.parquet"))) == 2
    # Run 3 reads both files now: new requests, and the file-level error rows are stale.
    _stage(root, "r3", _rows(range(10, 12), run_id="r3"))
    out = commit_date(str(root), DATE, "r3", stale=frozenset({"q002", "q005", "q006"}))
    assert out["dropped"] == 3 and out["added"] == 2
    seen = _visible(root)
    assert sorted(seen) == ["q000", "q001", "q010", "q011"]
    assert all(r["error"] is None for r in seen.values())
    assert len(list((root / f"run_date={DATE}").glob("*.parquet"))) == 2  # B removed, r3's added
    # Dropping is idempotent: a second commit with the same stale ids changes nothing.
    again = commit_date(str(root), DATE, "r3", stale=frozenset({"q002", "q005", "q006"}))
    assert again["dropped"] == 0 and sorted(_visible(root)) == sorted(seen)


def test_a_request_staged_twice_in_one_block_is_published_once(root):
    """An input row repeated exactly (same id, text, question: the same request_id) reaches
    the writer twice, even inside one block: the table holds the request once."""
    rows = _rows(range(3))
    _stage(root, "r1", rows + [dict(rows[1])])
    commit_date(str(root), DATE, "r1")
    assert sorted(_visible(root)) == ["q000", "q001", "q002"]
    # ...and a retry that stages it twice again replaces it in place, once.
    again = _rows([1], run_id="r2")
    _stage(root, "r2", again + again)
    commit_date(str(root), DATE, "r2")
    visible = _visible(root)
    assert len(visible) == 3 and visible["q001"]["output_text"] == "answer 1 by r2"


def test_a_complete_run_supersedes_only_its_own_documents_and_the_input_errors_of_files_it_read(root):
    from stages.partition import RunRequests, superseded

    rows = _rows(range(4))
    for r, source in zip(rows, ["a.jsonl", "a.jsonl", "b.jsonl", "a.jsonl"], strict=True):
        r.update(prompt="Q", source_uri=source)
    bad_a, bad_b = (_rows(range(8, 10), error="read: a line is not valid JSON", kind=INPUT))
    bad_a.update(prompt="Q", source_uri="a.jsonl", doc_id="a.jsonl:5")
    bad_b.update(prompt="Q", source_uri="b.jsonl", doc_id="b.jsonl:2")
    _stage(root, "r1", [*rows, bad_a, bad_b])
    commit_date(str(root), DATE, "r1")
    # The new run read a.jsonl whole (not b.jsonl): d0 got a new id (another spec), d1 the
    # same one, d3 is gone from the input; a.jsonl's malformed line no longer yields its row.
    run = RunRequests(ids={"new-d0", "q001"}, keys={("d0", "Q"), ("d1", "Q")}, files=frozenset({"a.jsonl"}))
    assert superseded(str(root), DATE, run) == {"q000", "q008"}
    assert superseded(str(root), DATE, RunRequests(ids={"q001"}, keys={("d1", "Q")})) == frozenset()
    # A limited run that read a.jsonl only: d2's row came from b.jsonl, which it never read, so
    # the same document id read from a.jsonl replaces nothing of b.jsonl's (the review's data loss).
    limited = RunRequests(ids={"new-d2"}, keys={("d2", "Q")}, covered=frozenset({"a.jsonl"}))
    assert superseded(str(root), DATE, limited) == frozenset()
    assert superseded(str(root), DATE, replace(limited, covered=frozenset({"a.jsonl", "b.jsonl"}))) == {"q002"}


def _older_version(path: Path) -> None:
    """Rewrite a committed file as the schema version before the current one wrote it: its
    last column missing, the version in its metadata one lower."""
    t = pq.read_table(path)
    old = t.drop_columns([FILE_SCHEMA.names[-1]])
    pq.write_table(old.replace_schema_metadata({b"longdoc.schema_version": str(SCHEMA_VERSION - 1).encode()}), path)


def test_a_commit_gives_its_dates_files_of_an_older_schema_the_current_columns(root):
    _stage(root, "r1", _rows(range(0, 3)), _rows(range(3, 4), "generate: ActorDiedError", RETRYABLE))
    commit_date(str(root), DATE, "r1")
    (first,) = (root / f"run_date={DATE}").glob("*.parquet")
    _older_version(first)
    fs = scan_date(str(root), DATE).fs
    assert is_outdated(fs, str(first))
    _stage(root, "r2", _rows(range(4, 6), run_id="r2"))  # new requests: the old file is not otherwise touched
    out = commit_date(str(root), DATE, "r2")
    assert out["upgraded"] == 1 and out["added"] == 2
    files = sorted((root / f"run_date={DATE}").glob("*.parquet"))
    assert len(files) == 2 and not any(is_outdated(fs, str(f)) for f in files)
    assert all(pq.read_schema(f).names == FILE_SCHEMA.names for f in files)
    rows = _visible(root)  # every row once, its values kept
    assert sorted(rows) == [f"q{i:03d}" for i in range(6)]
    assert rows["q000"]["output_text"] == "answer 0 by r1" and rows["q003"]["error"] == "generate: ActorDiedError"
    assert rows["q000"][FILE_SCHEMA.names[-1]] is None


def test_upgrade_date_rewrites_only_the_outdated_files_and_then_nothing(root):
    _stage(root, "r1", _rows(range(0, 2)))
    commit_date(str(root), DATE, "r1")
    _stage(root, "r2", _rows(range(2, 4), run_id="r2"))
    commit_date(str(root), DATE, "r2")
    a, b = sorted((root / f"run_date={DATE}").glob("*.parquet"))
    _older_version(a)
    untouched = b.stat().st_mtime_ns
    assert upgrade_date(str(root), DATE) == 1
    assert b.stat().st_mtime_ns == untouched and pq.read_schema(a).names == FILE_SCHEMA.names
    assert upgrade_date(str(root), DATE) == 0
    assert sorted(_visible(root)) == [f"q{i:03d}" for i in range(4)]


def test_a_publish_whose_check_fails_stops_between_files_and_the_next_commit_finishes_it(root):
    """A holder that lost its date (pipeline/date_lease.py) stops before its next file."""
    _stage(root, "r1", _rows(range(0, 3)), _rows(range(3, 6)), _rows(range(6, 9)))
    calls = []

    class Lost(KeyboardInterrupt):
        pass

    def check() -> None:
        calls.append(1)
        if len(calls) > 1:
            raise Lost

    with pytest.raises(Lost):
        commit_date(str(root), DATE, "r1", target_bytes=1, check=check)
    assert len(list((root / f"run_date={DATE}").glob("*.parquet"))) == 1  # one file, then it stopped
    assert len(scan_date(str(root), DATE).rows) == 9  # a reader mid-way: each request once
    out = commit_date(str(root), DATE, "r2", target_bytes=1)
    assert out["files_written"] == 2 and len(_visible(root)) == 9 and not list(_staging(root).rglob("*.staged"))


def test_a_request_staged_by_two_runs_publishes_the_success_else_the_later_error(root):
    """A straggler task of a killed driver (run r1) may have staged a request the rerun (r2)
    staged too: a success beats an error whichever came later, and between two errors the
    later path wins (deterministic)."""
    _stage(root, "r1", _rows(range(0, 1)), _rows(range(1, 2), "generate: OSError (r1)", RETRYABLE))
    _stage(root, "r2", _rows(range(0, 1), "generate: OSError (r2)", RETRYABLE),
           _rows(range(1, 2), "generate: OSError (r2)", RETRYABLE))
    commit_date(str(root), DATE, "r2")
    rows = _visible(root)
    assert (rows["q000"]["error"], rows["q000"]["output_text"]) == (None, "answer 0 by r1")
    assert rows["q001"]["error"] == "generate: OSError (r2)"


def test_an_error_row_written_before_error_kind_counts_as_retryable(root):
    """A file of an earlier longdoc has no error_kind: its failed rows are retried by default
    (schemas/output.py is_retried), so the date's counts call them retryable."""
    part = root / f"run_date={DATE}"
    part.mkdir(parents=True)
    old = rows_to_table(_rows(range(0, 2), "generate: OSError"), FILE_SCHEMA).drop_columns(["error_kind"])
    pq.write_table(old, part / "part-old.parquet")
    assert scan_date(str(root), DATE).counts() == {"rows": 2, "failed": 2, "errors_input": 0, "errors_retryable": 2}


def test_a_scan_skips_links_planted_in_the_output_tree(tmp_path, root):
    """A linked file in the partition (another output's rows) and a linked date folder (one
    date's rows under two dates) are not the date's: a scan counts neither; the output root
    itself being a link (a bigger disk) reads as usual."""
    _stage(root, "r1", _rows(range(0, 4)))
    commit_date(str(root), DATE, "r1")
    other = tmp_path / "other"
    _stage(other, "r9", _rows(range(10, 13), run_id="r9"))
    commit_date(str(other), DATE, "r9")
    (foreign,) = (other / f"run_date={DATE}").glob("*.parquet")
    (root / f"run_date={DATE}" / "part-planted.parquet").symlink_to(foreign)
    (root / "run_date=2026-05-02").symlink_to(root / f"run_date={DATE}")
    assert sorted(scan_date(str(root), DATE).rows) == [f"q{i:03d}" for i in range(4)]
    assert scan_date(str(root), "2026-05-02").rows == {}
    linked = tmp_path / "linked-out"
    linked.symlink_to(other)
    assert sorted(scan_date(str(linked), DATE).rows) == ["q010", "q011", "q012"]
