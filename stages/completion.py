"""A date's completion mark: what the last complete run's input yielded, so that a rerun of a
complete date is recognised without reading the input, starting Ray or loading a model.

Why: a request's id hashes its document's text (stages/requests.py), so the requests of an
input are known only once it is read, and the read stage runs inside the plan (Ray started,
the generate actors loading). A date run again after it completed (a nightly scheduler that
fired twice, a user rerunning after success) did all that to find every request skipped.

Contract:
- ``completion_key(spec, listing_digest)``: a hash of what decides a run's requests: the
  input listing's digest (stages/listing.py ``list_input``: each file's path, size and change
  stamps), ``spec.input`` and ``spec.task`` whole, the generation fingerprint (model,
  method, budget, instruction, sampling: stages/requests.py), the output schema, this
  mark's format and the code that reads files into requests (``reader_digest``: an upgrade
  that changes what a file yields, or a request's id, must make the next run read again and
  replace the old rows, as it did before marks). None (no mark is ever matched) when the
  listing has no digest.
- ``write_completion(root, run_date, key, run)``: written by pipeline/runner.py once a run
  that saw its whole input (its ledger complete) has published; ``run`` is its
  ``RunRequests``. One file, ``{root}.runs/_complete/{run_date}.parquet`` (stages/layout.py
  ``completion_path``), written atomically: the request ids and the (doc_id, prompt) keys,
  the key and the shared-id figures in its metadata.
- ``clear_completion(root, run_date)``: every run that goes on to run its stages removes the
  mark first, so a mark exists only while the last run of the date that changed anything was
  complete (an interrupted, aborted or crashed run leaves none).
- ``read_completion(root, run_date, key, spec, shards)``: the mark's ``RunRequests`` when its
  key is ``key`` (the files read whole are ``shards`` unless ``input.limit``, as the ledger
  says), else None (no mark, another key, or a mark that cannot be read: the run then
  runs as it always did). The caller decides: pipeline/runner.py runs nothing when every
  id has a row it would skip, no error row is to be retried, and the mark's requests
  supersede no row of the date (stages/partition.py ``superseded``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from schemas.output import SCHEMA_VERSION
from schemas.spec import JobSpec
from stages.layout import completion_path
from stages.partition import RunRequests
from stages.requests import generation_fingerprint
from stages.write import write_table_atomic

#: Bumped when what the mark holds, or what decides a run's requests, changes meaning.
COMPLETION_FORMAT = 1
_KEY = b"longdoc.completion_key"
_SHARED = b"longdoc.shared"
#: One table for both sets: an id row has doc_id/prompt null; a key row has request_id null.
COMPLETION_SCHEMA = pa.schema([
    pa.field("request_id", pa.string()),
    pa.field("doc_id", pa.string()),
    pa.field("prompt", pa.large_string()),
])


#: The modules whose code decides what an input file yields and each request's id: a hash of
#: their source is in the key. A version constant would be forgotten at the next reader fix
#: (a UTF-16 file's rows changed so, 6f6ea8f); a change elsewhere in them only costs one rerun
#: that reads its input.
READER_MODULES = ("stages.read", "stages.record_fields", "stages.requests", "stages.prompting",
                  "stages.listing", "stages.ledger", "schemas.checks")


@functools.lru_cache(maxsize=1)
def reader_digest() -> str | None:
    """sha256 of the code of ``READER_MODULES`` as installed, read through each module's
    loader (a folder, a wheel, a zip); None when one cannot be read (a frozen module): no key
    then, and every run reads its input, as before marks."""
    h = hashlib.sha256()
    try:
        for name in READER_MODULES:
            spec = importlib.util.find_spec(name)
            loader = getattr(spec, "loader", None)
            if spec is None or spec.origin is None or not hasattr(loader, "get_data"):
                return None
            h.update(name.encode() + b"\0" + loader.get_data(spec.origin) + b"\0")
    except (OSError, ImportError, ValueError):
        return None
    return h.hexdigest()


def completion_key(spec: JobSpec, listing_digest: str | None) -> str | None:
    """What decides the requests of a run of ``spec`` over a listing (module docstring)."""
    reader = reader_digest()
    if listing_digest is None or reader is None:
        return None
    what = {
        "format": COMPLETION_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "listing": listing_digest,
        "input": spec.input.model_dump(mode="json"),
        "task": spec.task.model_dump(mode="json"),
        "generation": generation_fingerprint(spec),
        "reader": reader,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def write_completion(root: str, run_date: str, key: str, run: RunRequests) -> None:
    """Mark ``run_date`` complete for ``key``: ``run``'s ids and keys (module docstring)."""
    ids = sorted(run.ids)
    keys = sorted(run.keys, key=lambda k: (k[0], k[1] is None, k[1] or ""))
    table = pa.table({
        "request_id": pa.array(ids + [None] * len(keys), pa.string()),
        "doc_id": pa.array([None] * len(ids) + [d for d, _ in keys], pa.string()),
        "prompt": pa.array([None] * len(ids) + [p for _, p in keys], pa.large_string()),
    }, schema=COMPLETION_SCHEMA)
    shared = json.dumps({"shared": run.shared, "examples": run.shared_examples,
                         "covered": sorted(run.covered) if run.covered is not None else None})
    table = table.replace_schema_metadata({_KEY: key.encode(), _SHARED: shared.encode()})
    write_table_atomic(table, completion_path(root, run_date))


def clear_completion(root: str, run_date: str) -> None:
    """Remove ``run_date``'s mark (none there: nothing to do)."""
    fs, path = fsspec.core.url_to_fs(completion_path(root, run_date))
    if fs.exists(path):
        fs.rm_file(path)


def read_completion(root: str, run_date: str, key: str | None, spec: JobSpec,
                    shards: list[str]) -> RunRequests | None:
    """The requests the mark of ``run_date`` names when it was written under ``key``, else None.

    Reads the file's footer first: a mark of another key costs no more than that.
    """
    if key is None:
        return None
    fs, path = fsspec.core.url_to_fs(completion_path(root, run_date))
    try:
        with fs.open(path, "rb") as fh:
            pf = pq.ParquetFile(fh)
            meta = pf.schema_arrow.metadata or {}
            if meta.get(_KEY) != key.encode():
                return None
            table = pf.read()
        shared = json.loads(meta.get(_SHARED, b"{}"))
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException, ValueError):  # a torn or foreign file: run as before
        return None
    rids, docs, prompts = (table.column(c).to_pylist() for c in COMPLETION_SCHEMA.names)
    covered = shared.get("covered")
    run = RunRequests(files=frozenset(shards) if spec.input.limit is None else frozenset(),
                      covered=frozenset(covered) if covered is not None else None,
                      shared=int(shared.get("shared", 0)),
                      shared_examples=dict(shared.get("examples", {})))
    for rid, doc, prompt in zip(rids, docs, prompts, strict=True):
        if rid is not None:
            run.ids.add(rid)
        else:
            run.keys.add((doc, prompt))
    return run
