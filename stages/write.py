"""Write stage: output rows -> one Parquet file per block, atomically.

Contract:
- Files land at ``{root}/run_date=YYYY-MM-DD/part-{run_id}-{digest}.parquet`` with
  exactly schemas.output.OUTPUT_SCHEMA. ``digest`` hashes the block's request ids,
  so a task that Ray retries rewrites the same file instead of adding a duplicate.
- Atomic: on a local filesystem the file is written under a hidden temporary name
  and renamed; on object stores a single PUT/multipart upload only becomes visible
  when complete. Readers never see half a file.
- ``write_block`` returns the block's figures without the text columns (what the
  driver needs for progress and the run summary), so text never travels twice.
"""

from __future__ import annotations

import hashlib
import os
import uuid

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from schemas.output import rows_to_table
from stages.rows import batch_to_rows

TEXT_COLUMNS = ("output_text", "prompt", "reference", "source_uri", "model")


def partition_dir(root: str, run_date: str) -> str:
    return f"{root.rstrip('/')}/run_date={run_date}"


def write_table_atomic(table: pa.Table, uri: str) -> None:
    fs, path = fsspec.core.url_to_fs(uri)
    parent = path.rsplit("/", 1)[0]
    fs.makedirs(parent, exist_ok=True)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        tmp = f"{parent}/.{path.rsplit('/', 1)[1]}.{uuid.uuid4().hex}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    else:
        with fs.open(path, "wb") as f:
            pq.write_table(table, f)


def block_file_name(run_id: str, request_ids: list[str]) -> str:
    digest = hashlib.sha256("\n".join(sorted(request_ids)).encode()).hexdigest()[:16]
    return f"part-{run_id}-{digest}.parquet"


class WriteStage:
    """map_batches callable: writes each block, returns its figures."""

    def __init__(self, root: str, run_date: str, run_id: str) -> None:
        self.dir = partition_dir(root, run_date)
        self.run_id = run_id

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        rows = batch_to_rows(batch)
        if not rows:
            return rows_to_table([]).drop_columns(list(TEXT_COLUMNS))
        table = rows_to_table(rows)
        name = block_file_name(self.run_id, [r["request_id"] for r in rows])
        write_table_atomic(table, f"{self.dir}/{name}")
        # Arrow keeps nulls typed (numpy would turn null ints into NaN floats).
        return table.drop_columns(list(TEXT_COLUMNS))
