"""Read documents from any fsspec URI.

Contract:
- The files to read come from stages/listing.py ``list_shards`` (once per run).
- ``iter_shard(path, input_spec, root_uri)`` yields one ``Document`` per document in
  the file, streaming: a text file is one document; JSONL (``.gz`` and ``.bz2``
  decompressed as they stream: ``open_input``; a UTF-8 byte order mark dropped:
  ``parse_line``) is read in 1 MiB blocks and split into lines; Parquet is read batch
  by batch (row groups), only the spec's columns. ``read_shard`` is
  ``list(iter_shard(...))``. Memory per reader is bounded by ``input.max_doc_bytes``
  plus one block / row group, never by the file size.
- A document that cannot be read (bad bytes, bad JSON, missing field, empty text,
  over ``input.max_doc_bytes``, an id that is empty, a boolean or one an earlier record
  of the file gave another text, a question that is not a non-empty string or is asked
  twice with two answers, answers that do not pair with the questions) still yields a
  Document with ``error`` set, naming file, line/row and field or limit, and
  ``error_kind`` ``input`` (final); its usable questions stay, one error row each. A file
  that cannot be opened or breaks off mid-read yields an error Document of kind
  ``retryable`` (storage: a rerun may succeed); one that vanished since the listing says
  so and names the file. Object-store calls retry throttling, 5xx and connection resets
  first (stages/storage.py).
- ``DOCUMENT_SCHEMA`` is the Arrow schema of documents between the read stage and
  request expansion (``document_table`` builds it).
- ``doc_tokens_error`` is the ``input.max_doc_tokens`` check the tokenize stage runs
  on each document's token count.
- A document's request rows and their ids: stages/requests.py.
"""

from __future__ import annotations

import gzip
import json
import os
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from schemas.checks import UTF16_BOMS
from schemas.output import INPUT, RETRYABLE
from schemas.spec import FORMAT_SUFFIXES, InputSpec
from stages.listing import special_kind
from stages.record_fields import id_problem, questions_and_answers
from stages.storage import configure_object_stores

configure_object_stores()  # throttling, 5xx and resets retried with bounded backoff

TEXT_SUFFIXES = FORMAT_SUFFIXES["text"]
_BLOCK = 1 << 20  # JSONL read size: one block in memory besides the current line
UTF8_BOM = b"\xef\xbb\xbf"


def not_utf8_fix(head: bytes) -> str:
    """The fix for bytes that are not UTF-8, judged by ``head`` (the first bytes of the
    file): converting from UTF-16 when it starts with a UTF-16 byte order mark, else from
    Latin-1 (the usual other encoding of a hand-made export)."""
    if head.startswith(UTF16_BOMS):
        return "the file is UTF-16 (it starts with a UTF-16 byte order mark); fix: save it as UTF-8 (iconv -f utf-16 -t utf-8)"
    return "fix: save the file as UTF-8 (from Latin-1: iconv -f latin1 -t utf-8)"
_PARQUET_BATCH_ROWS = 64


@dataclass
class Document:
    doc_id: str
    source_uri: str
    text: str | None
    questions: list[str] = field(default_factory=list)
    answers: list[str | None] = field(default_factory=list)
    error: str | None = None
    error_kind: str | None = None  # schemas.output.INPUT | RETRYABLE when error is set
    #: Its requests' own fields (REQUEST_PART_FIELDS), once stages/requests.py ``plan_requests``
    #: computed them: the read stage expands a document once and hands the result on.
    requests: list[dict[str, Any]] | None = None


#: Documents as the read stage hands them on (text can exceed 2 GiB per batch: large_string).
DOCUMENT_SCHEMA = pa.schema([
    pa.field("doc_id", pa.string()),
    pa.field("source_uri", pa.string()),
    pa.field("text", pa.large_string()),
    pa.field("questions", pa.list_(pa.string())),
    pa.field("answers", pa.list_(pa.string())),
    pa.field("error", pa.string()),
    pa.field("error_kind", pa.string()),
    pa.field("requests", pa.list_(pa.struct([
        pa.field("request_id", pa.string()),
        pa.field("prompt", pa.large_string()),
        pa.field("question", pa.large_string()),
        pa.field("reference", pa.large_string()),
    ]))),
])
#: What differs between the requests of one document (the rest is the document's own).
REQUEST_PART_FIELDS = ("request_id", "prompt", "question", "reference")


def document_table(docs: list[Document]) -> pa.Table:
    """``docs`` as one table of DOCUMENT_SCHEMA."""
    return pa.Table.from_pylist([vars(d) for d in docs], schema=DOCUMENT_SCHEMA)


def _bad(doc_id: str, path: str, error: str, kind: str = INPUT) -> Document:
    return Document(doc_id, path, None, error=error, error_kind=kind)


def read_shard(path: str, inp: InputSpec, root_uri: str) -> list[Document]:
    return list(iter_shard(path, inp, root_uri))


def iter_shard(path: str, inp: InputSpec, root_uri: str) -> Iterator[Document]:
    """The documents of one file, streamed (see the module contract)."""
    reader = {"text": _text_documents, "jsonl": _jsonl_documents, "parquet": _parquet_documents}
    where = path
    special = _special_local_file(path)
    if special:  # replaced by a FIFO or a device since it was listed: never opened
        yield _bad(path, path, f"read: {path} is {special}, not a regular file")
        return
    try:
        for doc in reader[inp.format](path, inp, root_uri):
            where = doc.source_uri if doc.doc_id == path else f"{path} after {doc.doc_id!r}"
            yield doc
    except FileNotFoundError:  # listed, then deleted or moved before it was read
        # Retryable: the next run lists the input again; without the file there, this
        # row is no longer a request and the commit drops it (pipeline/runner.py, stale).
        yield _bad(path, path, f"read: {where} vanished after the input was listed (deleted or "
                   "moved meanwhile); a rerun lists the input again", RETRYABLE)
    except Exception as e:  # storage failure: one retryable error document, the job goes on
        why = corrupt_compression(path, e)
        if why is not None:  # final: the same bytes fail alike on every rerun (the documents
            # before the break keep their rows)
            yield _bad(path, path, f"read: {where} {why}")
        else:
            yield _bad(path, path, f"read: cannot read {where}: {type(e).__name__}: {e}", RETRYABLE)


def corrupt_compression(path: str, e: BaseException) -> str | None:
    """Why ``path`` (a ``.gz``/``.bz2`` file) cannot be decompressed, when ``e`` says it is
    broken rather than unreachable (gzip, zlib and bz2 raise OSError and EOFError, the
    types storage failures raise too); None otherwise."""
    kind = fsspec.utils.infer_compression(path)
    if kind not in ("gzip", "bz2"):
        return None
    broken = isinstance(e, (gzip.BadGzipFile, zlib.error, EOFError)) or (
        kind == "bz2" and isinstance(e, OSError) and "Invalid data stream" in str(e))
    if not broken:
        return None
    return (f"is not a readable {kind} file ({type(e).__name__}: {e}); fix: export it again, or name it "
            f"without the .{'gz' if kind == 'gzip' else 'bz2'} suffix if it is not compressed")


def _special_local_file(path: str) -> str | None:
    """What ``path`` is when it is a local non-regular file (FIFO, device, socket), else None."""
    if "://" in path and not path.startswith("file://"):
        return None
    try:
        mode = os.stat(path.removeprefix("file://")).st_mode
    except OSError:
        return None  # the reader reports it (missing: a storage error)
    return None if stat.S_ISREG(mode) else special_kind(path.removeprefix("file://"))


def _over_bytes(size: int, inp: InputSpec, what: str) -> str:
    return (
        f"read: {what} is {size} bytes, over input.max_doc_bytes={inp.max_doc_bytes}; "
        "split the document or raise the limit"
    )


def _relative_id(path: str, root_uri: str) -> str:
    root = fsspec.core.url_to_fs(root_uri)[1].rstrip("/")
    bare = fsspec.core.url_to_fs(path)[1]
    return bare[len(root) + 1 :] if bare.startswith(root + "/") else bare.rsplit("/", 1)[-1]


def _text_documents(path: str, inp: InputSpec, root_uri: str) -> Iterator[Document]:
    doc_id = _relative_id(path, root_uri)
    fs, bare = fsspec.core.url_to_fs(path)
    size = fs.info(bare).get("size")
    if size is not None and size > inp.max_doc_bytes:  # refused without reading it
        yield _bad(doc_id, path, _over_bytes(size, inp, path))
        return
    with fs.open(bare, "rb") as f:
        data = _read_at_most(f, inp.max_doc_bytes + 1)  # the size may be unknown or have grown
    if len(data) > inp.max_doc_bytes:
        yield _bad(doc_id, path, _over_bytes(len(data), inp, f"{path} (at least)"))
        return
    try:
        text = data.decode("utf-8-sig")  # a byte order mark is not text
    except UnicodeDecodeError as e:
        yield _bad(doc_id, path, f"read: {path} is not valid UTF-8 (byte {e.start}: {e.reason}); "
                   f"{not_utf8_fix(data)}")
        return
    if not text.strip():
        yield _bad(doc_id, path, f"read: {path} is empty; fix: give the file its document's text, or remove it")
        return
    yield Document(doc_id, path, text)


def _read_at_most(f: BinaryIO, limit: int, block: int = _BLOCK) -> bytes:
    """Up to ``limit`` bytes of ``f``, read in blocks: ``f.read(limit)`` would allocate all
    of ``limit`` up front (a 2 GiB buffer for every small file under a raised limit)."""
    parts, n = [], 0
    while n < limit and (chunk := f.read(min(block, limit - n))):
        parts.append(chunk)
        n += len(chunk)
    return b"".join(parts)


def iter_lines(f: BinaryIO, limit: int, block: int = _BLOCK) -> Iterator[tuple[int, bytes | None, int]]:
    """``(line number, line or None if over limit bytes, line size)`` for each line of ``f``.

    Reads ``block`` bytes at a time; an over-long line is counted and skipped, never
    held: memory stays under ``limit + block`` whatever the file holds. A decompressing
    reader is read with ``read1`` (one step of its source at a time): ``read`` of a gzip
    stream that breaks off gathers a whole block before it raises, and the complete lines
    before the break were lost with it (a trial's truncated export lost its last ten records).
    """
    buf = bytearray()
    lineno, skipped = 1, -1  # skipped >= 0: bytes of an over-long line dropped so far
    read = getattr(f, "read1", f.read)
    while chunk := read(block):
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            piece = chunk[start:] if nl < 0 else chunk[start:nl]
            if skipped >= 0:
                skipped += len(piece)
            else:
                buf += piece
                if len(buf) > limit:
                    skipped = len(buf)
                    buf = bytearray()
            if nl < 0:
                break
            yield (lineno, None, skipped) if skipped >= 0 else (lineno, bytes(buf), len(buf))
            buf, skipped, lineno, start = bytearray(), -1, lineno + 1, nl + 1
    if skipped >= 0:
        yield lineno, None, skipped
    elif buf:
        yield lineno, bytes(buf), len(buf)


def parse_line(lineno: int, raw: bytes) -> tuple[Any, str | None]:
    """(the JSON value of line ``lineno``, None), or (None, why it is none, in words that
    follow "is": "not valid JSON (...)"). A byte order mark starting line 1 is dropped
    (Windows editors write one; json refuses it)."""
    if lineno == 1 and raw.startswith(UTF8_BOM):
        raw = raw[len(UTF8_BOM):]
    try:
        return json.loads(raw.decode("utf-8")), None
    except UnicodeDecodeError as e:
        return None, f"not valid UTF-8 (byte {e.start}); {not_utf8_fix(raw if lineno == 1 else b'')}"
    except json.JSONDecodeError as e:
        # json's msg for a control character ends in " at": the column completes it.
        return None, (f"not valid JSON ({e.msg.removesuffix(' at')} at column {e.colno}); fix: correct the "
                      "line (one JSON object per line, strings quoted, newlines inside them as \\n) or remove it")
    except RecursionError:  # escaped as the whole file's error, naming no line and no fix
        return None, ("JSON nested deeper than Python's reader allows (about 1,000 levels of [ or {); fix: "
                      "flatten the field that nests, or drop it")


#: Bytes an object store's file fetches per request (s3fs and gcsfs default to 50 MB):
#: `validate` opens the first input file three times to read its first records, which
#: fetched ~150 MB of a large export; sequential reads stay fast with 4 MiB requests.
OBJECT_READ_BLOCK = 4 << 20


def read_options(fs: fsspec.AbstractFileSystem) -> dict[str, Any]:
    """``fs.open`` options for reading input: ``OBJECT_READ_BLOCK`` requests from a remote store."""
    local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
    return {} if local else {"block_size": OBJECT_READ_BLOCK}


def open_input(path: str, fs: fsspec.AbstractFileSystem | None = None) -> BinaryIO:
    """``path`` opened for reading, decompressed when its suffix says so (``.gz``, ``.bz2``:
    FORMAT_SUFFIXES); from an object store in ``OBJECT_READ_BLOCK`` requests."""
    if fs is None:
        fs, path = fsspec.core.url_to_fs(path)
    return fs.open(path, "rb", compression=fsspec.utils.infer_compression(path), **read_options(fs))


#: JSON's names of the values a line may hold instead of an object (Python's type name -> JSON's).
_JSON_NAMES = {"list": "array", "str": "string", "int": "number", "float": "number", "bool": "boolean"}


def _jsonl_documents(path: str, inp: InputSpec, root_uri: str) -> Iterator[Document]:
    del root_uri  # ids come from the records
    seen: dict[str, tuple[str, int]] = {}
    with open_input(path) as f:
        for lineno, raw, size in iter_lines(f, inp.max_doc_bytes):
            where = f"{path}:{lineno}"
            if raw is None:
                yield _bad(where, path, _over_bytes(size, inp, f"line {where}"))
                continue
            if lineno == 1 and raw.startswith(UTF16_BOMS):
                # Every line of a UTF-16 file is unreadable as UTF-8 (its later ones as broken
                # JSON, the last as a stray NUL): one row for the file, as the text reader has.
                yield _bad(path, path, f"read: {path} is not valid UTF-8 (byte 0); {not_utf8_fix(raw)}")
                return
            if not raw.strip():
                continue
            rec, why = parse_line(lineno, raw)
            if why is not None:
                yield _bad(where, path, f"read: {where} is {why}")
                continue
            if not isinstance(rec, dict):
                kind = type(rec).__name__.replace("NoneType", "null").replace("dict", "object")
                yield _bad(where, path, f"read: {where} is not a JSON object (a JSON {_JSON_NAMES.get(kind, kind)}); "
                           "fix: one object per line, {\"id\": ..., \"text\": ...}, or remove the line")
                continue
            yield _first_of_id(_record_document(rec, where, path, inp), where, seen)


def _parquet_documents(path: str, inp: InputSpec, root_uri: str) -> Iterator[Document]:
    del root_uri
    fs, bare = fsspec.core.url_to_fs(path)
    with fs.open(bare, "rb", **read_options(fs)) as f:
        try:
            pf = pq.ParquetFile(f)
        except OSError:
            raise  # storage: iter_shard turns it into a retryable error
        except Exception as e:  # ArrowInvalid: not Parquet at all, the file itself is bad input
            yield _bad(path, path, f"read: {path} is not a readable Parquet file: {e}")
            return
        names = set(pf.schema_arrow.names)
        wanted = (inp.id_field, inp.text_field, inp.question_field, inp.answer_field)
        columns = [c for c in dict.fromkeys(wanted) if c and c in names]
        i = 0
        seen: dict[str, tuple[str, int]] = {}
        for batch in pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=columns):
            for rec in batch.to_pylist():
                where = f"{path}#row{i}"
                yield _first_of_id(_record_document(rec, where, path, inp), where, seen)
                i += 1


def _first_of_id(doc: Document, where: str, seen: dict[str, tuple[str, int]]) -> Document:
    """``doc``, or an error document (its id: ``where``, as a record without one) when an
    earlier record of the same file had its id with another text: two documents under one
    id would give an analyst two answers for one document and question, and a fix of either
    line would replace the other's rows. A record repeated exactly stays (its requests are
    the same requests, published once: stages/partition.py). ``seen``: id -> (where, hash
    of the text) of the file's records so far (one entry per distinct id; ids are not
    compared across files)."""
    if doc.error is not None or doc.text is None:
        return doc
    digest = hash(doc.text)
    first = seen.setdefault(doc.doc_id, (where, digest))
    if first[1] == digest:
        return doc
    bad = Document(where, doc.source_uri, None, questions=doc.questions, answers=doc.answers, error_kind=INPUT)
    bad.error = (f"read: {where}: id {doc.doc_id!r} is already the id of {first[0]}, another text; ids must "
                 "be unique: give this record its own id, or remove the line")
    return bad


def _record_document(rec: dict[str, Any], where: str, path: str, inp: InputSpec) -> Document:
    """A record's document; one whose text, id or questions are unusable keeps its usable
    questions and their answers, so each still gets its own error row (its ``prompt``, the
    row to match)."""
    raw_id = rec.get(inp.id_field)
    if isinstance(raw_id, bytes):
        raw_id = raw_id.decode("utf-8", "replace")
    bad_id = id_problem(raw_id, inp.id_field in rec)
    doc_id = where if bad_id else str(raw_id)
    questions, answers, asked_problem = questions_and_answers(rec, inp)
    doc = Document(doc_id, path, None, questions=questions, answers=answers, error_kind=INPUT)
    text = rec.get(inp.text_field)
    if isinstance(text, bytes):  # a binary column (Spark and Hive write strings so): UTF-8 text
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            doc.error = (f"read: {where}: field {inp.text_field!r} is binary and not valid UTF-8 (byte {e.start}); "
                         "fix: write the column as UTF-8 text")
            return doc
    # The fix of an unusable text is the record's, whatever made it so.
    text_fix = f"; fix: give the record its document as a non-empty string in {inp.text_field!r}, or remove it"
    if text is None:
        what = "is null" if inp.text_field in rec else "is missing"
        doc.error = f"read: {where}: field {inp.text_field!r} {what}{text_fix}"
    elif not isinstance(text, str):
        shown = json.dumps(text, default=str)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        doc.error = f"read: {where}: field {inp.text_field!r} is not a string ({shown}){text_fix}"
    elif not text.strip():
        doc.error = f"read: {where}: field {inp.text_field!r} is empty{text_fix}"
    # chars <= UTF-8 bytes <= 4 * chars: encode only when the count is in doubt
    elif len(text) > inp.max_doc_bytes or (
        4 * len(text) > inp.max_doc_bytes and len(text.encode("utf-8")) > inp.max_doc_bytes
    ):
        size = len(text.encode("utf-8", "surrogatepass"))
        doc.error = _over_bytes(size, inp, f"{where}: field {inp.text_field!r}")
    elif bad_id:
        fix = "" if "fix:" in bad_id else f"; fix: give the record a non-empty string or number id in {inp.id_field!r}"
        doc.error = f"read: {where}: field {inp.id_field!r} {bad_id}{fix}"
    elif asked_problem:
        doc.error = f"read: {where}: {asked_problem}"
    else:
        doc.text, doc.error_kind = text, None
    return doc


def doc_tokens_error(n_tokens: int, inp: InputSpec, doc_id: str) -> str | None:
    """The error message for a document of ``n_tokens`` over ``input.max_doc_tokens``, else None.

    The caller fails the row with ``kind=INPUT`` (the same document fails on every rerun).
    """
    if n_tokens <= inp.max_doc_tokens:
        return None
    return (
        f"document {doc_id!r} is {n_tokens} tokens, over input.max_doc_tokens="
        f"{inp.max_doc_tokens}; split the document or raise the limit"
    )
