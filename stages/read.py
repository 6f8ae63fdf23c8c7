"""Read documents from any fsspec URI and expand them into request rows.

Contract:
- ``list_shards(input_spec, run_date)`` (driver side, cheap) returns the files to
  read, sorted, or raises ValueError naming the URI when nothing is there.
- ``read_shard(path, input_spec)`` returns one ``Document`` per document in the file.
  A document that cannot be read (bad bytes, bad JSON, missing field, empty text)
  still yields a Document with ``error`` set, naming file, line/row and field.
- ``expand_requests(doc, spec, run_id, run_date)`` returns one request row per
  document x prompt (see stages/rows.py for the columns); ``request_id`` is stable
  across runs for the same document, prompt and settings, so reruns can skip work.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pyarrow.parquet as pq

from schemas.spec import InputSpec, JobSpec

TEXT_SUFFIXES = (".txt", ".md")
_FORMAT_SUFFIXES = {"text": TEXT_SUFFIXES, "jsonl": (".jsonl", ".json"), "parquet": (".parquet",)}


@dataclass
class Document:
    doc_id: str
    source_uri: str
    text: str | None
    questions: list[str] = field(default_factory=list)
    answers: list[str | None] = field(default_factory=list)
    error: str | None = None


def resolve_uri(uri: str, run_date: str, job: str = "") -> str:
    return uri.replace("{run_date}", run_date).replace("{job}", job)


def list_shards(inp: InputSpec, run_date: str) -> list[str]:
    """Files to read, as full URIs (protocol kept), sorted for a stable order."""
    uri = resolve_uri(inp.uri, run_date)
    fs, root = fsspec.core.url_to_fs(uri)
    if not fs.exists(root):
        raise ValueError(f"input.uri {uri!r} does not exist")
    if fs.isfile(root):
        paths = [root]
    else:
        suffixes = _FORMAT_SUFFIXES[inp.format]
        paths = sorted(p for p in fs.find(root) if p.lower().endswith(suffixes))
        if not paths:
            raise ValueError(
                f"input.uri {uri!r} has no {inp.format} files (looked for {', '.join(suffixes)})"
            )
    return [_unstrip(fs, p) for p in paths]


def _unstrip(fs: fsspec.AbstractFileSystem, path: str) -> str:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return path if protocol in ("file", "local") else f"{protocol}://{path}"


def read_shard(path: str, inp: InputSpec, root_uri: str) -> list[Document]:
    try:
        with fsspec.open(path, "rb") as f:
            data = f.read()
    except Exception as e:  # unreadable file: one error document, the job goes on
        return [Document(doc_id=path, source_uri=path, text=None, error=f"read: cannot read {path}: {e}")]
    if inp.format == "text":
        return [_text_document(path, data, root_uri)]
    if inp.format == "jsonl":
        return _jsonl_documents(path, data, inp)
    return _parquet_documents(path, data, inp)


def _relative_id(path: str, root_uri: str) -> str:
    root = fsspec.core.url_to_fs(root_uri)[1].rstrip("/")
    bare = fsspec.core.url_to_fs(path)[1]
    return bare[len(root) + 1 :] if bare.startswith(root + "/") else bare.rsplit("/", 1)[-1]


def _text_document(path: str, data: bytes, root_uri: str) -> Document:
    doc_id = _relative_id(path, root_uri)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return Document(doc_id, path, None, error=f"read: {path} is not valid UTF-8 (byte {e.start}: {e.reason})")
    if not text.strip():
        return Document(doc_id, path, None, error=f"read: {path} is empty")
    return Document(doc_id, path, text)


def _jsonl_documents(path: str, data: bytes, inp: InputSpec) -> list[Document]:
    docs: list[Document] = []
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            docs.append(Document(where, path, None, error=f"read: {where} is not valid UTF-8 (byte {e.start})"))
            continue
        except json.JSONDecodeError as e:
            docs.append(Document(where, path, None, error=f"read: {where} is not valid JSON ({e.msg})"))
            continue
        if not isinstance(rec, dict):
            docs.append(Document(where, path, None, error=f"read: {where} is not a JSON object"))
            continue
        docs.append(_record_document(rec, where, path, inp))
    return docs


def _parquet_documents(path: str, data: bytes, inp: InputSpec) -> list[Document]:
    import io

    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as e:
        return [Document(path, path, None, error=f"read: {path} is not a readable Parquet file: {e}")]
    return [
        _record_document(rec, f"{path}#row{i}", path, inp) for i, rec in enumerate(table.to_pylist())
    ]


def _record_document(rec: dict[str, Any], where: str, path: str, inp: InputSpec) -> Document:
    raw_id = rec.get(inp.id_field)
    doc_id = str(raw_id) if raw_id is not None else where
    text = rec.get(inp.text_field)
    if text is None:
        return Document(doc_id, path, None, error=f"read: {where}: missing field {inp.text_field!r}")
    if not isinstance(text, str):
        return Document(doc_id, path, None, error=f"read: {where}: field {inp.text_field!r} is not a string")
    if not text.strip():
        return Document(doc_id, path, None, error=f"read: {where}: field {inp.text_field!r} is empty")
    if raw_id is None:
        return Document(doc_id, path, None, error=f"read: {where}: missing field {inp.id_field!r}")
    questions = _as_list(rec.get(inp.question_field)) if inp.question_field else []
    answers = _as_list(rec.get(inp.answer_field)) if inp.answer_field else []
    return Document(doc_id, path, text, questions=[str(q) for q in questions], answers=answers)


def _as_list(v: Any) -> list:
    if v is None:
        return []
    return list(v) if isinstance(v, (list, tuple)) else [v]


def generation_fingerprint(spec: JobSpec) -> str:
    """Settings that change an output; part of every request_id."""
    settings = {
        "model": spec.generation.model,
        "max_new_tokens": spec.generation.max_new_tokens,
        "temperature": spec.generation.temperature,
        "top_p": spec.generation.top_p,
        "seed": spec.generation.seed,
        "stop": list(spec.generation.stop),
        "compression": spec.compression.model_dump(mode="json"),
        "instruction": spec.task.resolved_instruction,
    }
    return json.dumps(settings, sort_keys=True)


def request_id(doc_id: str, text: str | None, prompt: str, fingerprint: str) -> str:
    h = hashlib.sha256()
    for part in (doc_id, text or "", prompt, fingerprint):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()[:24]


def expand_requests(doc: Document, spec: JobSpec, run_id: str, run_date: str, fingerprint: str) -> list[dict[str, Any]]:
    instruction = spec.task.resolved_instruction
    base = {
        "run_id": run_id,
        "run_date": run_date,
        "job": spec.name,
        "doc_id": doc.doc_id,
        "source_uri": doc.source_uri,
        "task": spec.task.kind,
        "instruction": instruction,
        "text": doc.text,
        "error": doc.error,
    }
    if spec.task.kind == "summarize":
        pairs: list[tuple[str | None, str | None]] = [(None, None)]
    else:
        pairs = list(zip(doc.questions, doc.answers + [None] * len(doc.questions)))
        pairs += [(q, None) for q in spec.task.questions]
        if not pairs:
            pairs = [(None, None)]
            if base["error"] is None:
                base["error"] = f"read: {doc.source_uri}: document {doc.doc_id!r} has no question"
    rows = []
    for question, answer in pairs:
        prompt = question if question is not None else instruction
        rows.append(
            {
                **base,
                "request_id": request_id(doc.doc_id, doc.text, prompt, fingerprint),
                "prompt": prompt,
                "question": question,
                "reference": None if answer is None else str(answer),
            }
        )
    return rows
