"""The pipeline against a real S3-compatible server on loopback (moto server mode).

`longdoc run` reads the corpus from one bucket and writes Parquet to another, exactly
as a user would run it against MinIO: AWS_ENDPOINT_URL + AWS credential variables in
the environment, s3:// URIs in the spec. The output is read back through s3fs +
pyarrow, DuckDB and `longdoc report`, and the secret key must appear nowhere: not
in the command's output, the run summary, or any object written to the store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
import yaml
from s3_server import moto_s3

DATE = "2026-03-01"
DOCS = {
    "rivers.txt": "The Rhine flows from the Alps to the North Sea and passes Basel. " * 8,
    "lakes.md": "# Lakes\nLake Geneva is shared by Switzerland and France. " * 8,
    "notes/bridges.txt": "Old stone bridges cross the river in the town centre. " * 8,
}
LONGDOC = str(Path(sys.executable).parent / "longdoc")


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as server:
        yield server


def _run_env(s3) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RAY_ADDRESS"))}
    env.update(s3.env())
    return env


def test_run_reads_and_writes_s3(s3, tmp_path, tiny_model_dir):
    fs = s3.filesystem()
    fs.mkdir("s3job-corpus")  # buckets of its own: moto keeps other tests' buckets in this process
    fs.mkdir("s3job-results")
    for name, text in DOCS.items():
        fs.pipe(f"s3job-corpus/docs/{DATE}/{name}", text.encode())
    fs.pipe("s3job-corpus/docs/2026-02-28/other-day.txt", b"Not part of this run. " * 10)

    spec = tmp_path / "s3job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "s3job",
        "input": {"uri": "s3://s3job-corpus/docs/{run_date}/", "format": "text"},
        "generation": {"model": str(tiny_model_dir), "max_new_tokens": 4},
        "resources": {"batch_size": 3},
        "output": {"uri": "s3://s3job-results/longdoc/{job}"},
    }))
    r = subprocess.run([LONGDOC, "run", str(spec), "--date", DATE, "--run-id", "s3run", "--quiet"],
                       env=_run_env(s3), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert s3.secret not in r.stdout + r.stderr

    # Parquet written back to the bucket, one row per document of that date only.
    part = f"s3job-results/longdoc/s3job/run_date={DATE}"
    files = [f for f in fs.find(part) if f.endswith(".parquet")]
    assert files and all(f.rsplit("/", 1)[1].startswith("part-s3run-") for f in files)
    table = pq.read_table(part, filesystem=fs)
    assert table.num_rows == 3 and table.column("error").null_count == 3
    assert sorted(table.column("doc_id").to_pylist()) == sorted(DOCS)
    assert len(set(table.column("request_id").to_pylist())) == 3
    assert all(u.startswith("s3://s3job-corpus/docs/2026-03-01/") for u in table.column("source_uri").to_pylist())
    # The run record lives beside the output root (s3job.runs/), not in it.
    summary = json.loads(fs.cat(f"s3job-results/longdoc/s3job.runs/{DATE}/s3run.json"))
    assert summary["summary"]["rows"] == 3 and summary["summary"]["status"] == "succeeded"
    assert summary["summary"]["versions"]["longdoc"] and summary["summary"]["started_at"]
    # Blocks were staged, then published as one compacted object; nothing staged is left,
    # and the partition column lives in the key (run_date=...) only.
    assert len(files) == 1 and not [f for f in fs.find("s3job-results") if "/_staging/" in f]
    assert fs.find("s3job-results/longdoc/s3job") == files  # the root: only the rows
    assert "run_date" not in pq.read_schema(files[0], filesystem=fs).names

    # Resume on S3: a rerun of the date would skip exactly these requests.
    import s3fs

    from stages.partition import scan_date

    # fsspec caches filesystems by their arguments: one made from another test's environment
    # (another loopback server) would answer here.
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in s3.env().items():
            mp.setenv(k, v)
        done = scan_date("s3://s3job-results/longdoc/s3job", DATE).skip("none")
    assert done == frozenset(table.column("request_id").to_pylist())

    # No object in the output bucket carries the secret (rows, summary, spec copy).
    for f in fs.find("s3job-results"):
        assert s3.secret.encode() not in fs.cat(f), f

    # DuckDB over the same objects (fsspec filesystem registered with DuckDB).
    con = duckdb.connect()
    con.register_filesystem(fs)
    n, ids, date = con.execute(  # no options: DuckDB turns the run_date=... folders into a DATE
        "select count(*), count(distinct request_id), cast(min(run_date) as varchar) from "
        "read_parquet('s3://s3job-results/longdoc/s3job/**/*.parquet')"
    ).fetchone()
    assert (n, ids, date) == (3, 3, DATE)

    # `longdoc report` reads the table back from S3 and plots it.
    png = tmp_path / "report.png"
    r = subprocess.run([LONGDOC, "report", "s3://s3job-results/longdoc/s3job", "--json", "--plot", str(png)],
                       env=_run_env(s3), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = json.loads(r.stdout[: r.stdout.rindex("]") + 1])
    assert run["run_id"] == "s3run" and run["rows"] == 3
    assert png.read_bytes()[:4] == b"\x89PNG"
