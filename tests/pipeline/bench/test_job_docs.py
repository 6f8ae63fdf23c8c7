"""The bench job's documents: synthetic corpora of exact token counts, the spec's requests."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.bench.job_docs import spec_requests, write_synthetic_corpus
from schemas.loading import load_spec
from stages.listing import list_shards
from stages.read import read_shard
from stages.requests import expand_requests, generation_fingerprint

ROOT = Path(__file__).resolve().parents[3]


def test_synthetic_documents_have_exactly_the_tokens_asked(tokenizer, tmp_path):
    path = write_synthetic_corpus(tokenizer, 5, 300, tmp_path / "c.jsonl", ROOT / "jobs" / "corpus")
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    assert [d["id"] for d in docs] == [f"synthetic-{i:05d}" for i in range(5)]
    for d in docs:  # counted the way the tokenize stage counts them
        assert len(tokenizer(d["text"], add_special_tokens=False)["input_ids"]) == 300
    assert len({d["text"] for d in docs}) == 5


def test_more_synthetic_tokens_than_the_source_still_differ(tokenizer, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("The quick brown fox jumps over the lazy dog. " * 20)
    path = write_synthetic_corpus(tokenizer, 3, 500, tmp_path / "c.jsonl", src)
    docs = [json.loads(line)["text"] for line in path.read_text().splitlines()]
    assert all(len(tokenizer(t, add_special_tokens=False)["input_ids"]) == 500 for t in docs)


def test_spec_requests_are_the_requests_longdoc_makes(monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = load_spec(ROOT / "jobs" / "sample-summarize.yaml", ["input.limit=2"])
    records, bad = spec_requests(spec, "2026-01-31")
    assert bad == 0 and len(records) == 2
    fp = generation_fingerprint(spec)
    shard = list_shards(spec.input, "2026-01-31")[0]
    [doc] = read_shard(shard, spec.input, spec.input.uri)[:1]
    [want] = expand_requests(doc, spec, "any-run", "2026-01-31", fp)
    assert records[0]["request_id"] == want["request_id"] and records[0]["text"] == doc.text
    assert records[0]["instruction"] == spec.task.resolved_instruction and records[0]["question"] is None
