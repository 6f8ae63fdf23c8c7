"""pipeline/plan_inputs.py: the plan's read and expand functions, run by Ray task workers.

The workers import the module that defines a task's function; this one must not reach
torch or transformers (seconds of CPU per worker, beside the generate actor's model load)."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa

from pipeline.plan_inputs import ExpandRequests, ReadDocuments
from schemas.loading import spec_from_dict
from stages.requests import generation_fingerprint


def test_a_task_worker_importing_the_read_side_loads_no_model_stack() -> None:
    code = ("import sys, pipeline.plan_inputs, stages.write; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().replace("'", '"')) == []


def test_the_plan_hands_ray_the_torch_free_functions() -> None:
    import pipeline.plan as plan

    assert plan.ReadDocuments is ReadDocuments and plan.ExpandRequests is ExpandRequests
    assert ReadDocuments.__module__ == ExpandRequests.__module__ == "pipeline.plan_inputs"


def test_documents_are_read_expanded_and_finished_requests_skipped(tmp_path) -> None:
    corpus = tmp_path / "in"
    corpus.mkdir()
    (corpus / "a.txt").write_text("First document.")
    (corpus / "b.txt").write_text("Second document.")
    spec = spec_from_dict({"name": "t", "input": {"uri": str(corpus), "format": "text"},
                           "task": {"kind": "summarize"}, "output": {"uri": str(tmp_path / "out")}})
    shards = sorted(str(p) for p in corpus.iterdir())
    read = ReadDocuments(spec, str(corpus), str(tmp_path / "out"), "run1", "2026-01-01")
    tables = list(read(pa.table({"shard": shards, "index": [0, 1]})))
    docs = [row for t in tables for row in t.to_pylist()]
    assert sorted(d["text"] for d in docs) == ["First document.", "Second document."]
    assert all(d["error"] is None for d in docs)

    expand = ExpandRequests(spec, "run1", "2026-01-01", frozenset())
    requests = [r for d in docs for r in expand(d)]
    assert len(requests) == 2 and {r["run_id"] for r in requests} == {"run1"}
    assert expand.fingerprint == generation_fingerprint(spec)
    done = frozenset({requests[0]["request_id"]})
    again = [r for d in docs for r in ExpandRequests(spec, "run1", "2026-01-01", done)(d)]
    assert [r["request_id"] for r in again] == [requests[1]["request_id"]]


def test_doc_requests_counts_the_requests_this_run_sends_not_those_skipped(tmp_path) -> None:
    """A document of two questions, one answered by an earlier run: its one request sent says
    1 (schemas/rows.py: what the run sends of the document), not the 2 it has."""
    corpus = tmp_path / "in"
    corpus.mkdir()
    (corpus / "a.txt").write_text("A document with two questions asked of it.")
    spec = spec_from_dict({"name": "t", "input": {"uri": str(corpus), "format": "text"},
                           "task": {"kind": "qa", "questions": ["Who?", "Why?"]},
                           "output": {"uri": str(tmp_path / "out")}})
    read = ReadDocuments(spec, str(corpus), str(tmp_path / "out"), "run1", "2026-01-01")
    (doc,) = [row for t in read(pa.table({"shard": [str(corpus / "a.txt")], "index": [0]})) for row in t.to_pylist()]
    both = ExpandRequests(spec, "run1", "2026-01-01", frozenset())(doc)
    assert [r["doc_requests"] for r in both] == [2, 2]
    rest = ExpandRequests(spec, "run1", "2026-01-01", frozenset({both[0]["request_id"]}))(doc)
    assert [(r["request_id"], r["doc_requests"]) for r in rest] == [(both[1]["request_id"], 1)]


def test_each_request_id_is_hashed_once_between_the_read_and_the_expansion(tmp_path, monkeypatch) -> None:
    """The read stage plans a document's requests (the ledger records them); the
    expansion after input.limit copies them, whatever form Ray hands the row in."""
    import stages.requests

    corpus = tmp_path / "in"
    corpus.mkdir()
    lines = [{"id": f"d{i}", "text": f"Document {i}. " * 50, "questions": ["Q1?", "Q2?", "Q3?"],
              "answers": ["a", "b", "c"]} for i in range(4)]
    (corpus / "a.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    spec = spec_from_dict({"name": "t", "input": {"uri": str(corpus), "format": "jsonl",
                                                  "question_field": "questions", "answer_field": "answers"},
                           "task": {"kind": "qa"}, "output": {"uri": str(tmp_path / "out")}})
    hashed: list[str] = []
    real = stages.requests.request_id
    monkeypatch.setattr(stages.requests, "request_id", lambda *a: hashed.append(a[0]) or real(*a))
    read = ReadDocuments(spec, str(corpus), str(tmp_path / "out"), "run1", "2026-01-01")
    (table,) = read(pa.table({"shard": [str(corpus / "a.jsonl")], "index": [0]}))
    assert len(hashed) == 12
    expand = ExpandRequests(spec, "run1", "2026-01-01", frozenset())
    # A row as a dict of Python lists, and as numpy arrays of dicts (Ray's numpy rows).
    import numpy as np

    rows = table.to_pylist()
    as_numpy = [{k: (np.array(v, dtype=object) if isinstance(v, list) else v) for k, v in r.items()} for r in rows]
    requests = [r for d in rows for r in expand(d)]
    assert [r for d in as_numpy for r in expand(d)] == requests
    assert len(hashed) == 12, "the expansion hashed again"
    assert [r["reference"] for r in requests[:3]] == ["a", "b", "c"]
    assert requests == [r for doc in read_again(spec, corpus) for r in doc]


def read_again(spec, corpus) -> list[list[dict]]:
    """The requests as expand_requests computes them from scratch (no plan carried)."""
    from stages.read import read_shard
    from stages.requests import expand_requests

    fp = generation_fingerprint(spec)
    return [expand_requests(doc, spec, "run1", "2026-01-01", fp)
            for doc in read_shard(str(corpus / "a.jsonl"), spec.input, str(corpus))]


def _gz_export(path, n: int, tail: bytes = b"") -> None:
    """``n`` JSONL records gzipped, then ``tail`` (bytes that do not decompress)."""
    import gzip

    lines = "".join(json.dumps({"id": f"d{i}", "text": f"Record {i}. " * 8, "questions": ["Q?"]}) + "\n"
                    for i in range(n))
    path.write_bytes(gzip.compress(lines.encode()) + tail)


def _qa_spec(tmp_path, uri: str, **inp):
    return spec_from_dict({"name": "t", "input": {"uri": uri, "format": "jsonl", "question_field": "questions", **inp},
                           "task": {"kind": "qa"}, "output": {"uri": str(tmp_path / "out")}})


def test_input_limit_stops_reading_a_file_after_its_documents(tmp_path) -> None:
    """A trial asked for 1 to 20 documents of a 254 MB .jsonl.gz on S3: the whole object was
    fetched and decompressed (18.8 s, 3.5 GB). The read stops at input.limit documents of a
    file (no more of one file can be needed): here the broken tail after them is never read,
    and the ledger records the documents the run took."""
    from stages.ledger import read_ledger

    export = tmp_path / "docs.jsonl.gz"
    _gz_export(export, 50, tail=b"\x1f\x8b not the rest of a gzip stream")
    read_all = ReadDocuments(_qa_spec(tmp_path, str(export)), str(export), str(tmp_path / "out"), "r0", "2026-01-01")
    every = [row for t in read_all(pa.table({"shard": [str(export)], "index": [0]})) for row in t.to_pylist()]
    assert len(every) == 51 and "not a readable gzip file" in every[-1]["error"]  # the whole file: its broken end

    spec = _qa_spec(tmp_path, str(export), limit=3)
    read = ReadDocuments(spec, str(export), str(tmp_path / "out"), "r1", "2026-01-01")
    docs = [row for t in read(pa.table({"shard": [str(export)], "index": [0]})) for row in t.to_pylist()]
    assert [d["doc_id"] for d in docs] == ["d0", "d1", "d2"] and all(d["error"] is None for d in docs)
    ledger = read_ledger(str(tmp_path / "out"), "2026-01-01", "r1")
    assert [r["doc_id"] for r in ledger.requests(spec, [str(export)], "r1", "2026-01-01")] == ["d0", "d1", "d2"]


def test_a_large_file_is_handed_on_in_blocks_in_its_order(tmp_path, monkeypatch) -> None:
    """A 630 MB export became one table held whole (~2.3 GB of the driver, a trial): a file
    over BLOCK_TEXT_BYTES of text is recorded first, then handed on in tables of about
    that much text, in order."""
    import pipeline.plan_inputs
    from stages.ledger import read_ledger

    export = tmp_path / "docs.jsonl.gz"
    _gz_export(export, 10)  # 10 documents of 88 characters
    monkeypatch.setattr(pipeline.plan_inputs, "BLOCK_TEXT_BYTES", 200)
    spec = _qa_spec(tmp_path, str(export))
    read = ReadDocuments(spec, str(export), str(tmp_path / "out"), "r1", "2026-01-01")
    handed = read(pa.table({"shard": [str(export)], "index": [0]}))
    tables = [next(handed)]
    # Its requests are recorded before its first documents go on (an abort names them).
    assert len(read_ledger(str(tmp_path / "out"), "2026-01-01", "r1").requests(
        spec, [str(export)], "r1", "2026-01-01")) == 10
    tables += list(handed)
    assert [t.num_rows for t in tables] == [3, 3, 3, 1]
    assert [d["doc_id"] for t in tables for d in t.to_pylist()] == [f"d{i}" for i in range(10)]
    ledger = read_ledger(str(tmp_path / "out"), "2026-01-01", "r1")
    assert ledger.complete(1) and len(ledger.requests(spec, [str(export)], "r1", "2026-01-01")) == 10


def test_what_a_large_file_hands_on_is_what_its_ledger_names_even_when_its_read_breaks(tmp_path, monkeypatch):
    """A review: a file read twice (once for the ledger, once for the documents) could hand on
    other documents than the ledger names when one read broke (a storage error on one pass,
    an object replaced between them): rows lost or doubled after a settings change. The
    file is read once; its blocks wait in a local spool, removed once handed on."""
    import gzip
    import tempfile

    import pipeline.plan_inputs
    from stages.ledger import read_ledger

    lines = "".join(json.dumps({"id": f"d{i}", "text": f"Record {i}. " * 200, "questions": ["Q?"]}) + "\n"
                    for i in range(40))
    whole = gzip.compress(lines.encode(), mtime=0)
    export = tmp_path / "docs.jsonl.gz"
    export.write_bytes(whole[: len(whole) * 3 // 4])  # breaks off: a storage error mid-read reads alike
    monkeypatch.setattr(pipeline.plan_inputs, "BLOCK_TEXT_BYTES", 4000)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "spool"))
    (tmp_path / "spool").mkdir()
    spec = _qa_spec(tmp_path, str(export))
    read = ReadDocuments(spec, str(export), str(tmp_path / "out"), "r1", "2026-01-01")
    handed = [d for t in read(pa.table({"shard": [str(export)], "index": [0]})) for d in t.to_pylist()]
    assert 5 < len(handed) < 40 and "not a readable gzip file" in handed[-1]["error"]
    named = read_ledger(str(tmp_path / "out"), "2026-01-01", "r1").requests(spec, [str(export)], "r1", "2026-01-01")
    assert [r["doc_id"] for r in named] == [d["doc_id"] for d in handed]
    assert not list((tmp_path / "spool").iterdir())  # the spool is gone
