"""Object storage that fails: faults injected between the pipeline and a real S3 server.

The S3-compatible server on loopback (tests/s3_server.py) sits behind a fault-injecting
proxy (tests/s3_faults.py); the job reads its corpus from and writes its table to the
proxy's address, as a user's job talks to MinIO or S3. Each test plants faults in one
phase (listing and reading, staging, publishing) and runs the real runner in this
process (runner local, the tiny model), then checks from the objects themselves: every
request of the corpus exactly once (its request id), no error left, after at most one
rerun, and that the planted faults were met.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from s3_faults import Fault, fault_proxy
from s3_server import moto_s3

from schemas.spec import JobSpec
from stages.read import Document
from stages.requests import expand_requests, generation_fingerprint

DATE = "2026-05-01"
PUBLISHED = r"run_date(?:=|%3D)"  # the published files' folder, as it appears in a request path
FILES = 3
DOCS_PER_FILE = 4


@pytest.fixture(scope="module")
def proxy():
    with moto_s3() as s3, fault_proxy(s3.endpoint_url) as px:
        px.s3 = s3
        yield px


@pytest.fixture
def store(proxy, monkeypatch, request):
    """The proxy's address in the AWS environment, a fresh corpus bucket and output bucket."""
    import s3fs

    for k, v in proxy.s3.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    proxy.clear()
    s3fs.S3FileSystem.clear_instance_cache()
    name = request.node.name.replace("_", "-").lower()[-30:].strip("-")
    direct = proxy.s3.filesystem()  # straight to the server: setup and checks see no fault
    corpus, out = f"c-{name}", f"o-{name}"
    direct.mkdir(corpus)
    direct.mkdir(out)
    docs = []
    for f in range(FILES):
        lines = []
        for d in range(DOCS_PER_FILE):
            doc_id = f"doc-{f}-{d}"
            text = f"Report {f}.{d} covers the river harbour and its bridges. " * 6
            lines.append(json.dumps({"id": doc_id, "text": text}))
            docs.append((doc_id, f"s3://{corpus}/docs/part-{f}.jsonl", text))
        direct.pipe(f"{corpus}/docs/part-{f}.jsonl", ("\n".join(lines) + "\n").encode())
    yield {"direct": direct, "corpus": corpus, "out": out, "docs": docs}
    proxy.clear()
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def few_retries(monkeypatch):
    """Two attempts a request: a fault that never ends fails in seconds, not after the
    policy's ~1 minute of backoff (what is tested is what the next run does)."""
    import fsspec.config

    s3 = dict(fsspec.config.conf.get("s3", {}))
    s3["config_kwargs"] = dict(s3.get("config_kwargs", {}), retries={"mode": "standard", "total_max_attempts": 2})
    monkeypatch.setitem(fsspec.config.conf, "s3", s3)


def _spec(store, model_dir) -> JobSpec:
    return JobSpec.model_validate({
        "name": "faults",
        "input": {"uri": f"s3://{store['corpus']}/docs/", "format": "jsonl"},
        "generation": {"model": str(model_dir), "max_new_tokens": 2},
        "resources": {"batch_size": 4},
        "output": {"uri": f"s3://{store['out']}/{{job}}"},
    })


def _run(spec: JobSpec, run_id: str):
    import s3fs

    from pipeline.runner import run_job

    s3fs.S3FileSystem.clear_instance_cache()  # each run lists afresh, as a new process would
    return run_job(spec, run_date=DATE, run_id=run_id, progress=False, runner="local")


def _commit(root: str, run_id: str) -> None:
    """The end-of-run publish alone, one compacted file per staged block (target_bytes=1)."""
    import s3fs

    from stages.partition import commit_date

    s3fs.S3FileSystem.clear_instance_cache()
    commit_date(root, DATE, run_id, target_bytes=1)


def _expected_ids(spec: JobSpec, docs) -> set[str]:
    fp = generation_fingerprint(spec)
    return {r["request_id"] for doc_id, uri, text in docs
            for r in expand_requests(Document(doc_id, uri, text), spec, "x", DATE, fp)}


def _rows(store) -> list[dict]:
    """Every published row of DATE, read straight from the server."""
    fs = store["direct"]
    fs.invalidate_cache()  # the runs rewrote objects this client may have listed before
    part = f"{store['out']}/faults/run_date={DATE}"
    files = [f for f in fs.find(part) if f.endswith(".parquet")] if fs.exists(part) else []
    cols = ["request_id", "doc_id", "error", "error_kind"]
    rows = []
    for f in files:
        with fs.open(f, "rb") as fh:
            rows += pq.read_table(fh, columns=cols).to_pylist()
    return rows


def _staged(store) -> list[str]:
    fs = store["direct"]
    fs.invalidate_cache()
    root = f"{store['out']}/faults.runs/_staging"  # beside the output root faults/
    return [f for f in fs.find(root) if f.endswith(".staged")] if fs.exists(root) else []


def _every_request_once_no_error(spec, store, docs=None) -> None:
    rows = _rows(store)
    ids = [r["request_id"] for r in rows]
    assert sorted(ids) == sorted(_expected_ids(spec, docs or store["docs"])), "a request missing or twice"
    assert [r for r in rows if r["error"] is not None] == []
    assert _staged(store) == []


def test_s3_clients_run_under_the_retry_policy(store):
    import fsspec

    from stages.storage import S3_RETRIES

    fs, _ = fsspec.core.url_to_fs(f"s3://{store['corpus']}")
    client = fs.s3 if getattr(fs, "_s3", None) is not None else fs.connect()
    retries = client.meta.config.retries
    assert retries["mode"] == S3_RETRIES["mode"] and retries["total_max_attempts"] == S3_RETRIES["total_max_attempts"]


def test_throttled_failing_and_reset_listing_and_reads_are_retried(proxy, store, tiny_model_dir):
    spec = _spec(store, tiny_model_dir)
    c = store["corpus"]
    proxy.add(
        Fault("slowdown", "GET", rf"^/{c}/?\?.*list-type=2"),  # the listing: throttled,
        Fault("internal", "GET", rf"^/{c}/?\?.*list-type=2"),  # then a 500,
        Fault("reset", "GET", rf"^/{c}/?\?.*list-type=2"),  # then a reset connection
        Fault("slowdown", "GET|HEAD", rf"^/{c}/docs/part-0\.jsonl", times=2),
        Fault("internal", "GET|HEAD", rf"^/{c}/docs/part-1\.jsonl"),
        Fault("reset", "GET|HEAD", rf"^/{c}/docs/part-1\.jsonl"),
        Fault("reset_body", "GET", rf"^/{c}/docs/part-2\.jsonl"),  # the body breaks off midway
    )
    res = _run(spec, "read-faults")
    assert res.summary["status"] == "succeeded", res.summary
    assert sorted(proxy.fired_actions()) == sorted(
        ["slowdown", "internal", "reset", "slowdown", "slowdown", "internal", "reset", "reset_body"])
    _every_request_once_no_error(spec, store)


def test_failing_staging_and_publish_writes_are_retried(proxy, store, tiny_model_dir):
    spec = _spec(store, tiny_model_dir)
    o = store["out"]
    proxy.add(
        Fault("slowdown", "PUT", rf"^/{o}/faults\.runs/_staging/", times=2),
        Fault("internal", "PUT", rf"^/{o}/faults\.runs/_staging/"),
        Fault("reset", "PUT", rf"^/{o}/faults\.runs/_staging/"),
        Fault("reset", "PUT", rf"^/{o}/faults\.runs/_ledger/"),
        Fault("internal", "PUT", rf"^/{o}/faults/{PUBLISHED}"),
        Fault("reset", "PUT", rf"^/{o}/faults/{PUBLISHED}"),
        Fault("slowdown", "PUT", rf"^/{o}/faults\.runs/{DATE}/"),
        Fault("internal", "DELETE", rf"^/{o}/faults\.runs/_staging/"),
    )
    res = _run(spec, "write-faults")
    assert res.summary["status"] == "succeeded", res.summary
    assert len(proxy.fired) == 9, "\n".join(map(str, proxy.fired))
    _every_request_once_no_error(spec, store)


def test_a_publish_that_keeps_failing_is_completed_by_the_next_run(proxy, store, tiny_model_dir, few_retries,
                                                                   tmp_path):
    spec = _spec(store, tiny_model_dir)
    o = store["out"]
    # Every publish attempt fails, beyond the retries: the run cannot publish its rows;
    # `longdoc run` says so in one line and exits 1.
    import s3fs
    import yaml
    from typer.testing import CliRunner

    from pipeline.cli import app

    proxy.add(Fault("internal", "PUT", rf"^/{o}/faults/{PUBLISHED}", times=10**6))
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    s3fs.S3FileSystem.clear_instance_cache()
    res = CliRunner().invoke(app, ["run", str(path), "--date", DATE, "--run-id", "publish-fails", "--quiet"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output[-3000:]
    assert "error: storage:" in res.output and "run it again" in res.output
    assert _rows(store) == [] and _staged(store), "the staged rows must wait for the next run"
    proxy.clear()
    res = _run(spec, "publish-heals")
    assert res.skipped == len(store["docs"]) and res.summary["rows"] == 0  # published, not redone
    _every_request_once_no_error(spec, store)


def test_a_publish_interrupted_half_way_is_completed_without_duplicates(proxy, store, tiny_model_dir, few_retries):
    spec = _spec(store, tiny_model_dir)
    o = store["out"]
    root = f"s3://{o}/faults"
    # Blocks are staged by a run whose own publish never happens (it is the test's to do).
    proxy.add(Fault("internal", "PUT", rf"^/{o}/faults/{PUBLISHED}", times=10**6))
    with pytest.raises(OSError):
        _run(spec, "half")
    proxy.clear()
    staged = _staged(store)
    assert len(staged) == 3
    # One compacted file per staged block (target_bytes=1): the first is published, then
    # every later publish fails; a second commit finds part of the rows committed.
    proxy.add(Fault("internal", "PUT", rf"^/{o}/faults/{PUBLISHED}", times=10**6, after=1))
    with pytest.raises(OSError):
        _commit(root, "half")
    assert 0 < len(_rows(store)) < len(store["docs"])
    proxy.clear()
    # Interrupted again, now while removing the staged copies after publishing.
    proxy.add(Fault("internal", "DELETE", rf"^/{o}/faults\.runs/_staging/", times=10**6, after=1))
    with pytest.raises(OSError):
        _commit(root, "half")
    proxy.clear()
    res = _run(spec, "after-half")
    assert res.summary["status"] == "succeeded" and res.summary["rows"] == 0
    _every_request_once_no_error(spec, store)


def test_a_document_that_vanishes_after_listing_is_an_error_row_then_gone(proxy, store, tiny_model_dir):
    spec = _spec(store, tiny_model_dir)
    c = store["corpus"]
    gone = f"s3://{c}/docs/part-1.jsonl"
    proxy.add(Fault("vanish", "GET|HEAD", rf"^/{c}/docs/part-1\.jsonl"))
    _run(spec, "vanish")
    errors = [r for r in _rows(store) if r["error"] is not None]
    assert [(r["doc_id"], r["error_kind"]) for r in errors] == [(gone, "retryable")]
    assert f"{gone} vanished after the input was listed" in errors[0]["error"]
    # The rerun lists the input again: the file is not there, its error row is dropped.
    _run(spec, "after-vanish")
    _every_request_once_no_error(spec, store, docs=[d for d in store["docs"] if d[1] != gone])
