"""The plan's input side: shard rows -> documents -> requests, as Ray Data task functions.

Why a module of its own: Ray's task workers import the module that defines a task's
function. These two lived in pipeline/plan.py, whose imports reach the decode engine
(torch, transformers: ~6-9 s of CPU per worker process on a 2-core machine), so every
read and expand worker paid for a model stack it never uses, while the generate actor
was loading the model beside it. This module imports only the readers, the ledger and
the schemas (``python -c "import pipeline.plan_inputs"`` loads no torch; a test checks it).

Contract:
- ``ReadDocuments(spec, root_uri, output_root, run_id, run_date)``: map_batches fn over
  shard rows (``shard``, ``index``, pyarrow); yields each shard's documents as it reads
  them (a document that fails to read is a row with its error), at most ``input.limit``
  documents of a shard (no more of one file can be needed: the limit counts documents in
  listing order; the rest of a large file is never fetched), and records the requests it
  yielded in the run's ledger (stages/ledger.py): once the batch is read. A file with
  over ``BLOCK_TEXT_BYTES`` of text is not held whole (a 630 MB export took ~2.3 GB of the
  driver): its blocks go to a local spool file as it is read, its requests are recorded on
  their own, then the spool is handed on block by block, so memory follows the block, not
  the file, and what goes on is exactly what the ledger names.
- ``ExpandRequests(spec, run_id, run_date, skip)``: flat_map fn, one document row -> its
  request rows (stages.requests.expand_requests), minus the request ids in ``skip``. The
  rows come from the requests ReadDocuments planned: each request id is hashed once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import fields
from itertools import islice
from typing import Any

import pyarrow as pa

from schemas.spec import JobSpec
from stages.read import Document, document_table, iter_shard
from stages.requests import expand_requests, generation_fingerprint, plan_requests

#: Text (characters) of one document table the read stage hands on: a file with more is
#: spooled and handed on in several, so memory follows the block, not the file.
BLOCK_TEXT_BYTES = 64 << 20


class ReadDocuments:
    """map_batches fn: a batch of shard rows (``shard``, ``index``) -> document tables.

    Yields each shard's documents as it reads them (errors become rows too) and, once the
    batch is read, records its requests in the run's ledger (stages/ledger.py): what the
    runner needs when Ray aborts, without reading the input again.
    """

    def __init__(self, spec: JobSpec, root_uri: str, output_root: str, run_id: str, run_date: str) -> None:
        self.spec, self.root_uri = spec, root_uri
        self.output_root, self.run_id, self.run_date = output_root, run_id, run_date
        self.fingerprint = generation_fingerprint(spec)

    def __call__(self, batch: pa.Table) -> Iterator[pa.Table]:
        from stages.ledger import write_block

        indices = batch.column("index").to_pylist()
        recorded: list[dict[str, Any]] = []  # the requests' identities, no text: small
        streamed: list[int] = []  # shards too large to hold: recorded on their own
        for index, shard in zip(indices, batch.column("shard").to_pylist()):
            docs: list[Document] = []
            own: list[dict[str, Any]] = []
            text_bytes = 0
            spool: _Spool | None = None  # a file too large to hold: its blocks on local disk
            try:
                for doc_index, doc in enumerate(self._documents(shard)):
                    own += [{"shard": index, "doc": doc_index, "doc_id": doc.doc_id,
                             "source_uri": doc.source_uri, **part} for part in doc.requests or ()]
                    docs.append(doc)
                    text_bytes += len(doc.text or "")
                    if text_bytes >= BLOCK_TEXT_BYTES:
                        spool = spool or _Spool()
                        spool.write(document_table(docs))
                        docs, text_bytes = [], 0
                if spool is None:
                    recorded += own
                    if docs:
                        yield document_table(docs)
                    continue
                if docs:
                    spool.write(document_table(docs))
                # Its requests are in the ledger before any of its documents go on (what an
                # abort or an interrupt names); the documents then come from the spool, the
                # very ones recorded (a second read of the source could differ: a storage
                # error on one read only, an object replaced between them).
                write_block(self.output_root, self.run_date, self.run_id, [index], own)
                streamed.append(index)
                yield from spool.tables()
            finally:
                if spool is not None:
                    spool.close()
        rest = [i for i in indices if i not in streamed]
        if rest:
            write_block(self.output_root, self.run_date, self.run_id, rest, recorded)

    def _documents(self, shard: str) -> Iterator[Document]:
        """The shard's documents, at most ``input.limit`` (module docstring), each with its
        requests planned (hashed) here, once: the ledger records them and ExpandRequests
        copies them after input.limit (stages.requests.plan_requests)."""
        read = iter_shard(shard, self.spec.input, self.root_uri)
        try:
            for doc in islice(read, self.spec.input.limit):
                yield plan_requests(doc, self.spec, self.fingerprint)
        finally:
            read.close()  # under input.limit: the file's handle now, not when collected


class _Spool:
    """Document tables of one file on local disk (Arrow IPC in a temporary file), written
    as the file is read and read back block by block: the file's text never whole in memory,
    and its source read once. Removed by ``close``."""

    def __init__(self) -> None:
        import tempfile

        import pyarrow.ipc

        from stages.read import DOCUMENT_SCHEMA

        fd, self.path = tempfile.mkstemp(prefix="longdoc-read-", suffix=".arrow")
        self._sink = pa.OSFile(self.path, "wb")
        os.close(fd)
        self._writer: Any = pyarrow.ipc.new_file(self._sink, DOCUMENT_SCHEMA)

    def write(self, table: pa.Table) -> None:
        self._writer.write_table(table)

    def tables(self) -> Iterator[pa.Table]:
        import pyarrow.ipc

        self._writer.close()
        self._sink.close()
        with pa.memory_map(self.path) as source:
            reader = pyarrow.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield pa.Table.from_batches([reader.get_batch(i)])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.close()
        with contextlib.suppress(Exception):
            self._sink.close()
        with contextlib.suppress(OSError):
            os.remove(self.path)


class ExpandRequests:
    """flat_map fn: one document row -> request rows, minus those already written."""

    def __init__(self, spec: JobSpec, run_id: str, run_date: str, skip: frozenset[str]) -> None:
        self.spec, self.run_id, self.run_date, self.skip = spec, run_id, run_date, skip
        self.fingerprint = generation_fingerprint(spec)

    def __call__(self, doc: dict[str, Any]) -> list[dict[str, Any]]:
        # Every Document field, error_kind included (a storage failure stays retryable);
        # list columns arrive as lists or arrays depending on the block format.
        d = Document(**{f.name: doc[f.name] for f in fields(Document) if f.name in doc})
        d.questions = list(d.questions if d.questions is not None else [])
        d.answers = list(d.answers if d.answers is not None else [])
        if d.requests is not None:  # planned by ReadDocuments: copied, never hashed again
            d.requests = [dict(part) for part in d.requests]
        reqs = expand_requests(d, self.spec, self.run_id, self.run_date, self.fingerprint)
        todo = [r for r in reqs if r["request_id"] not in self.skip]
        for r in todo:  # how many requests of the document this run sends (schemas/rows.py)
            r["doc_requests"] = len(todo)
        return todo
