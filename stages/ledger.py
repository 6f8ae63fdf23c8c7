"""The run's request ledger: which requests the input holds, recorded by the read stage.

Why: the input is listed once per run (the driver, before Ray starts) and read once
(the read stage, in Ray). When Ray aborts a run, every request without a row must
still get one (a retryable error row), and the progress line wants the run's total:
both come from this ledger, never from reading the input again.

Layout: ``{root}.runs/_ledger/{run_date}/{run_id}/shards-{first:06d}.parquet``, one file per
read batch (a block of shards; at most ~200 per run), written atomically by the read
stage after it has read every shard of the batch. A file holds the identity columns
(``LEDGER_SCHEMA``: no text) of every request of its shards, in input order, and the
indices of the shards it covers in its metadata (a shard without documents has no
row but is still covered). It lives beside the output root, not in it (no reader of the
table sees it); the runner removes the date's ledger at the start and at the end of a
run (one run of a date at a time), also one an earlier version left in
``{root}/_ledger/{run_date}/``.

Contract:
- ``write_block(root, run_date, run_id, shard_indices, requests)`` records a batch.
- ``read_ledger(root, run_date, run_id)`` returns a ``Ledger``: the shards covered (from
  the files' footers; rows are read block by block as they are iterated).
- ``Ledger.iter_requests(spec, shards, run_id, run_date)`` yields the run's requests in
  input order with ``input.limit`` applied by document, one ledger file in memory at a
  time (``requests`` is its list): the recorded rows of every covered
  shard, and for a shard the read stage never finished one placeholder request per
  prompt (its doc id is the file, like a file that failed to read: a complete rerun
  reads the file and drops the placeholder as stale, see pipeline/runner.py).
- ``Ledger.complete(n_shards)``: every shard is covered (the total is known).
- ``Ledger.run_requests(...)``: what a complete run's input yielded, for the rows it
  supersedes (stages/partition.py ``superseded``) and the date's completion mark
  (stages/completion.py); None unless every request of the run is known: every file
  covered, or ``input.limit`` reached in the files covered before the first one not (the
  read stage stops there: the files after it are never read).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from schemas.output import RETRYABLE
from schemas.spec import JobSpec
from stages.layout import runs_root
from stages.partition import RunRequests
from stages.read import Document
from stages.requests import expand_requests, generation_fingerprint
from stages.write import write_table_atomic

#: Document ids named in several files that a run's summary lists (RunRequests.shared_examples).
SHARED_EXAMPLES = 3

#: Identity of a request (what an error row needs besides the spec), and where it sits in
#: the input: ``shard`` (index in the run's listing) and ``doc`` (document index in the shard).
LEDGER_SCHEMA = pa.schema([
    pa.field("shard", pa.int64()),
    pa.field("doc", pa.int64()),
    pa.field("request_id", pa.string()),
    pa.field("doc_id", pa.string()),
    pa.field("source_uri", pa.string()),
    pa.field("prompt", pa.large_string()),
    pa.field("question", pa.large_string()),
    pa.field("reference", pa.large_string()),
])
_SHARDS_KEY = b"longdoc.shards"


def ledger_root(root: str, run_date: str) -> str:
    """Outside the output root (stages/layout.py ``runs_root``): no reader of the table sees it."""
    return f"{runs_root(root)}/_ledger/{run_date}"


def _legacy_ledger_root(root: str, run_date: str) -> str:
    """Where versions before ``runs_root`` kept it (inside the output root)."""
    return f"{root.rstrip('/')}/_ledger/{run_date}"


def ledger_dir(root: str, run_date: str, run_id: str) -> str:
    return f"{ledger_root(root, run_date)}/{run_id}"


def write_block(root: str, run_date: str, run_id: str, shard_indices: list[int],
                requests: list[dict[str, Any]]) -> None:
    """Record the requests of the shards ``shard_indices`` (rows with LEDGER_SCHEMA's keys)."""
    table = pa.Table.from_pylist(requests, schema=LEDGER_SCHEMA)
    meta = {_SHARDS_KEY: json.dumps(sorted(shard_indices)).encode()}
    table = table.replace_schema_metadata(meta)
    write_table_atomic(table, f"{ledger_dir(root, run_date, run_id)}/shards-{min(shard_indices):06d}.parquet")


def clear(root: str, run_date: str) -> None:
    """Remove every ledger of ``run_date`` (a crashed run's, or this run's once done), also
    one an earlier version left inside the output root."""
    for folder in (ledger_root(root, run_date), _legacy_ledger_root(root, run_date)):
        fs, path = fsspec.core.url_to_fs(folder)
        if fs.exists(path):
            fs.rm(path, recursive=True)


@dataclass
class Ledger:
    """What the read stage recorded for one run: which files (blocks) cover which shards.

    Rows are read one block (one ledger file) at a time while ``iter_requests`` walks the
    shards in order, so the driver never holds the run's requests whole: memory follows
    the largest block (a read batch, ~1/200 of the run), not the corpus.
    """

    fs: Any = None
    block_of: dict[int, str] = field(default_factory=dict)  # shard index -> its ledger file
    files: int = 0

    @property
    def shards(self) -> set[int]:
        return set(self.block_of)

    def complete(self, n_shards: int) -> bool:
        return len(self.block_of) >= n_shards

    def requests(self, spec: JobSpec, shards: list[str], run_id: str, run_date: str) -> list[dict[str, Any]]:
        """``iter_requests`` as a list (for small runs and tests)."""
        return list(self.iter_requests(spec, shards, run_id, run_date))

    def iter_requests(self, spec: JobSpec, shards: list[str], run_id: str,
                      run_date: str) -> Iterator[dict[str, Any]]:
        """The run's requests in input order, ``input.limit`` applied (see the module docstring).

        Rows carry the request columns an output row needs (identity, prompt, question,
        reference, task, instruction), no text. One ledger file is in memory at a time.
        """
        base = {"run_id": run_id, "run_date": run_date, "job": spec.name, "task": spec.task.kind,
                "instruction": spec.task.resolved_instruction}
        fingerprint = generation_fingerprint(spec)
        budget = spec.input.limit  # documents still inside input.limit; None: no limit (or unknown)
        block: tuple[str, dict[int, list[dict[str, Any]]]] | None = None
        for index, path in enumerate(shards):
            if budget is not None and budget <= 0:
                break
            if index not in self.block_of:
                placeholder = Document(path, path, None, error="run aborted before this file was read",
                                       error_kind=RETRYABLE)
                for req in expand_requests(placeholder, spec, run_id, run_date, fingerprint):
                    yield {k: req[k] for k in (*base, "request_id", "doc_id", "source_uri",
                                               "prompt", "question", "reference")}
                budget = None  # its document count is unknown: no later request may be left out
                continue
            name = self.block_of[index]
            if block is None or block[0] != name:
                block = (name, self._read_block(name))
            last_doc = None
            for row in block[1].get(index, []):
                if row["doc"] != last_doc:
                    if budget is not None:
                        if budget <= 0:
                            break
                        budget -= 1
                    last_doc = row["doc"]
                yield {**base, **{k: row[k] for k in ("request_id", "doc_id", "source_uri",
                                                      "prompt", "question", "reference")}}

    def run_requests(self, spec: JobSpec, shards: list[str], run_id: str, run_date: str) -> RunRequests | None:
        """What the run's input yielded (stages/partition.py ``RunRequests``: ids, (doc_id,
        prompt) keys, the files read whole: none under ``input.limit``, and the ids named in
        several files); None while a request of the run is unknown (module docstring).

        Why the limit case: the read stage stops at ``input.limit``, so a limited run over a
        folder never covers every file; it superseded nothing (a spec changed left two rows per
        document) and its date could not be marked complete."""
        if self.complete(len(shards)):
            return self._collect(spec, shards, run_id, run_date)
        if spec.input.limit is None:
            return None
        # A placeholder names its unread file as its source; a read document's source is a covered file.
        unread = {path for index, path in enumerate(shards) if index not in self.block_of}
        return self._collect(spec, shards, run_id, run_date, unread)

    def _collect(self, spec: JobSpec, shards: list[str], run_id: str, run_date: str,
                 unread: set[str] | None = None) -> RunRequests | None:
        """``iter_requests`` folded into a ``RunRequests``; None if a request comes from ``unread``."""
        run = RunRequests(files=frozenset(shards) if spec.input.limit is None else frozenset())
        # Under a limit, the files up to the last one the kept requests came from: Ray reads
        # files past the limit ahead of it (the plan's limit comes after the read stage), and
        # their documents are not this run's, so their rows must not be replaced by key.
        order = {path: i for i, path in enumerate(shards)}
        last = -1  # the input-order index of the last file a kept request came from
        file_of: dict[str, str] = {}  # doc_id -> the first file that named it
        shared: set[str] = set()
        for req in self.iter_requests(spec, shards, run_id, run_date):
            if unread and req["source_uri"] in unread:
                return None
            run.ids.add(req["request_id"])
            run.keys.add((req["doc_id"], req["prompt"]))
            last = max(last, order.get(req["source_uri"], -1))
            first = file_of.setdefault(req["doc_id"], req["source_uri"])
            if first != req["source_uri"] and req["doc_id"] not in shared:
                shared.add(req["doc_id"])
                if len(run.shared_examples) < SHARED_EXAMPLES:
                    run.shared_examples[req["doc_id"]] = [first, req["source_uri"]]
        run.shared = len(shared)
        # Every file up to that one (one that yields no document now, an emptied file, may hold
        # an old row of a document since moved), none after it.
        run.covered = frozenset(shards[:last + 1]) if spec.input.limit is not None else None
        return run

    def _read_block(self, name: str) -> dict[int, list[dict[str, Any]]]:
        """One ledger file's rows by shard, each shard's in document order."""
        with self.fs.open(name, "rb") as fh:
            t = pq.read_table(fh).replace_schema_metadata(None).cast(LEDGER_SCHEMA)
        by_shard: dict[int, list[dict[str, Any]]] = {}
        for row in t.sort_by([("shard", "ascending"), ("doc", "ascending")]).to_pylist():
            by_shard.setdefault(row["shard"], []).append(row)
        return by_shard


def read_ledger(root: str, run_date: str, run_id: str) -> Ledger:
    """Every file the read stage has written so far for ``run_id``: its footer only (the
    shards it covers); rows are read when ``Ledger.iter_requests`` reaches them."""
    fs, path = fsspec.core.url_to_fs(ledger_dir(root, run_date, run_id))
    ledger = Ledger(fs=fs)
    if not fs.exists(path):
        return ledger
    for name in sorted(fs.find(path)):
        if not name.endswith(".parquet") or name.rsplit("/", 1)[-1].startswith("."):
            continue  # a temporary file of a write in progress
        with fs.open(name, "rb") as fh:
            meta = pq.read_schema(fh).metadata or {}
        for shard in json.loads(meta[_SHARDS_KEY]):
            ledger.block_of[int(shard)] = name
        ledger.files += 1
    return ledger
