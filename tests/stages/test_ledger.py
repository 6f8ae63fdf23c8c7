"""The read stage's request ledger: what a run's input holds, without reading it again."""

from __future__ import annotations

from schemas.loading import spec_from_dict
from schemas.output import RETRYABLE
from stages.ledger import clear, ledger_root, read_ledger, write_block
from stages.read import Document, expand_requests, generation_fingerprint

DATE = "2026-06-01"
SHARDS = ["/in/a.jsonl", "/in/b.jsonl", "/in/c.jsonl"]


def _spec(tmp_path, **inp):
    return spec_from_dict({"name": "l", "input": {"uri": str(tmp_path / "in"), "format": "jsonl", **inp},
                           "output": {"uri": str(tmp_path / "out")}})


def _record(spec, shard: int, n_docs: int) -> list[dict]:
    """Ledger rows of ``n_docs`` documents of shard ``shard``, as the read stage makes them."""
    out = []
    for d in range(n_docs):
        doc = Document(f"{shard}-{d}", SHARDS[shard], f"text {shard} {d}")
        for req in expand_requests(doc, spec, "r1", DATE, generation_fingerprint(spec)):
            out.append({"shard": shard, "doc": d, **{k: req[k] for k in (
                "request_id", "doc_id", "source_uri", "prompt", "question", "reference")}})
    return out


def test_requests_in_input_order_and_placeholders_for_unread_files(tmp_path):
    spec = _spec(tmp_path)
    root = str(tmp_path / "out")
    # One batch covered shards 0 and 1 (shard 1 has no document); shard 2 was never read.
    write_block(root, DATE, "r1", [0, 1], _record(spec, 0, 3))
    ledger = read_ledger(root, DATE, "r1")
    assert ledger.shards == {0, 1} and not ledger.complete(3)
    reqs = ledger.requests(spec, SHARDS, "r1", DATE)
    assert [r["doc_id"] for r in reqs] == ["0-0", "0-1", "0-2", SHARDS[2]]
    # The placeholder is the request a file that fails to read as a whole gets: a complete
    # rerun reads the file and drops it as stale.
    bad = Document(SHARDS[2], SHARDS[2], None, error="x", error_kind=RETRYABLE)
    (want,) = expand_requests(bad, spec, "r1", DATE, generation_fingerprint(spec))
    assert reqs[-1]["request_id"] == want["request_id"] and reqs[-1]["job"] == "l"
    write_block(root, DATE, "r1", [2], _record(spec, 2, 2))
    full = read_ledger(root, DATE, "r1")
    assert full.complete(3) and len(full.requests(spec, SHARDS, "r1", DATE)) == 5
    clear(root, DATE)
    assert not (tmp_path / "out" / "_ledger").exists() or not list((tmp_path / "out" / "_ledger").rglob("*"))
    assert read_ledger(root, DATE, "r1").files == 0 and ledger_root(root, DATE).endswith(f"_ledger/{DATE}")


def test_the_limit_counts_documents_in_input_order(tmp_path):
    spec = _spec(tmp_path, limit=4)
    root = str(tmp_path / "out")
    write_block(root, DATE, "r1", [1, 2], _record(spec, 1, 3) + _record(spec, 2, 3))
    write_block(root, DATE, "r1", [0], _record(spec, 0, 2))
    reqs = read_ledger(root, DATE, "r1").requests(spec, SHARDS, "r1", DATE)
    assert [r["doc_id"] for r in reqs] == ["0-0", "0-1", "1-0", "1-1"]
    # An unread file before the limit is reached: its document count is unknown, so no
    # later request may be left out (a complete rerun drops what is beyond the limit).
    root2 = str(tmp_path / "out2")
    write_block(root2, DATE, "r1", [1, 2], _record(spec, 1, 3) + _record(spec, 2, 3))
    reqs = read_ledger(root2, DATE, "r1").requests(spec, SHARDS, "r1", DATE)
    assert [r["doc_id"] for r in reqs] == [SHARDS[0]] + [f"{s}-{d}" for s in (1, 2) for d in range(3)]
