"""Write stage: output rows -> one staged Parquet file per block, atomically.

Contract:
- The layout of an output root (stages/layout.py): rows only under
  ``{root}/run_date=D/*.parquet`` (``partition_dir``); run records, staged blocks and the
  ledger in the sibling ``{root}.runs/`` (``runs_root``).
- ``WriteStage`` stages each block at ``{root}.runs/_staging/{run_date}/{run_id}/part-{digest}.staged``
  with exactly schemas.output.FILE_SCHEMA (no ``run_date`` inside: it is the hive
  folder). ``digest`` hashes the block's request ids, so a task that Ray retries
  rewrites the same file instead of adding a duplicate. Readers never see staged
  files (outside the output root); the driver publishes them into ``run_date=D/`` at
  the end of the run (stages/partition.py ``commit_date``).
- Atomic on every filesystem: locally a temporary file + ``os.replace``; on
  object stores (s3fs, gcsfs, ...) the bytes are built in memory or in a local
  temporary file and sent in ONE call (``pipe``/``put``), so an object appears only
  when the upload completed. Never an open remote stream: fsspec's ``__exit__``
  calls ``close()``, which completes the upload even when the ``with`` body raised,
  leaving a truncated object (tests/stages/test_write.py shows it on a real S3 server).
- Locally the temporary file lives in ``scratch`` when the caller gives one (the publish
  into ``run_date=D/`` gives ``{root}.runs/_scratch``, stages/layout.py): a reader that
  lists the partition mid-publish then sees only finished ``*.parquet`` files. Polars
  refuses a folder that holds any other file, hidden or not. Without ``scratch``, or when
  ``scratch`` is on another filesystem than the target (a rename cannot cross it), the
  temporary file is a hidden name beside the target.
- ``WriteStage`` returns the block's figures without the text columns (what the
  driver needs for progress and the run summary), so text never travels twice.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import uuid
from collections.abc import Callable

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from schemas.output import FILE_SCHEMA, rows_to_table
from stages.layout import staging_dir
from stages.rows import batch_to_rows
from stages.storage import configure_object_stores

configure_object_stores()  # throttling, 5xx and resets retried with bounded backoff

#: The per-row payloads (texts, kept token positions) the driver's tally never reads: they
#: stay in the staged files and do not travel back to the driver with a block's figures.
TEXT_COLUMNS = ("output_text", "prompt", "reference", "source_uri", "model", "context", "kept_spans")
STAGED_SUFFIX = ".staged"


def partition_dir(root: str, run_date: str) -> str:
    """The hive folder readers see: ``{root}/run_date=YYYY-MM-DD``."""
    return f"{root.rstrip('/')}/run_date={run_date}"


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def _tmp_folder(path: str, scratch: str | None) -> str:
    """Where the temporary file of local target ``path`` goes: ``scratch`` when it is on
    the target's filesystem (``os.replace`` renames only within one), else beside it."""
    parent = path.rsplit("/", 1)[0]
    if scratch is not None:
        os.makedirs(scratch, exist_ok=True)
        if os.stat(scratch).st_dev == os.stat(parent).st_dev:
            return scratch
    return parent


def _local_atomic(path: str, scratch: str | None, fill: Callable[[str], None]) -> None:
    """``fill(tmp)`` creates the finished file at ``tmp``; then one rename publishes it.
    A failure at any point leaves ``path`` as it was and no temporary file behind."""
    os.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    tmp = f"{_tmp_folder(path, scratch)}/.{path.rsplit('/', 1)[1]}.{uuid.uuid4().hex}.tmp"
    try:
        fill(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_to(data: bytes) -> Callable[[str], None]:
    def fill(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
    return fill


def write_bytes_atomic(data: bytes, uri: str, scratch: str | None = None) -> None:
    """Make ``uri`` hold exactly ``data``, or leave it as it was (no partial object).
    ``scratch``: a local folder for the temporary file (module docstring)."""
    fs, path = fsspec.core.url_to_fs(uri)
    if is_local(fs):
        _local_atomic(path, scratch, _write_to(data))
    else:
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, data)  # one PUT (or a multipart upload completed only at the end)


def put_file_atomic(local_path: str, uri: str, scratch: str | None = None) -> None:
    """Publish a finished local file at ``uri`` (moves it when ``uri`` is local too).
    ``scratch``: a local folder for the temporary file (module docstring)."""
    fs, path = fsspec.core.url_to_fs(uri)
    if is_local(fs):
        # same filesystem: a rename; else a copy, then the rename publishes it
        _local_atomic(path, scratch, lambda tmp: shutil.move(local_path, tmp))
    else:
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(local_path, path)  # multipart uploads complete only after the last part


def write_table_atomic(table: pa.Table, uri: str, scratch: str | None = None) -> None:
    """Serialise ``table`` completely first, then publish it in one atomic step."""
    buf = io.BytesIO()
    pq.write_table(table, buf)  # raises before anything reaches the store
    write_bytes_atomic(buf.getvalue(), uri, scratch)


def block_digest(request_ids: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(request_ids)).encode()).hexdigest()[:16]


def staged_file_name(request_ids: list[str]) -> str:
    return f"part-{block_digest(request_ids)}{STAGED_SUFFIX}"


class WriteStage:
    """map_batches callable: stages each block, returns its figures."""

    def __init__(self, root: str, run_date: str, run_id: str) -> None:
        self.dir = f"{staging_dir(root, run_date)}/{run_id}"
        self.run_id = run_id

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        rows = batch_to_rows(batch)
        table = rows_to_table(rows, FILE_SCHEMA)
        if rows:
            name = staged_file_name([r["request_id"] for r in rows])
            write_table_atomic(table, f"{self.dir}/{name}")
        # Arrow keeps nulls typed (numpy would turn null ints into NaN floats).
        return table.drop_columns(list(TEXT_COLUMNS))
