"""Atomic writes on a local disk and on a real S3-compatible server (moto, loopback)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from s3_server import moto_s3

from schemas.output import FILE_SCHEMA, rows_to_table
from stages.rows import rows_to_batch
from stages.write import (
    WriteStage,
    put_file_atomic,
    staged_file_name,
    write_bytes_atomic,
    write_table_atomic,
)


def _rows(n: int, start: int = 0) -> list[dict]:
    return [{"run_id": "r", "run_date": "2026-01-01", "job": "j", "doc_id": f"d{i}", "request_id": f"q{i}",
             "output_text": f"answer {i}"} for i in range(start, start + n)]


def _bad_table() -> pa.Table:
    """A table the Parquet writer refuses part-way: a required column holding a null."""
    t = rows_to_table(_rows(3), FILE_SCHEMA)
    i = t.schema.get_field_index("doc_id")
    return t.set_column(i, t.schema.field(i), pa.array(["d0", None, "d2"], pa.string()))


@pytest.fixture(scope="module")
def s3_server():
    with moto_s3() as server:
        server.filesystem().mkdir("bucket")
        yield server


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The server, and s3:// URIs resolving to it the way users point at MinIO (env vars)."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server, s3_server.filesystem()


def test_local_write_replaces_whole_or_not_at_all(tmp_path):
    uri = str(tmp_path / "d" / "f.parquet")
    write_table_atomic(rows_to_table(_rows(2), FILE_SCHEMA), uri)
    with pytest.raises(pa.ArrowInvalid, match="non-nullable"):
        write_table_atomic(_bad_table(), uri)
    assert pq.read_table(uri).column("doc_id").to_pylist() == ["d0", "d1"]  # the old file, intact
    assert os.listdir(tmp_path / "d") == ["f.parquet"]  # no temporary file left behind
    write_bytes_atomic(b"{}", str(tmp_path / "d" / "s.json"))
    assert (tmp_path / "d" / "s.json").read_bytes() == b"{}"


def test_a_scratch_folder_holds_the_temporary_file_and_is_skipped_across_filesystems(tmp_path, monkeypatch):
    target, scratch = tmp_path / "d" / "f.parquet", tmp_path / "scratch"
    made: list[str] = []
    rename = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (made.append(os.path.dirname(src)), rename(src, dst)))
    write_table_atomic(rows_to_table(_rows(2), FILE_SCHEMA), str(target), str(scratch))
    assert made == [str(scratch)] and os.listdir(scratch) == []
    with pytest.raises(pa.ArrowInvalid):  # a failed write leaves neither file behind
        write_table_atomic(_bad_table(), str(target), str(scratch))
    assert os.listdir(scratch) == [] and os.listdir(target.parent) == ["f.parquet"]
    # A scratch folder on another filesystem (st_dev differs) cannot be renamed from:
    # the temporary file goes beside the target instead.
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: os.stat_result(
        (*real_stat(p)[:2], 12345 if str(p) == str(scratch) else real_stat(p).st_dev, *real_stat(p)[3:]))
        if not a and not k else real_stat(p, *a, **k))
    src = tmp_path / "local.bin"
    src.write_bytes(b"payload")
    put_file_atomic(str(src), str(target), str(scratch))
    assert made[-1] == str(target.parent) and target.read_bytes() == b"payload"


def test_an_open_s3_stream_completes_the_upload_even_when_the_writer_raises(s3):
    """Why write_table_atomic never streams to an object store: fsspec's __exit__
    closes (= completes) the upload on an exception, publishing a truncated object."""
    _, fs = s3
    with pytest.raises(RuntimeError), fs.open("bucket/naive.parquet", "wb") as f:
        f.write(b"PAR1 half a file")
        raise RuntimeError("writer failed mid-way")
    assert fs.cat("bucket/naive.parquet") == b"PAR1 half a file"


def test_s3_write_leaves_no_object_on_failure_and_replaces_atomically(s3):
    _, fs = s3
    with pytest.raises(pa.ArrowInvalid):
        write_table_atomic(_bad_table(), "s3://bucket/t/new.parquet")
    assert not fs.exists("bucket/t/new.parquet")
    write_table_atomic(rows_to_table(_rows(2), FILE_SCHEMA), "s3://bucket/t/f.parquet")
    with pytest.raises(pa.ArrowInvalid):
        write_table_atomic(_bad_table(), "s3://bucket/t/f.parquet")
    with fs.open("bucket/t/f.parquet", "rb") as fh:
        assert pq.read_table(fh).column("doc_id").to_pylist() == ["d0", "d1"]
    assert fs.ls("bucket/t", detail=False) == ["bucket/t/f.parquet"]


def test_put_file_atomic_uploads_a_multipart_sized_file(s3, tmp_path):
    _, fs = s3
    local = tmp_path / "big.bin"
    data = np.random.default_rng(0).bytes(12 * 2**20)  # > s3fs's 5 MiB part size
    local.write_bytes(data)
    put_file_atomic(str(local), "s3://bucket/big/big.bin")
    assert fs.cat("bucket/big/big.bin") == data
    assert fs.ls("bucket/big", detail=False) == ["bucket/big/big.bin"]


def test_write_stage_stages_a_block_once_under_a_deterministic_name(tmp_path):
    stage = WriteStage(str(tmp_path / "out"), "2026-01-01", "run-1")
    figures = stage(rows_to_batch(_rows(3)))
    again = stage(rows_to_batch(list(reversed(_rows(3)))))  # a Ray retry of the same block
    staged = list((tmp_path / "out.runs" / "_staging" / "2026-01-01" / "run-1").iterdir())  # beside out/
    assert [p.name for p in staged] == [staged_file_name(["q0", "q1", "q2"])]
    table = pq.read_table(staged[0])
    assert table.schema.names == FILE_SCHEMA.names  # no run_date inside: it is the folder
    assert table.num_rows == 3 and figures.num_rows == again.num_rows == 3
    # texts and kept positions do not travel back to the driver; the tally's figures do
    assert not {"output_text", "context", "kept_spans"} & set(figures.column_names)
    assert {"request_id", "error", "output_tokens", "e2e_s"} <= set(figures.column_names)



def test_a_failed_rename_leaves_no_temporary_file_and_an_empty_block_stages_nothing(tmp_path):
    """The temporary file goes whatever step fails, the rename included (here the target is a
    folder: os.replace refuses it); an empty block has nothing to stage."""
    target = tmp_path / "d" / "f.parquet"
    target.mkdir(parents=True)
    (target / "keep").write_bytes(b"")
    with pytest.raises(OSError):
        write_bytes_atomic(b"payload", str(target))
    assert os.listdir(tmp_path / "d") == ["f.parquet"] and os.listdir(target) == ["keep"]
    stage = WriteStage(str(tmp_path / "out"), "2026-01-01", "run-1")
    assert stage(rows_to_batch([])).num_rows == 0
    assert not (tmp_path / "out.runs").exists()
